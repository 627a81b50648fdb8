"""What the framework integrations share: an LLM call as a framework's callbacks see it, and
spans for the framework's agent and tool steps.

An integration opens a :class:`FrameworkCall` when the framework starts an LLM call (messages
already in OpenAI form) and finishes it with the response. The call joins the trajectory that
was current when it started, trainable if a ``@trainable`` scope accepts its model. When the
same call also went through the OpenAI shim, the trajectory keeps it once
(the layer merge).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from ..capture import _context
from ..capture._calls import OpenCall
from ..capture._records import ChoiceRecord, LLMCall, jsonable, token_ids_from_tokens
from ..capture._warnings import warn_untrainable

_tracer = trace.get_tracer("arttrace")


class FrameworkCall(OpenCall):
    """One LLM call seen by a framework (``framework``: its name, e.g. ``"langchain"``).

    ``step`` is the framework's name for who made the call (graph node, agent); ``parent`` the
    span to nest under (default: the current one); ``fix`` what to tell the user when a policy
    turn arrives without the exact tokens ART needs.
    """

    __slots__ = ("fix",)

    def __init__(
        self,
        framework: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        params: Mapping[str, Any] | None = None,
        step: str | None = None,
        parent: Span | None = None,
        fix: str | None = None,
    ) -> None:
        trajectory = _context.current_trajectory_var.get()
        scope = _context.policy_scope(model) if trajectory is not None else None
        call = LLMCall(
            model=model,
            messages=[dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            params={k: jsonable(v) for k, v in (params or {}).items() if v is not None},
            trainable=scope is not None,
            agent=scope.name if scope else None,
            source=framework,
            framework=framework,
            step=step,
        )
        self.fix = fix
        super().__init__(call, trajectory, export_tokens=False, parent=parent)

    def finish(
        self,
        choices: Sequence[ChoiceRecord],
        *,
        usage: Mapping[str, Any] | None = None,
        response_id: str | None = None,
        response_model: str | None = None,
        streamed: bool = False,
    ) -> None:
        """The framework's response arrived (ignored once the call was abandoned)."""
        if self._done:
            return
        call = self.call
        call.choices = list(choices)
        call.usage = dict(usage) if usage else None
        call.response_id, call.response_model = response_id, response_model
        call.streamed = streamed
        self._finish()

    def discard(self) -> None:
        """The model was never called (a framework callback answered in its place): the
        trajectory keeps no record of this call, and its span ends marked as discarded."""
        with self._lock:
            if self._done:
                return
            self._done = True
        self.span.set_attribute("arttrace.discarded", True)
        self.span.end()
        if self.trajectory is not None:
            self.trajectory.call_log.close(self, keep=False)

    def _warn_untrainable(self) -> None:
        if self._seen_by_shim():
            return  # the shim's record of this call is the one trained on; it warns itself
        for choice in self.call.choices:
            reason = self.call.untrainable_reason(choice)
            if reason is not None:
                warn_untrainable(self.call.model, reason, self.fix)
                return

    def _seen_by_shim(self) -> bool:
        if self.trajectory is None:
            return False
        return self.trajectory.call_log.shim_saw(self.call)


def choice_record(
    message: Mapping[str, Any],
    *,
    finish_reason: str | None = None,
    logprobs: Sequence[Mapping[str, Any]] | None = None,
    index: int = 0,
) -> ChoiceRecord:
    """A sampled choice from an OpenAI-form assistant ``message`` and, where the framework
    kept them, its OpenAI-form logprobs (``[{"token", "logprob", "top_logprobs"}, ...]``)."""
    record = ChoiceRecord(index=index, message=dict(message), finish_reason=finish_reason)
    if logprobs is not None:
        record.logprobs = array("d", [float(t["logprob"]) for t in logprobs])
        tokens = [str(t["token"]) for t in logprobs]
        record.token_ids = token_ids_from_tokens(tokens) if tokens else None
        if record.token_ids is None:
            record.tokens = tokens
        top = [list(t.get("top_logprobs") or ()) for t in logprobs]
        if any(top):
            record.top_logprobs = [
                [{"token": a["token"], "logprob": a["logprob"]} for a in alts] for alts in top
            ]
    return record


def step_span(
    operation: str,
    name: str,
    framework: str,
    *,
    parent: Span | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Span:
    """Start the span of a framework step: ``operation`` is ``"invoke_agent"`` or
    ``"execute_tool"`` (the GenAI conventions' names); the caller ends it."""
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation, "arttrace.framework": framework}
    attrs["gen_ai.tool.name" if operation == "execute_tool" else "gen_ai.agent.name"] = name
    attrs.update({k: v for k, v in (attributes or {}).items() if v is not None})
    trajectory = _context.current_trajectory_var.get()
    if trajectory is not None:
        attrs["arttrace.example_id"] = trajectory.example_id
    return _tracer.start_span(
        f"{operation} {name}",
        context=None if parent is None else trace.set_span_in_context(parent),
        attributes=attrs,
    )
