"""What the framework integrations share: an LLM call as a framework's callbacks see it, the
spans of the framework's agent and tool steps, the guard every callback runs under, and the
fix an untrainable framework-only turn is told.

An integration opens a :class:`FrameworkCall` when the framework starts an LLM call (messages
already in OpenAI form) and finishes it with the response. The call joins the trajectory that
was current when it started, trainable if a ``@trainable`` scope accepts its model. When the
same call also went through the OpenAI shim, the trajectory keeps it once
(the layer merge). Each framework module keeps only what is its framework's own: which
callbacks to hook, and how its objects read in OpenAI form (:mod:`._openai_form`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from ..capture import _context
from ..capture._calls import OpenCall
from ..capture._guard import guarded
from ..capture._records import ChoiceRecord, LLMCall, jsonable, token_ids_from_tokens
from ..capture._redact import exception_attributes, redact

_tracer = trace.get_tracer("arttrace")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class FrameworkCall(OpenCall):
    """One LLM call seen by a framework (``framework``: its name, e.g. ``"langchain"``).

    ``step`` is the framework's name for who made the call (graph node, agent); ``parent`` the
    span to nest under (default: the current one); ``fix`` what to tell the user when a policy
    turn arrives without the exact tokens ART needs (:meth:`Fix.text`). Request parameters that
    carry headers or keys are never recorded (the call's lifecycle drops them).
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
            policy=scope.policy if scope else None,
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

    def raised(self, error: BaseException) -> None:
        """The call ended with ``error``: an ``Exception`` fails it; anything else (the caller
        closed the stream, a cancellation) abandons it, marked partial."""
        if isinstance(error, Exception):
            self.fail(error)
        elif isinstance(error, GeneratorExit):
            self.abandon("the caller stopped reading the stream")
        else:
            self.abandon(f"the call was interrupted ({type(error).__name__})")

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
                self._warn(reason, self.fix)
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
    token_ids: Sequence[int] | None = None,
    index: int = 0,
) -> ChoiceRecord:
    """A sampled choice from an OpenAI-form assistant ``message`` and, where the framework
    kept them, its OpenAI-form logprobs (``[{"token", "logprob", "top_logprobs"}, ...]``) and
    the sampled ``token_ids`` (vLLM's; without them, ids are read from ``token_id:<n>`` tokens)."""
    record = ChoiceRecord(index=index, message=dict(message), finish_reason=finish_reason)
    if logprobs is not None:
        record.logprobs = array("d", [float(t["logprob"]) for t in logprobs])
        tokens = [str(t["token"]) for t in logprobs]
        record.token_ids = token_ids_from_tokens(tokens) if tokens else None
        if record.token_ids is None:
            record.tokens = tokens
        if token_ids is not None:
            record.token_ids = array("q", token_ids)
        top = [list(t.get("top_logprobs") or ()) for t in logprobs]
        if any(top):
            record.top_logprobs = [
                [{"token": a["token"], "logprob": a["logprob"]} for a in alts] for alts in top
            ]
    return record


# -- steps: agent runs and tool calls as spans ----------------------------------------------


def step_span(
    operation: str,
    name: str,
    framework: str,
    *,
    parent: Span | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Span:
    """Start the span of a framework step: ``operation`` is ``"invoke_agent"`` or
    ``"execute_tool"`` (the GenAI conventions' names); :func:`end_span` ends it."""
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


def end_span(span: Span, error: BaseException | str | None = None) -> None:
    """End a step's span; with ``error`` (what the step raised, or the text of a failure the
    framework reported as a result) it ends failed, secrets redacted as on a call's span."""
    with guarded("marking a framework step's span failed"):
        if isinstance(error, BaseException):
            span.record_exception(error, attributes=exception_attributes(error))
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, redact(str(error))))
        elif error is not None:
            span.set_status(Status(StatusCode.ERROR, redact(error)))
    span.end()


# -- never break the app --------------------------------------------------------------------


def guard(framework: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R | None]]:
    """A framework callback that can never break the app: its body runs under
    :func:`~arttrace.capture._guard.guarded` (a failure is logged once and swallowed), and it
    then returns ``None``, which every framework reads as "nothing changed"."""

    def decorate(callback: Callable[_P, _R]) -> Callable[_P, _R | None]:
        where = f"{framework}'s {callback.__name__}"

        @wraps(callback)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
            with guarded(where):
                return callback(*args, **kwargs)
            return None

        return run

    return decorate


def guard_async(
    framework: str,
) -> Callable[
    [Callable[_P, Coroutine[Any, Any, _R]]], Callable[_P, Coroutine[Any, Any, _R | None]]
]:
    """:func:`guard` for a coroutine callback (ADK's plugin callbacks)."""

    def decorate(
        callback: Callable[_P, Coroutine[Any, Any, _R]],
    ) -> Callable[_P, Coroutine[Any, Any, _R | None]]:
        where = f"{framework}'s {callback.__name__}"

        @wraps(callback)
        async def run(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
            with guarded(where):
                return await callback(*args, **kwargs)
            return None

        return run

    return decorate


# -- what an untrainable framework-only turn is told -----------------------------------------


@dataclass(frozen=True, slots=True)
class Fix:
    """The fix an :class:`~arttrace.UntrainableTurnWarning` names when a policy turn was seen
    by a framework's hooks only (they never have the exact token ids ART trains on).

    ``framework`` as users name it; ``route`` the model set-up whose calls go through the OpenAI
    SDK's Chat Completions API to vLLM; ``wrap`` how to give that model a client wrapped with
    ``arttrace.wrap_openai`` instead of the global patch (empty when it cannot have one).
    """

    framework: str
    route: str
    wrap: str = ""

    @property
    def without_instrument(self) -> str:
        """The fix when ``arttrace.instrument()`` is off: turn the shim on."""
        return (
            f"{self.framework}'s own record of a call has no token ids, and ART trains on exact "
            f"tokens: call arttrace.instrument() before the agent runs{self.wrap}, and serve the "
            f"policy with vLLM through {self.route}, so the OpenAI SDK shim records the exact "
            "tokens of each call."
        )

    def text(self, why: str) -> str:
        """The fix for a call starting now; ``why`` says why the shim, when it is on, did not
        see the call (the model's client is not the OpenAI SDK's Chat Completions API)."""
        if _context.shim_settings() is None:
            return self.without_instrument
        return (
            f"arttrace saw the call in {self.framework} but not its request through the OpenAI "
            f"SDK's Chat Completions API, so the token ids are missing: {why}. Serve the policy "
            f"with vLLM and call it through {self.route}."
        )
