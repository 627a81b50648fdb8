"""LlamaIndex: its LLM calls, agent runs and tool calls, through LlamaIndex's instrumentation.

``arttrace.instrument()`` calls :func:`install` as soon as ``llama_index.core`` is imported;
without it, call :func:`install` yourself. It adds an
:class:`ArttraceEventHandler` (LLM chat events) and its :class:`ArttraceSpanHandler`
(LlamaIndex's spans: which agent made a call, tool calls, failures) to LlamaIndex's root
dispatcher.

Each chat call (``chat``, ``achat``, ``stream_chat``, ``astream_chat`` and the ``*_with_tools``
variants agents use) becomes one record: every ``ChatMessage`` converted to an OpenAI message of
its own role, content blocks as content parts, tool calls with their ids, tool results as
``role: tool`` with ``tool_call_id``, the tools in OpenAI form, and the sampled tokens'
logprobs read from the raw completion (or from every raw chunk of a stream). When LlamaIndex's
LLM called the OpenAI SDK under arttrace's shim, the trajectory keeps the shim's record, which
has the exact tokens, named ``framework="llama_index"`` and ``step=<agent name>``.

Agent runs (``FunctionAgent``, ``ReActAgent``, ``CodeActAgent``, ``AgentWorkflow``) become
``invoke_agent`` spans and tool calls ``execute_tool`` spans; LLM calls nest under them.
"""

from __future__ import annotations

import inspect
import sys
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.exception import ExceptionEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
)
from llama_index.core.instrumentation.span import BaseSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.tools.types import BaseTool
from llama_index_instrumentation import get_dispatcher
from opentelemetry.trace import Span
from pydantic import PrivateAttr

from .._lazy import lazy
from ..capture._guard import guarded
from ..capture._records import field_of
from ._core import Fix, FrameworkCall, choice_record, end_span, guard, step_span
from ._inflight import InFlight
from ._openai_form import token_logprob, tool_call, tool_specs, usage_of

__all__ = ["ArttraceEventHandler", "ArttraceSpanHandler", "install", "openai_message", "uninstall"]

FRAMEWORK = "llama_index"
_FIX = Fix(
    "LlamaIndex",
    route="LlamaIndex's OpenAI or OpenAILike LLM (api_base='<vLLM>/v1')",
    wrap=(
        " (or give the LLM clients wrapped with arttrace.wrap_openai: OpenAI(..., "
        "openai_client=arttrace.wrap_openai(openai.OpenAI(...)), "
        "async_openai_client=arttrace.wrap_openai(openai.AsyncOpenAI(...))))"
    ),
)
_WHY = "this LLM class does not call the OpenAI SDK"
_guard = guard("LlamaIndex")
_ROLES = {"chatbot": "assistant", "model": "assistant"}
_PARAMS = ("temperature", "max_tokens", "top_p", "seed", "logprobs", "top_logprobs")
_MAX_DEPTH = 256  # bound on walks up LlamaIndex's span tree


# -- the shared state of one handler pair -------------------------------------------------


class _Node:
    """One open LlamaIndex span, as far as arttrace cares."""

    __slots__ = ("agent", "llm", "parent", "span", "tool", "tool_call_id")

    def __init__(self, parent: str | None) -> None:
        self.parent = parent
        self.span: Span | None = None  # ours: an invoke_agent or execute_tool span
        self.agent: str | None = None
        self.tool: str | None = None
        self.tool_call_id: str | None = None
        self.llm: Any = None


@dataclass(slots=True, eq=False)
class _Pending:
    """A chat call between its start and end events."""

    call: FrameworkCall
    streamed: bool = False
    logprobs: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    response_model: str | None = None

    def absorb(self, raw: Any) -> None:
        """Fold a raw OpenAI-form completion, or one chunk of a stream, into the record."""
        if raw is None:
            return
        if self.response_id is None:
            rid, model = field_of(raw, "id"), field_of(raw, "model")
            self.response_id = rid if isinstance(rid, str) else None
            self.response_model = model if isinstance(model, str) else None
        prompt = field_of(raw, "prompt_token_ids")
        if self.prompt_token_ids is None and isinstance(prompt, list):
            self.prompt_token_ids = prompt
        usage = usage_of(field_of(raw, "usage"))
        if usage is not None:
            self.usage = usage
        for choice in field_of(raw, "choices") or ():
            if field_of(choice, "index") not in (0, None):
                continue  # LlamaIndex keeps the first choice only
            reason = field_of(choice, "finish_reason")
            if reason is not None:
                self.finish_reason = str(reason)
            content = field_of(field_of(choice, "logprobs"), "content")
            if isinstance(content, list):
                if self.logprobs is None:
                    self.logprobs = []
                for t in content:
                    top = [(field_of(a, "token"), field_of(a, "logprob")) for a in _top(t)]
                    self.logprobs.append(
                        token_logprob(field_of(t, "token"), field_of(t, "logprob"), top)
                    )
            ids = field_of(choice, "token_ids")
            if isinstance(ids, list):
                self.token_ids = [*(self.token_ids or ()), *ids]


class _State:
    """What the event handler and the span handler of one pair share: LlamaIndex's open spans
    by span id, and the chat calls in flight by :func:`_key`."""

    def __init__(self) -> None:
        self.nodes: InFlight[str, _Node] = InFlight()
        self.pending: InFlight[Any, _Pending] = InFlight()

    def ancestry(self, span_id: str | None) -> tuple[Any, str | None, str | None, Span | None]:
        """For the span ``span_id``: its LLM, the agent it runs in, the nearest tool call id,
        and the nearest span of ours (to nest under)."""
        llm = agent = tool_call_id = None
        span: Span | None = None
        for _ in range(_MAX_DEPTH):
            node = self.nodes.top(span_id) if span_id is not None else None
            if node is None:
                break
            llm = llm if llm is not None else node.llm
            agent = agent or node.agent
            tool_call_id = tool_call_id or node.tool_call_id
            span = span or node.span
            if agent and span:
                break
            span_id = node.parent
        return llm, agent, tool_call_id, span

    def nearest_tool(self, span_id: str | None) -> bool:
        """Whether the nearest span of ours above ``span_id`` is a tool call (an adapter
        around a tool calls the wrapped tool: one tool call, one span)."""
        for _ in range(_MAX_DEPTH):
            node = self.nodes.top(span_id) if span_id is not None else None
            if node is None:
                return False
            if node.span is not None:
                return node.tool is not None
            span_id = node.parent
        return False

    def open(self, key: Any, pending: _Pending) -> None:
        # Forget calls that ended without their end event (the trajectory abandoned them).
        self.pending.remove(lambda p: p.call.call.ended_at is not None)
        self.pending.push(key, pending)


# -- the handlers ---------------------------------------------------------------------------


class ArttraceSpanHandler(BaseSpanHandler[BaseSpan]):
    """Follows LlamaIndex's spans: agent runs and tool calls become OpenTelemetry spans, and
    each LLM call learns which agent made it. Made by :class:`ArttraceEventHandler`
    (``handler.span_handler``); add both to the same dispatcher."""

    _state: _State = PrivateAttr(default_factory=_State)

    @classmethod
    def class_name(cls) -> str:
        return "ArttraceSpanHandler"

    @_guard
    def span_enter(
        self,
        id_: str,
        bound_args: inspect.BoundArguments | None,
        instance: Any = None,
        parent_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        state = self._state
        node = _Node(parent_id)
        ev = bound_args.arguments.get("ev") if bound_args is not None else None
        if ev is not None:  # a workflow step: AgentSetup/AgentInput name the agent, ToolCall the id
            agent, call_id = getattr(ev, "current_agent_name", None), getattr(ev, "tool_id", None)
            node.agent = agent if isinstance(agent, str) and agent else None
            node.tool_call_id = call_id if isinstance(call_id, str) and call_id else None
        if isinstance(instance, BaseLLM):
            node.llm = instance
        elif instance is not None:
            method = _method(id_)
            if isinstance(instance, BaseTool) and method in ("call", "acall", "__call__"):
                if not state.nearest_tool(parent_id):
                    name = instance.metadata.get_name()
                    _, _, call_id, parent = state.ancestry(parent_id)
                    node.tool = name
                    node.span = step_span(
                        "execute_tool",
                        name,
                        FRAMEWORK,
                        parent=parent,
                        attributes={"gen_ai.tool.call.id": call_id},
                    )
            elif method == "run" and _is_agent(instance):
                node.agent = str(getattr(instance, "name", None) or type(instance).__name__)
                _, _, _, parent = state.ancestry(parent_id)
                node.span = step_span("invoke_agent", node.agent, FRAMEWORK, parent=parent)
        state.nodes.push(id_, node)

    @_guard
    def span_exit(
        self, id_: str, bound_args: Any, instance: Any = None, result: Any = None, **_: Any
    ) -> None:
        node = self._state.nodes.pop(id_)
        if node is not None and node.span is not None:
            failed = getattr(result, "is_error", False) is True  # a ToolOutput reporting an error
            end_span(node.span, str(getattr(result, "content", "")) if failed else None)

    @_guard
    def span_drop(self, id_: str, *_: Any, err: BaseException | None = None, **__: Any) -> None:
        node = self._state.nodes.pop(id_)
        if node is not None and node.span is not None:
            end_span(node.span, err)
        # A chat call that raised (streams report ExceptionEvent).
        while (pending := self._state.pending.pop(id_)) is not None:
            if err is not None:
                pending.call.raised(err)
            else:
                pending.call.abandon("the call was interrupted")

    def close(self) -> None:
        """End the spans still open (the dispatcher shuts down, or arttrace detaches)."""
        for node in self._state.nodes.remove():
            if node.span is not None:
                end_span(node.span)

    def _unused(self, *args: Any, **kwargs: Any) -> None:
        return None

    # BaseSpanHandler's abstract hooks: the three entry points above replace them.
    new_span = prepare_to_exit_span = prepare_to_drop_span = _unused


class ArttraceEventHandler(BaseEventHandler):
    """Records each LlamaIndex chat call in the current trajectory (see the module docstring).

    Use :func:`install` (or ``arttrace.instrument()``). To manage dispatchers yourself, add
    this handler and its :attr:`span_handler` to the same dispatcher::

        handler = ArttraceEventHandler()
        dispatcher.add_event_handler(handler)
        dispatcher.add_span_handler(handler.span_handler)
    """

    _state: _State = PrivateAttr(default_factory=_State)
    _spans: ArttraceSpanHandler = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        spans = ArttraceSpanHandler()
        spans._state = self._state
        self._spans = spans

    @classmethod
    def class_name(cls) -> str:
        return "ArttraceEventHandler"

    @property
    def span_handler(self) -> ArttraceSpanHandler:
        """The span handler that goes with this event handler."""
        return self._spans

    @_guard
    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        pending: _Pending | None
        if isinstance(event, LLMChatInProgressEvent):
            pending = self._state.pending.top(_key(event.span_id, event.messages))
            if pending is not None:
                with guarded("LlamaIndex's stream chunk", pending.call.lost):
                    pending.streamed = True
                    pending.absorb(event.response.raw)
        elif isinstance(event, LLMChatStartEvent):
            self._start(event)
        elif isinstance(event, LLMChatEndEvent):
            pending = self._state.pending.pop(_key(event.span_id, event.messages))
            if pending is not None:
                with guarded("LlamaIndex's response", pending.call.lost):
                    _finish(pending, event.response)
        elif isinstance(event, ExceptionEvent) and event.span_id is not None:
            pending = self._state.pending.pop(event.span_id)
            if pending is not None:
                pending.call.raised(event.exception)

    def _start(self, event: LLMChatStartEvent) -> None:
        llm, agent, _, parent = self._state.ancestry(event.span_id)
        extra = event.additional_kwargs
        model = getattr(llm, "model", None) or event.model_dict.get("model_name")
        call = FrameworkCall(
            FRAMEWORK,
            str(model or event.model_dict.get("class_name") or "unknown"),
            [openai_message(m) for m in event.messages],
            tools=_tools(extra.get("tools")),
            params=_params(llm, extra),
            step=agent,
            parent=parent,
            fix=_FIX.text(_WHY),
        )
        self._state.open(_key(event.span_id, event.messages), _Pending(call))

    def close(self) -> None:
        """Abandon the calls still open and end the spans (arttrace detaches)."""
        for pending in self._state.pending.remove():
            pending.call.abandon("arttrace stopped recording LlamaIndex during the call")
        self._spans.close()


def _finish(pending: _Pending, response: ChatResponse | None) -> None:
    if response is None:  # a stream that produced nothing
        pending.call.finish([], streamed=pending.streamed)
        return
    if not pending.streamed:
        pending.absorb(response.raw)
    record = choice_record(
        openai_message(response.message, role="assistant"),
        finish_reason=pending.finish_reason,
        logprobs=pending.logprobs,
        token_ids=pending.token_ids,
    )
    if pending.prompt_token_ids is not None:
        pending.call.call.prompt_token_ids = array("q", pending.prompt_token_ids)
    pending.call.finish(
        [record],
        usage=pending.usage,
        response_id=pending.response_id,
        response_model=pending.response_model,
        streamed=pending.streamed,
    )


# -- installing ------------------------------------------------------------------------------

_install_lock = threading.Lock()


def install() -> ArttraceEventHandler:
    """Record LlamaIndex's LLM calls, agent runs and tool calls from now on, by adding an
    :class:`ArttraceEventHandler` and its span handler to LlamaIndex's root dispatcher.

    Idempotent: returns the handler already installed, if any. ``arttrace.instrument()`` calls
    it as soon as ``llama_index.core`` is imported; alone, it records LlamaIndex's view of each
    call, which lacks the exact tokens unless the LLM's OpenAI clients are wrapped with
    ``arttrace.wrap_openai``. :func:`uninstall` undoes it.
    """
    with _install_lock:
        root = get_dispatcher()
        handler = next(
            (h for h in root.event_handlers if isinstance(h, ArttraceEventHandler)), None
        )
        if handler is None:
            handler = ArttraceEventHandler()
            root.add_event_handler(handler)
        if not any(h is handler.span_handler for h in root.span_handlers):
            root.add_span_handler(handler.span_handler)
        return handler


def uninstall() -> None:
    """Stop recording LlamaIndex (idempotent): remove arttrace's handlers from the root
    dispatcher, abandon the calls still open and end their spans. ``arttrace.uninstrument()``
    calls it."""
    with _install_lock:
        root = get_dispatcher()
        ours = [h for h in root.event_handlers if isinstance(h, ArttraceEventHandler)]
        root.event_handlers = [
            h for h in root.event_handlers if not isinstance(h, ArttraceEventHandler)
        ]
        root.span_handlers = [
            h for h in root.span_handlers if not isinstance(h, ArttraceSpanHandler)
        ]
    for handler in ours:
        handler.close()


# The names install and uninstall had before (deprecated, for one release).
__getattr__, __dir__ = lazy(__name__, {}, deprecated={"attach": "install", "detach": "uninstall"})


# -- LlamaIndex objects in OpenAI form --------------------------------------------------------


def openai_message(message: ChatMessage, *, role: str | None = None) -> dict[str, Any]:
    """``message`` as an OpenAI Chat Completions message: text blocks as text (one string when
    the message is all text, as LlamaIndex's OpenAI LLM sends it), image/audio/document blocks
    as content parts, tool calls (``ToolCallBlock`` or ``additional_kwargs["tool_calls"]``) with
    their ids, and ``tool_call_id`` on tool results. Thinking and cache blocks are left out, as
    Chat Completions takes none."""
    role = role or _ROLES.get(message.role.value, message.role.value)
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCallBlock):
            tool_calls.append(tool_call(block.tool_call_id, block.tool_name, block.tool_kwargs))
        elif isinstance(block, ImageBlock | AudioBlock | DocumentBlock):
            parts.append(_media_part(block))
    kwargs = message.additional_kwargs
    if not tool_calls:
        for tc in kwargs.get("tool_calls") or ():
            function = field_of(tc, "function")
            tool_calls.append(
                tool_call(
                    field_of(tc, "id"), field_of(function, "name"), field_of(function, "arguments")
                )
            )
    content: str | list[dict[str, Any]] | None
    if all(p["type"] == "text" for p in parts):
        content = "".join(p["text"] for p in parts)
        if not content and tool_calls and role == "assistant":
            content = None
    else:
        content = parts
    out: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        out["tool_calls"] = tool_calls
    if role == "tool" and kwargs.get("tool_call_id") is not None:
        out["tool_call_id"] = str(kwargs["tool_call_id"])
    return out


def _media_part(block: ImageBlock | AudioBlock | DocumentBlock) -> dict[str, Any]:
    try:
        if isinstance(block, ImageBlock):
            if block.url:
                url = str(block.url)
            else:
                data = block.resolve_image(as_base64=True).read().decode()
                url = f"data:{block.image_mimetype or 'image/png'};base64,{data}"
            image: dict[str, Any] = {"url": url}
            if block.detail:
                image["detail"] = block.detail
            return {"type": "image_url", "image_url": image}
        if isinstance(block, AudioBlock):
            data = block.resolve_audio(as_base64=True).read().decode()
            return {"type": "input_audio", "input_audio": {"data": data, "format": block.format}}
        return {"type": "file", "file": {"filename": block.title, "file_data": block.inline_url()}}
    except Exception as error:  # unreadable media: keep the part's place, say why
        return {"type": block.block_type, "error": f"arttrace could not read it: {error}"}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """The tools of a call in OpenAI form (LlamaIndex tools converted)."""
    return tool_specs(
        tools,
        lambda t: (
            t.metadata.to_openai_tool(skip_length_check=True) if isinstance(t, BaseTool) else None
        ),
    )


def _params(llm: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if llm is not None:
        params.update({name: getattr(llm, name, None) for name in _PARAMS})
        if not params.get("logprobs"):
            params.pop("top_logprobs", None)
        more = getattr(llm, "additional_kwargs", None)
        if isinstance(more, Mapping):
            params.update(more)
    params.update({k: v for k, v in extra.items() if k not in ("tools", "messages")})
    return params


# -- helpers --------------------------------------------------------------------------------


def _top(token: Any) -> Sequence[Any]:
    top = field_of(token, "top_logprobs")
    return top if isinstance(top, Sequence) else ()


def _key(span_id: str | None, messages: Sequence[Any]) -> Any:
    """What pairs a call's start, progress and end events: LlamaIndex's span id for the chat
    method, or (for an LLM class whose chat method has no span) the messages themselves."""
    return span_id if span_id is not None else tuple(id(m) for m in messages)


def _method(span_id: str) -> str:
    """``"acall"`` from ``"FunctionTool.acall-<uuid4>"``."""
    head = span_id[:-37] if len(span_id) > 37 and span_id[-37] == "-" else span_id
    return head.rsplit(".", 1)[-1]


def _is_agent(instance: Any) -> bool:
    """A LlamaIndex agent or multi-agent workflow (without importing the agent modules)."""
    for module, name in (
        ("llama_index.core.agent.workflow.base_agent", "BaseWorkflowAgent"),
        ("llama_index.core.agent.workflow.multi_agent_workflow", "AgentWorkflow"),
    ):
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(instance, cls):
            return True
    return False
