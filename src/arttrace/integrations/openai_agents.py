"""The OpenAI Agents SDK: a tracing processor that names each model call with its agent.

The Agents SDK calls the model through the OpenAI SDK (``responses.create`` with its default
``OpenAIResponsesModel``, ``chat.completions.create`` with ``OpenAIChatCompletionsModel``), so
the OpenAI shim records every call, with the exact tokens; this integration keeps no record of
its own (no duplicates), it names the shim's: ``framework="openai_agents"``, ``step=<agent
name>``, and, on the calls of an agent reached by a handoff, ``params["arttrace_handoff_from"]``
(span attribute ``arttrace.openai_agents.handoff_from``).

:func:`arttrace.instrument` installs :class:`ArttraceTracingProcessor` with
``agents.add_trace_processor`` when ``agents`` is imported. Names need the Agents SDK's tracing
on (its default; ``set_tracing_disabled(True)`` or ``RunConfig(tracing_disabled=True)`` leave
calls recorded but unnamed).

Trainable turns: a Responses turn trains when the server returns its exact token ids (see
:mod:`arttrace.capture._responses`; stock vLLM gives no logprobs for a turn that is only a
function call); ``OpenAIChatCompletionsModel`` against vLLM trains every turn. The Responses
*websocket* transport (``OpenAIProvider(use_responses_websocket=True)``,
``set_default_openai_responses_transport("websocket")``) sends calls outside the OpenAI SDK's
HTTP methods, where arttrace cannot see them: it warns once, naming the fix.

openai-agents 0.20 is the newest release that installs beside ART 0.5.23 (later releases need
openai 3, ART pins openai<3).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt

try:
    import agents
    from agents.models import _openai_shared
    from agents.tracing import (
        AgentSpanData,
        HandoffSpanData,
        ResponseSpanData,
        Span,
        Trace,
        TracingProcessor,
    )
    from agents.tracing.provider import DefaultTraceProvider
except ImportError as error:  # pragma: no cover - only without the framework
    raise ImportError(
        "arttrace.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'openai-agents>=0.20,<0.21' (later releases need openai 3, ART pins openai<3)"
    ) from error

from ..capture import _context, _openai
from ..capture._calls import OpenCall
from ..capture._guard import guarded
from ..capture._unwrap import mark, ours, unwrap
from ..capture._warnings import UntrainableTurnWarning, _warn_once
from ._core import guard

__all__ = ["ArttraceTracingProcessor", "install", "uninstall"]

FRAMEWORK = "openai_agents"
WEBSOCKET_FIX = (
    "The OpenAI Agents SDK sent a model call over the Responses websocket transport, which "
    "arttrace cannot see, so the turn is lost to training: use the HTTP transport (drop "
    "use_responses_websocket=True / set_default_openai_responses_transport('websocket')), or "
    "OpenAIChatCompletionsModel."
)
_guard = guard("the OpenAI Agents SDK")


@dataclass(frozen=True, slots=True)
class _Open:
    """What the processor keeps of an open span: where it sits, and what it is."""

    trace_id: str
    parent_id: str | None
    kind: str
    name: str | None


class ArttraceTracingProcessor(TracingProcessor):
    """Names the OpenAI shim's records of an Agents SDK run's model calls (agent, handoff).

    It keeps the open spans of each trace (id, parent, kind, agent name) and the handoffs seen,
    and answers, for the span current when a call starts, which agent made it. It exports
    nothing and never changes the SDK's spans.
    """

    def __init__(self) -> None:
        self.enabled = True
        self.added = False
        self._lock = threading.Lock()
        self._spans: dict[str, _Open] = {}
        self._handoffs: dict[tuple[str, str], str] = {}
        """(trace id, agent reached) -> the agent that handed off to it."""
        self._seen: set[str] = set()
        """Response spans whose call the shim opened."""

    # -- the SDK's callbacks ---------------------------------------------------------------

    @_guard
    def on_trace_start(self, trace: Trace) -> None:
        return None

    @_guard
    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            for key in [k for k in self._handoffs if k[0] == trace.trace_id]:
                del self._handoffs[key]

    @_guard
    def on_span_start(self, span: Span[Any]) -> None:
        if not self.enabled:
            return
        data = span.span_data
        name = data.name if isinstance(data, AgentSpanData) else None
        with self._lock:
            self._spans[span.span_id] = _Open(span.trace_id, span.parent_id, data.type, name)
        if isinstance(data, ResponseSpanData) and _websocket_by_default() and _watched():
            _warn_websocket()

    @_guard
    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        with self._lock:
            self._spans.pop(span.span_id, None)
            seen = span.span_id in self._seen
            self._seen.discard(span.span_id)
            if isinstance(data, HandoffSpanData) and data.from_agent and data.to_agent:
                self._handoffs[(span.trace_id, data.to_agent)] = data.from_agent
        if isinstance(data, ResponseSpanData) and not seen and self.enabled and _watched():
            _warn_websocket()  # a Responses call the shim never saw: the websocket transport

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None

    # -- naming the shim's records ---------------------------------------------------------

    def name(self, call: OpenCall) -> None:
        """Name ``call`` (opened by the shim now) after the agent whose span is current."""
        if not self.enabled:
            return
        current = agents.tracing.get_current_span()
        if current is None:
            return
        agent = None
        with self._lock:
            span_id: str | None = current.span_id
            while span_id is not None and (open_span := self._spans.get(span_id)) is not None:
                if open_span.kind in ("response", "generation"):
                    self._seen.add(span_id)
                if open_span.kind == "agent":
                    agent = open_span
                    break
                span_id = open_span.parent_id
            handoff = (
                self._handoffs.get((agent.trace_id, agent.name or ""))
                if agent is not None
                else None
            )
        if agent is None:
            return
        record = call.call
        record.framework = FRAMEWORK
        record.step = agent.name
        call.span.set_attribute("arttrace.framework", FRAMEWORK)
        if agent.name:
            call.span.set_attribute("gen_ai.agent.name", agent.name)
        if handoff is not None:
            record.params["arttrace_handoff_from"] = handoff
            call.span.set_attribute("arttrace.openai_agents.handoff_from", handoff)


def _websocket_by_default() -> bool:
    return _openai_shared.get_default_openai_responses_transport() == "websocket"


def _watched() -> bool:
    """A run is recording here with the shim on: a call it cannot see would be lost."""
    return (
        _context.current_trajectory_var.get() is not None and _context.shim_settings() is not None
    )


def _warn_websocket() -> None:
    _warn_once(
        ("", "openai_agents websocket"),
        f"arttrace: {WEBSOCKET_FIX}",
        UntrainableTurnWarning,
    )


_processor: ArttraceTracingProcessor | None = None
_install_lock = threading.Lock()


def install() -> None:
    """Add the processor to the Agents SDK's tracing and let it name the shim's records; an
    application that later replaces the SDK's processors (``set_trace_processors``, to export
    elsewhere) keeps it. Idempotent; :func:`arttrace.instrument` calls it."""
    global _processor
    with _install_lock:
        if _processor is None:
            _processor = ArttraceTracingProcessor()
        _processor.enabled = True
        if not _registered(_processor):
            agents.add_trace_processor(_processor)
            _processor.added = True
        if not ours(DefaultTraceProvider.__dict__.get("set_processors")):
            wrapt.wrap_function_wrapper(DefaultTraceProvider, "set_processors", _keep_ours)
        _openai.add_namer(_processor.name)


def uninstall() -> None:
    """Undo :func:`install` (idempotent): the processor stays registered (the SDK cannot remove
    one) but does nothing, and ``set_trace_processors`` is the SDK's own again."""
    with _install_lock:
        unwrap(DefaultTraceProvider, "set_processors")
        if _processor is not None:
            _processor.enabled = False
            _openai.remove_namer(_processor.name)


@mark
def _keep_ours(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    with guarded("keeping arttrace's processor among the Agents SDK's"):
        processor, given = _processor, args[0] if args else None
        if processor is not None and processor.enabled and isinstance(given, list):
            args = (given if processor in given else [*given, processor], *args[1:])
    return wrapped(*args, **kwargs)


def _registered(processor: ArttraceTracingProcessor) -> bool:
    """Whether the SDK's provider already calls ``processor`` (read from its private state;
    when that cannot be read, only a processor never added counts as absent)."""
    provider = agents.tracing.get_trace_provider()
    multi = getattr(provider, "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    if isinstance(processors, tuple):
        return processor in processors
    return processor.added
