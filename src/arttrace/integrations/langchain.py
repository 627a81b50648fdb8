"""LangChain and LangGraph: a callback handler that records each chat model call.

:func:`arttrace.instrument` installs :class:`ArttraceCallbackHandler` for every LangChain run
(through ``langchain_core``'s configure hook), or pass one yourself::

    handler = ArttraceCallbackHandler()
    agent.invoke(inputs, config={"callbacks": [handler]})

Each chat model call becomes one record (messages, tools and logprobs in OpenAI form). When
``ChatOpenAI``'s request also went through the OpenAI shim, the trajectory keeps that call once,
with the shim's exact tokens and LangChain's names.
Spans: one ``invoke_agent`` span per top-level run (the graph or chain you invoked) and per
LangGraph node, one ``execute_tool`` span per tool run; the runnables in between (prompts,
parsers, sequences, routers) get none, their children nest under the nearest span above.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
from langchain_core.tracers.context import register_configure_hook
from langchain_core.utils.function_calling import convert_to_openai_tool
from opentelemetry.trace import Span

from ..capture import _context
from ..capture._guard import guarded
from ..capture._records import ChoiceRecord
from ._core import Fix, FrameworkCall, choice_record, end_span, guard, step_span
from ._inflight import InFlight
from ._openai_form import tool_call, tool_specs, usage, usage_of

__all__ = ["ArttraceCallbackHandler", "install", "openai_messages", "uninstall"]

FRAMEWORK = "langchain"
_NOT_PARAMS = frozenset({"model", "model_name", "tools", "_type"})
# LangGraph raises these to steer the graph (interrupts, commands to a parent): not failures.
_CONTROL_FLOW = frozenset({"GraphBubbleUp", "GraphInterrupt", "NodeInterrupt", "ParentCommand"})
_FIX = Fix(
    "LangChain",
    route="ChatOpenAI(base_url='<vLLM>/v1', model=...), without use_responses_api",
    wrap=" (or wrap the model's OpenAI client with arttrace.wrap_openai)",
)
_guard = guard("LangChain")


class ArttraceCallbackHandler(BaseCallbackHandler):
    """Records LangChain chat model calls, tool runs and LangGraph nodes for arttrace.

    Use it explicitly (``config={"callbacks": [ArttraceCallbackHandler()]}``) or let
    :func:`arttrace.instrument` install it for every run. Calls join the trajectory current
    where the run was invoked, trainable inside a ``@trainable`` function. Without
    ``arttrace.instrument()`` (or ``arttrace.wrap_openai`` on the model's client) the handler
    sees LangChain's logprobs but not the exact token ids, so its turns are context only.
    """

    run_inline = True
    """Called in the run's own thread and context (no executor hop in async runs), so the
    current trajectory and ``@trainable`` scope are the ones the agent runs in."""

    def __init__(self) -> None:
        self._installed = False  # True only for the handler install() registers

    @property
    def active(self) -> bool:
        """Whether this handler records (the installed one stops after ``uninstall()``)."""
        return _hook_on if self._installed else True

    # What this handler does not watch: LangChain skips these events entirely. (Not
    # ignore_agent: LangChain gates tool events on it.)
    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    # -- chat models -----------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.active or not _context.recording() or not messages:
            return
        run = _Run(self)
        if not _runs.claim(run_id, run):
            return  # another arttrace handler on the same run records it
        with guarded("LangChain's on_chat_model_start", lambda _: _runs.pop(run_id)):
            params = dict(kwargs.get("invocation_params") or {})
            tools = params.get("tools")
            run.call = FrameworkCall(
                FRAMEWORK,
                _model_name(params, metadata, serialized),
                openai_messages(messages[0]),
                tools=tool_specs(tools, convert_to_openai_tool)
                if isinstance(tools, list | tuple)
                else None,
                params={k: v for k, v in params.items() if k not in _NOT_PARAMS},
                step=_step(metadata, kwargs.get("name")),
                parent=_children_span(parent_run_id),
                fix=_FIX.text(
                    f"{_serialized_name(serialized) or 'this chat model'} uses another client, "
                    "or ChatOpenAI's Responses API"
                ),
            )

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        run = _runs.pop(run_id) if self.active else None
        if run is not None and run.call is not None:
            with guarded("LangChain's on_llm_end", run.call.lost):
                _finish(run.call, response)

    @_guard
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = _runs.pop(run_id) if self.active else None
        if run is not None and run.call is not None:
            run.call.raised(error)

    # -- graphs, chains, tools -------------------------------------------------------------

    @_guard
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.active or not _context.recording():
            return
        name = kwargs.get("name") or _serialized_name(serialized) or "chain"
        parent = _children_span(parent_run_id)
        run = _Run(self, parent=parent)
        if not _runs.claim(run_id, run):
            return
        node = _graph_node(name, tags, metadata)
        if parent_run_id is None or node is not None:
            attributes = {}
            if node is not None:
                attributes = {
                    "arttrace.langgraph.node": node,
                    "arttrace.langgraph.step": (metadata or {}).get("langgraph_step"),
                }
            run.span = run.parent = step_span(
                "invoke_agent", name, FRAMEWORK, parent=parent, attributes=attributes
            )

    @_guard
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = _runs.pop(run_id) if self.active else None
        if run is not None and run.span is not None:
            end_span(run.span)

    @_guard
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        run = _runs.pop(run_id) if self.active else None
        if run is not None and run.span is not None:
            steers = {c.__name__ for c in type(error).__mro__} & _CONTROL_FLOW
            end_span(run.span, None if steers else error)

    @_guard
    def on_tool_start(
        self, serialized: Any, input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        if not self.active or not _context.recording():
            return
        run = _Run(self)
        if not _runs.claim(run_id, run):
            return
        name = kwargs.get("name") or _serialized_name(serialized) or "tool"
        run.span = run.parent = step_span(
            "execute_tool",
            name,
            FRAMEWORK,
            parent=_children_span(kwargs.get("parent_run_id")),
            attributes={"gen_ai.tool.call.id": kwargs.get("tool_call_id")},
        )

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.on_chain_end(output, run_id=run_id)  # a tool's run ends as a chain's does

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.on_chain_error(error, run_id=run_id)


# -- runs in flight, keyed by LangChain's run id --------------------------------------------


@dataclass(slots=True)
class _Run:
    owner: ArttraceCallbackHandler
    span: Span | None = None
    """This run's own span (graph, node or tool), ended with the run."""
    parent: Span | None = None
    """The span this run's children nest under: its own, or the nearest one above it."""
    call: FrameworkCall | None = None


_runs: InFlight[UUID, _Run] = InFlight()


def _children_span(parent_run_id: UUID | None) -> Span | None:
    parent = _runs.top(parent_run_id) if parent_run_id is not None else None
    return parent.parent if parent is not None else None


def _finish(call: FrameworkCall, response: LLMResult) -> None:
    generations = response.generations[0] if response.generations else []
    choices = [_choice(g, i) for i, g in enumerate(generations)]
    first = generations[0] if generations else None
    meta = first.message.response_metadata if isinstance(first, ChatGeneration) else {}
    output = response.llm_output or {}
    response_id = output.get("id") or meta.get("id")
    response_model = output.get("model_name") or meta.get("model_name")
    call.finish(
        choices,
        usage=_usage(output, first),
        response_id=response_id if isinstance(response_id, str) else None,
        response_model=response_model if isinstance(response_model, str) else None,
        streamed=isinstance(first, ChatGenerationChunk) or bool(call.call.params.get("stream")),
    )


# -- install / uninstall -----------------------------------------------------------------

_HANDLER = ArttraceCallbackHandler()
_HANDLER._installed = True
_handler_var: ContextVar[ArttraceCallbackHandler | None] = ContextVar(
    "arttrace_langchain_handler", default=_HANDLER
)
_hook_on = False
_hook_registered = False
_install_lock = threading.Lock()


def install() -> None:
    """Record every LangChain run from now on (idempotent; :func:`arttrace.instrument` calls it).

    A handler passed explicitly in a run's callbacks takes the place of the installed one.
    """
    global _hook_on, _hook_registered
    with _install_lock:
        if not _hook_registered:
            # LangChain adds the variable's handler to every run it configures; hooks cannot be
            # removed, so uninstall() makes the handler inert instead.
            register_configure_hook(_handler_var, True, ArttraceCallbackHandler)
            _hook_registered = True
        _hook_on = True


def uninstall() -> None:
    """Stop the installed handler (idempotent): it records nothing more, and the calls and
    spans it had open are closed as abandoned. Explicitly passed handlers keep working."""
    global _hook_on
    with _install_lock:
        _hook_on = False
    for run in _runs.remove(lambda r: r.owner is _HANDLER):
        if run.call is not None:
            run.call.abandon("arttrace was uninstrumented before the call finished")
        if run.span is not None:
            end_span(run.span)


# -- LangChain objects in OpenAI form ----------------------------------------------------


def openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the Chat Completions messages ``ChatOpenAI`` sends.

    String content stays a string and multi-part content stays OpenAI content parts; assistant
    turns keep their tool calls (ids, JSON arguments, invalid ones too) and text, with
    ``content: None`` beside tool calls; tool results are ``{"role": "tool", "tool_call_id",
    "content"}``. Other providers' formats (Anthropic, Bedrock, Vertex blocks) are converted
    by ``langchain_core``'s ``convert_to_openai_messages``.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        converted = convert_to_openai_messages([message], text_format="block")
        if isinstance(message, AIMessage):
            converted[0] = _assistant(message, converted[0])
        elif isinstance(message.content, str):
            converted[0]["content"] = message.content
        if isinstance(message, ToolMessage):
            converted[0].pop("name", None)  # not part of an OpenAI tool message
        out.extend(converted)
    return out


def _assistant(message: AIMessage, converted: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in converted.items() if k not in ("content", "tool_calls")}
    tool_calls = list(converted.get("tool_calls") or ())
    tool_calls += [
        tool_call(tc.get("id"), tc.get("name"), tc.get("args") or "")
        for tc in message.invalid_tool_calls
    ]
    if not tool_calls and message.additional_kwargs.get("tool_calls"):  # older providers
        tool_calls = [
            {k: v for k, v in tc.items() if k in ("id", "type", "function")}
            for tc in message.additional_kwargs["tool_calls"]
        ]
    text = str(message.text)
    out["content"] = (text or None) if tool_calls else text
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def _choice(generation: Any, index: int) -> ChoiceRecord:
    if not isinstance(generation, ChatGeneration):  # a text-completion model
        info = generation.generation_info or {}
        message: dict[str, Any] = {"role": "assistant", "content": generation.text}
        return choice_record(message, finish_reason=info.get("finish_reason"), index=index)
    meta = {**(generation.generation_info or {}), **generation.message.response_metadata}
    if isinstance(generation.message, AIMessage):
        message = _assistant(generation.message, convert_to_openai_messages(generation.message))
        message.pop("name", None)  # a sampled turn is the model's text and tool calls only
    else:
        message = {"role": "assistant", "content": str(generation.message.text)}
    logprobs = meta.get("logprobs")
    if isinstance(logprobs, Mapping):
        logprobs = logprobs.get("content")
    finish_reason = meta.get("finish_reason")
    return choice_record(
        message,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        logprobs=logprobs if isinstance(logprobs, list) else None,
        index=index,
    )


def _usage(llm_output: Mapping[str, Any], generation: Any) -> dict[str, Any] | None:
    metadata = getattr(getattr(generation, "message", None), "usage_metadata", None) or {}
    return usage_of(llm_output.get("token_usage")) or usage(
        metadata.get("input_tokens"), metadata.get("output_tokens"), metadata.get("total_tokens")
    )


def _model_name(
    params: Mapping[str, Any], metadata: Mapping[str, Any] | None, serialized: Any
) -> str:
    for value in (
        params.get("model"),
        params.get("model_name"),
        params.get("model_id"),
        (metadata or {}).get("ls_model_name"),
    ):
        if isinstance(value, str) and value:
            return value
    return _serialized_name(serialized) or "unknown"


def _serialized_name(serialized: Any) -> str | None:
    if not isinstance(serialized, Mapping):
        return None
    name = serialized.get("name")
    if isinstance(name, str):
        return name
    path = serialized.get("id")
    return str(path[-1]) if isinstance(path, list) and path else None


def _graph_node(
    name: str, tags: list[str] | None, metadata: Mapping[str, Any] | None
) -> str | None:
    """The LangGraph node this run is (not a runnable inside a node), else ``None``."""
    node = (metadata or {}).get("langgraph_node")
    if node == name and any(t.startswith("graph:step:") for t in tags or ()):
        return name
    return None


def _step(metadata: Mapping[str, Any] | None, run_name: Any) -> str | None:
    """The LangGraph node that made the call (``outer/inner`` inside a subgraph), else the
    run's name if one was given."""
    node = (metadata or {}).get("langgraph_node")
    if node is None:
        return run_name if isinstance(run_name, str) else None
    namespace = (metadata or {}).get("langgraph_checkpoint_ns")
    if isinstance(namespace, str) and "|" in namespace:
        return "/".join(part.split(":", 1)[0] for part in namespace.split("|"))
    return str(node)
