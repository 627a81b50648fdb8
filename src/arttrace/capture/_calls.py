"""The lifecycle of one captured LLM call, whatever layer saw it.

An :class:`OpenCall` is opened when a call starts: it holds the call's record and its
OpenTelemetry span, and registers with the run's :class:`CallLog`. It ends once (finished,
failed, abandoned or discarded); the log then keeps the record. The layers that see calls (the
OpenAI shim, the framework hooks) subclass it; the trajectory only reads the log.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._records import LLMCall
from ._warnings import warn_untrainable

if TYPE_CHECKING:
    from ._trajectory import Trajectory

_tracer = trace.get_tracer("arttrace")


@dataclass(frozen=True, slots=True)
class Settings:
    """How the shim treats calls.

    ``request_training_data``: on ``@trainable`` calls, ask for ``logprobs=True`` and vLLM's
    ``return_token_ids`` when the caller did not set them (sampling parameters are never touched).
    ``export_tokens``: also put token ids and logprobs on exported span attributes (large).
    """

    request_training_data: bool = True
    export_tokens: bool = False


class OpenCall:
    """A call in flight: its record, its span, and the trajectory that will keep it."""

    __slots__ = ("_done", "_lock", "call", "export_tokens", "span", "trajectory")

    def __init__(
        self,
        call: LLMCall,
        trajectory: Trajectory | None,
        export_tokens: bool,
        server: Any = None,
        parent: trace.Span | None = None,
    ) -> None:
        self.call, self.trajectory, self.export_tokens = call, trajectory, export_tokens
        self.span = _tracer.start_span(
            f"chat {call.model}",
            context=None if parent is None else trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes=_request_attributes(call, trajectory, server),
        )
        self._done = False
        self._lock = threading.Lock()
        if trajectory is not None:
            trajectory.call_log.open(self)

    def fail(self, error: BaseException) -> None:
        """The call raised."""
        self.call.error = f"{type(error).__name__}: {error}"
        self.span.record_exception(error)
        self.span.set_attribute("error.type", type(error).__qualname__)
        self.span.set_status(Status(StatusCode.ERROR, str(error)))
        self._finish()

    def abandon(self, why: str) -> None:
        """The call will not finish (the caller stopped reading, the trajectory ended)."""
        if self._done:
            return
        self.call.partial = True
        self.call.error = why
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        call = self.call
        call.ended_at = time.time()
        if self.span.is_recording():
            self.span.set_attributes(_response_attributes(call, self.export_tokens))
        self.span.end()
        if call.trainable and not call.error:
            self._warn_untrainable()
        if self.trajectory is not None:
            self.trajectory.call_log.close(self)

    def _warn_untrainable(self) -> None:
        for choice in self.call.choices:
            reason = self.call.untrainable_reason(choice)
            if reason is not None:
                warn_untrainable(self.call.model, reason)
                return


class CallLog:
    """The calls of one run: those in flight, and the records of those that ended."""

    __slots__ = ("_lock", "_open", "records")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[OpenCall] = set()
        self.records: list[LLMCall] = []

    def open(self, call: OpenCall) -> None:
        with self._lock:
            self._open.add(call)

    def close(self, call: OpenCall, *, keep: bool = True) -> None:
        """``call`` ended; its record is kept unless ``keep`` is false (it was discarded)."""
        with self._lock:
            self._open.discard(call)
            if keep:
                self.records.append(call.call)

    @property
    def in_flight(self) -> int:
        """Calls started and not yet ended."""
        return len(self._open)

    def abandon_open(self, why: str) -> None:
        """End every call still in flight, marked partial with ``why``."""
        with self._lock:
            pending = list(self._open)
        for call in pending:
            call.abandon(why)

    def has_later(self, source: str, seq: int) -> bool:
        """Whether a call recorded by ``source`` started after call number ``seq``."""
        with self._lock:
            return any(c.source == source and c.seq > seq for c in self.records)


def _request_attributes(
    call: LLMCall, trajectory: Trajectory | None, server: Any
) -> dict[str, Any]:
    params = call.params
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": call.model,
        "arttrace.trainable": call.trainable,
    }
    if call.source == "openai":
        attrs["gen_ai.provider.name"] = attrs["gen_ai.system"] = "openai"
    for param, name in (
        ("temperature", "gen_ai.request.temperature"),
        ("top_p", "gen_ai.request.top_p"),
        ("max_tokens", "gen_ai.request.max_tokens"),
        ("max_completion_tokens", "gen_ai.request.max_tokens"),
        ("n", "gen_ai.request.choice.count"),
        ("seed", "gen_ai.request.seed"),
        ("presence_penalty", "gen_ai.request.presence_penalty"),
        ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ):
        value = params.get(param)
        if isinstance(value, int | float):
            attrs[name] = value
    if call.agent:
        attrs["arttrace.agent"] = call.agent
    if call.source != "openai":
        attrs["arttrace.framework"] = call.source
    if trajectory is not None:
        attrs["arttrace.example_id"] = trajectory.example_id
    base_url = getattr(server, "base_url", None)
    if base_url is not None:
        attrs["server.address"] = base_url.host
        if base_url.port:
            attrs["server.port"] = base_url.port
    return attrs


def _response_attributes(call: LLMCall, export_tokens: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gen_ai.response.finish_reasons": [c.finish_reason or "" for c in call.choices],
        "arttrace.partial": call.partial,
    }
    if call.response_id:
        attrs["gen_ai.response.id"] = call.response_id
    if call.response_model:
        attrs["gen_ai.response.model"] = call.response_model
    usage = call.usage or {}
    if "prompt_tokens" in usage:
        attrs["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
    if "completion_tokens" in usage:
        attrs["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    if export_tokens:
        if call.prompt_token_ids is not None:
            attrs["arttrace.prompt_token_ids"] = call.prompt_token_ids.tolist()
        for c in call.choices:
            if c.token_ids is not None:
                attrs[f"arttrace.choice.{c.index}.token_ids"] = c.token_ids.tolist()
            if c.logprobs is not None:
                attrs[f"arttrace.choice.{c.index}.logprobs"] = c.logprobs.tolist()
    return attrs
