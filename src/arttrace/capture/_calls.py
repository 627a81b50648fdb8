"""The lifecycle of one captured LLM call, whatever layer saw it.

An :class:`OpenCall` is opened when a call starts: it holds the call's record and its
OpenTelemetry span, and registers with the run's :class:`CallLog`. It ends once (finished,
failed, abandoned or discarded); the log then keeps the record. The layers that see calls (the
OpenAI shim, the framework hooks) subclass it; the trajectory only reads the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._guard import guarded
from ._layers import is_paired
from ._records import UNREADABLE, LLMCall, token_count
from ._redact import UpstreamError, error_text, exception_attributes, excerpt, redact, scrub_params
from ._threads import report_late_call
from ._warnings import warn_untrainable

if TYPE_CHECKING:
    from ._trajectory import Trajectory

_tracer = trace.get_tracer("arttrace")
_log = logging.getLogger("arttrace")


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
    """A call in flight: its record, its span, and the trajectory that will keep it.

    It ends once: the first of finish, fail, abandon or :meth:`lost` claims the ending, and the
    record is not written after that (a response arriving after the trajectory ended changes
    nothing). Every step runs under :func:`guarded`: a failure of arttrace's own marks the
    record (``capture_error``) and never reaches the caller.
    """

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
        self._done = False
        self._lock = threading.Lock()
        params, call.params = call.params, {}  # none recorded unless scrubbed
        with guarded("dropping a call's headers and keys", self._mark_unreadable):
            call.params = scrub_params(params)
        attributes: dict[str, Any] = {}
        if tracing():  # else every span records nothing: its attributes are not built
            with guarded("building a call's span attributes", self._mark_unreadable):
                attributes = _request_attributes(call, trajectory, server)
        self.span = _tracer.start_span(
            f"chat {call.model}",
            context=None if parent is None else trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        if trajectory is not None:
            trajectory.call_log.open(self)

    def fail(self, error: BaseException, *, partial: bool = False) -> None:
        """The call raised (``partial``: after part of the response had arrived)."""
        if not self._claim():
            return
        with guarded("recording a failed call", self._mark_unreadable):
            if partial:
                self.call.partial = True
                self._keep_partial()
            self._record_error(error)
        self._close()

    def refused(self, status: int, data: bytes) -> bool:
        """Whether the server answered the call with an error (``status`` >= 400, ``data``
        its body): the call fails with it."""
        if status < 400:
            return False
        self.fail(UpstreamError(f"the server answered {status}: {excerpt(data)}"))
        return True

    def _keep_partial(self) -> None:
        """Keep what arrived of a response that did not finish, as context (a stream's
        recorder knows what it has)."""

    def _record_error(self, error: BaseException) -> None:
        self.call.error = error_text(error)
        self.span.record_exception(error, attributes=exception_attributes(error))
        self.span.set_attribute("error.type", type(error).__qualname__)
        self.span.set_status(Status(StatusCode.ERROR, redact(str(error))))

    def abandon(self, why: str) -> None:
        """The call will not finish (the caller stopped reading, the trajectory ended)."""
        if not self._claim():
            return
        with guarded("recording an abandoned call", self._mark_unreadable):
            self._record_abandoned(why)
        self._close()

    def _record_abandoned(self, why: str) -> None:
        self._keep_partial()
        self.call.partial = True
        self.call.error = why

    def lost(self, error: BaseException) -> None:
        """arttrace failed while recording this call (``error``, already logged): it ends now,
        kept as context and marked, with the one warning if it was a policy turn."""
        if not self._claim():
            return
        self._mark_unreadable(error)
        if self.call.streamed:
            with guarded("keeping a stream's output"):
                self._keep_partial()
        self._close()

    def _mark_unreadable(self, error: BaseException) -> None:
        if self.call.capture_error is None:
            self.call.capture_error = error_text(error)

    def _finish(self) -> None:
        """End the call with what its record holds (once)."""
        if self._claim():
            self._close()

    def _claim(self) -> bool:
        """Whether this caller is the one that ends the call."""
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True

    def _close(self) -> None:
        """After the claim: the span ends, the policy turn warns if it cannot be trained, the
        log keeps the record; each step guarded, so that one failing does not stop the next."""
        call = self.call
        call.ended_at = time.time()
        with guarded("building a call's response attributes", self._mark_unreadable):
            if self.span.is_recording():
                self.span.set_attributes(_response_attributes(call, self.export_tokens))
        with guarded("ending a call's span"):
            self.span.end()
        if call.trainable and not call.error:
            with guarded("warning about an untrainable turn"):
                self._warn_untrainable()
        if self.trajectory is not None:
            with guarded("keeping a call's record"):
                self.trajectory.call_log.close(self)

    def _warn_untrainable(self) -> None:
        call = self.call
        if call.capture_error:  # whether or not any choice was read
            self._warn(UNREADABLE)
            return
        for choice in call.choices:
            reason = call.untrainable_reason(choice)
            if reason is not None:
                self._warn(reason)
                return

    def _warn(self, reason: str, fix: str | None = None) -> None:
        """The policy turn cannot be trained for ``reason``: once per run, model and reason."""
        run = None if self.trajectory is None else self.trajectory.call_log
        warn_untrainable(self.call.model, reason, fix, run=run)


class CallLog:
    """The calls of one run: those in flight, and the records of those that ended.

    When the run ends the log is frozen (:meth:`freeze`): calls still in flight are abandoned
    and kept as partial; a call that starts or ends later (a task the run started and did not
    await) is not recorded, and this is logged once.
    """

    __slots__ = (
        "_dropped",
        "_frozen",
        "_lock",
        "_open",
        "_warned",
        "cache_answered",
        "gateway",
        "gateway_reached",
        "name",
        "policy_ran",
        "records",
    )

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.policy_ran = False
        """A ``@trainable`` function ran in this run (so it should record a policy turn)."""
        self.cache_answered: str | None = None
        """Whose cache answered a call in this run (``"DSPy's"``), when a hook noticed."""
        self.gateway = False
        """The run has a gateway URL: its agent's calls are policy turns, so it should record
        one."""
        self.gateway_reached = False
        """A call reached the run's gateway URL and was forwarded (recorded or not)."""
        self._lock = threading.Lock()
        self._open: set[OpenCall] | frozenset[OpenCall] = set()
        self._frozen = False
        self._dropped = False
        self.records: list[LLMCall] = []
        self._warned: set[tuple[str, str]] | None = None

    @property
    def warned(self) -> set[tuple[str, str]]:
        """The (model, cause) pairs of the untrainable turns this run has warned about (made
        on first use: most runs warn about nothing, and a kept run costs less without it)."""
        if self._warned is None:
            self._warned = set()
        return self._warned

    @warned.setter
    def warned(self, value: set[tuple[str, str]]) -> None:
        self._warned = value

    def open(self, call: OpenCall) -> None:
        with self._lock:
            if not self._frozen:
                self._open.add(call)  # type: ignore[union-attr]  # a set until frozen
                return
        self._drop(call, "started")

    def close(self, call: OpenCall, *, keep: bool = True) -> None:
        """``call`` ended; its record is kept unless ``keep`` is false (it was discarded)."""
        with self._lock:
            known = call in self._open
            if known:
                self._open.remove(call)  # type: ignore[union-attr]  # a set: it holds the call
                if keep:
                    self.records.append(call.call)
        if keep and not known:
            self._drop(call, "ended")

    def _drop(self, call: OpenCall, when: str) -> None:
        warned = False
        with guarded("reporting a call after its run ended"):
            warned = report_late_call(self)  # work the run handed to a thread: its own warning
        with self._lock:
            first, self._dropped = not self._dropped, True
        if first and not warned:
            _log.warning(
                "arttrace: a call to model %r %s after trajectory %r had ended, so it is not "
                "recorded in it (its span still ends). A task or thread the run started "
                "outlived its `with` block: await it inside the block.",
                call.call.model,
                when,
                self.name,
            )

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

    def freeze(self, why: str) -> None:
        """The run ended: abandon the calls in flight (``why``), then accept no more records."""
        self.abandon_open(why)
        with self._lock:
            self._frozen = True
            self._open = _NONE_OPEN  # the run's set let go: a kept run holds no empty table

    def shim_saw(self, call: LLMCall) -> bool:
        """Whether the OpenAI shim recorded the same call as the framework record ``call``
        (the layer merge pairs them)."""
        with self._lock:
            records = list(self.records)
        return is_paired(call, records)


_NONE_OPEN: frozenset[OpenCall] = frozenset()


def tracing() -> bool:
    """Whether a span can record: a tracer provider is configured (without one, OpenTelemetry's
    default proxy hands out spans that keep nothing)."""
    return not isinstance(trace.get_tracer_provider(), _NO_TRACING)


_NO_TRACING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


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
    if call.policy:
        attrs["arttrace.policy"] = call.policy
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
    usage = call.usage if isinstance(call.usage, Mapping) else {}
    for key, name in (
        ("prompt_tokens", "gen_ai.usage.input_tokens"),
        ("completion_tokens", "gen_ai.usage.output_tokens"),
    ):
        counted = token_count(usage.get(key))
        if counted is not None:
            attrs[name] = counted
    if export_tokens:
        if call.prompt_token_ids is not None:
            attrs["arttrace.prompt_token_ids"] = call.prompt_token_ids.tolist()
        for c in call.choices:
            if c.token_ids is not None:
                attrs[f"arttrace.choice.{c.index}.token_ids"] = c.token_ids.tolist()
            if c.logprobs is not None:
                attrs[f"arttrace.choice.{c.index}.logprobs"] = c.logprobs.tolist()
    return attrs
