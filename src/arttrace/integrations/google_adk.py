"""Google ADK: a plugin that records every model call of an ADK agent, and spans for its agent
and tool steps.

With :func:`arttrace.instrument` every ADK ``Runner`` gets an :class:`ArttracePlugin` when it
runs (first in its plugin list, unless it already has one). Without it, add the plugin yourself::

    runner = InMemoryRunner(agent=agent, plugins=[ArttracePlugin()])

Each model call becomes one record in OpenAI form (system instruction, user text and media,
assistant tool calls with their ids, tool results with ``tool_call_id``, the function
declarations as ``tools``). ADK keeps no token ids, so exact tokens come from the OpenAI SDK
shim below ADK: give the agent ``LiteLlm(model="openai/<served name>", api_base=...)`` and call
``arttrace.instrument()``; the trajectory then keeps the shim's record of each call, named by
this plugin.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import wrapt
from google.adk.plugins import BasePlugin
from google.genai import types
from opentelemetry.trace import Span

from ..capture._guard import guarded
from ..capture._imports import when_imported
from ..capture._records import field_of
from ..capture._unwrap import mark, ours, unwrap
from ._core import Fix, FrameworkCall, choice_record, end_span, guard_async, step_span
from ._inflight import InFlight
from ._openai_form import function_tool, json_text, token_logprob, tool_call, usage

if TYPE_CHECKING:
    from google.adk.agents.base_agent import BaseAgent
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.events.event import Event
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.plugin_manager import PluginManager
    from google.adk.runners import Runner
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext

__all__ = [
    "ArttracePlugin",
    "install",
    "request_messages",
    "request_tools",
    "response_message",
    "uninstall",
]

FRAMEWORK = "google_adk"
"""The ``framework`` name on the calls this integration records."""

_FIX = Fix(
    "Google ADK",
    route=(
        "LiteLlm(model='hosted_vllm/<served name>' or 'openai/<served name>', "
        "api_base='<vLLM server>/v1') (arttrace sees LiteLLM's HTTP requests)"
    ),
)
_WHY = "arttrace does not see this ADK model's requests to the server"
_guarded = guard_async("the Google ADK plugin")

# Finish reasons: Gemini's names to OpenAI's (ADK reports STOP for tool calls too).
_FINISH_REASONS = {
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "MALFORMED_FUNCTION_CALL": "tool_calls",
    "UNEXPECTED_TOOL_CALL": "tool_calls",
    "TOO_MANY_TOOL_CALLS": "tool_calls",
}

# Request settings from GenerateContentConfig, under their Chat Completions names.
_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_output_tokens": "max_completion_tokens",
    "stop_sequences": "stop",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "candidate_count": "n",
    "response_logprobs": "logprobs",
    "logprobs": "top_logprobs",
}


@dataclass(eq=False, slots=True)
class _ModelCall:
    """One model call in flight, from ``before_model_callback`` to its final response."""

    open: FrameworkCall
    request: Any
    invocation_id: str
    key: object
    """The model response event's ``EventActions``: the same object in every callback of
    this call and on the event ADK builds from its response (kept so its id stays unique)."""
    response_id: str | None = None
    """The server's completion id, read below ADK when arttrace is installed."""
    streamed: bool = False
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


@dataclass(eq=False, slots=True)
class _Step:
    span: Span
    invocation_id: str
    key: object


_current_call: ContextVar[_ModelCall | None] = ContextVar("arttrace_adk_model_call", default=None)
"""The model call the current ADK flow is making; LiteLLM's client reads it to hand over the
server's completion id."""


class ArttracePlugin(BasePlugin):
    """Records each model call of an ADK agent for arttrace, and its agent and tool steps as
    OpenTelemetry spans.

    Register it first in the runner's plugins (a plugin that answers a callback earlier in the
    list hides it from this one): ``Runner(..., plugins=[ArttracePlugin(), ...])`` or
    ``App(..., plugins=[ArttracePlugin(), ...])``. :func:`arttrace.instrument` adds one to every
    runner that has none. The plugin only observes: it never changes a request or a response.
    """

    def __init__(self, name: str = "arttrace") -> None:
        super().__init__(name=name)
        self._calls: InFlight[int, _ModelCall] = InFlight()  # by id(EventActions)
        self._agents: InFlight[tuple[str, str], _Step] = InFlight()  # by (invocation, agent)
        self._tools: InFlight[int, _Step] = InFlight()  # by id(ToolContext)

    # -- model calls -----------------------------------------------------------------------

    @_guarded
    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        key = callback_context.actions
        invocation_id = callback_context.invocation_id
        agent_name = callback_context.agent_name
        stale = self._calls.pop(id(key))
        if stale is not None:  # the previous call under this event never got a response
            stale.open.discard()
        model = _served_model(str(field_of(llm_request, "model") or ""))
        open_call = FrameworkCall(
            FRAMEWORK,
            model,
            request_messages(llm_request),
            tools=request_tools(llm_request),
            params=_request_params(llm_request),
            step=agent_name,
            parent=self._agent_span(invocation_id, agent_name),
            fix=_FIX.text(_WHY),
        )
        state = _ModelCall(open_call, llm_request, invocation_id, key)
        self._calls.push(id(key), state)
        _current_call.set(state)
        return None

    @_guarded
    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        key = callback_context.actions
        if field_of(llm_response, "partial"):
            state = self._calls.top(id(key))
            if state is not None:
                with guarded("the Google ADK plugin's stream chunk", state.open.lost):
                    state.streamed = True
                    state.logprobs.extend(_logprobs(llm_response))
            return None
        state = self._calls.pop(id(key))
        if state is None:
            return None
        state.done = True
        _current_call.set(None)
        with guarded("the Google ADK plugin's response", state.open.lost):
            _finish(state, llm_response)
        return None

    @_guarded
    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> LlmResponse | None:
        state = self._calls.pop(id(callback_context.actions))
        if state is not None:
            state.done = True
            _current_call.set(None)
            state.open.raised(error)
        return None

    @_guarded
    async def on_event_callback(
        self, *, invocation_context: InvocationContext, event: Event
    ) -> Event | None:
        # A model call's response reaches after_model_callback before ADK turns it into an
        # event. A final event of a call still open means a callback answered in the model's
        # place: the model was never called.
        if not field_of(event, "partial"):
            state = self._calls.pop(id(field_of(event, "actions")))
            if state is not None:
                state.done = True
                state.open.discard()
        return None

    # -- agent and tool steps --------------------------------------------------------------

    @_guarded
    async def before_agent_callback(
        self, *, agent: BaseAgent, callback_context: CallbackContext
    ) -> types.Content | None:
        name = str(field_of(agent, "name") or type(agent).__name__)
        invocation_id = callback_context.invocation_id
        span = step_span(
            "invoke_agent",
            name,
            FRAMEWORK,
            attributes={"gen_ai.agent.description": field_of(agent, "description") or None},
        )
        self._agents.push((invocation_id, name), _Step(span, invocation_id, None))
        return None

    @_guarded
    async def after_agent_callback(
        self, *, agent: BaseAgent, callback_context: CallbackContext
    ) -> types.Content | None:
        self._end_agent(callback_context.invocation_id, agent, None)
        return None

    @_guarded
    async def on_agent_error_callback(
        self, *, agent: BaseAgent, callback_context: CallbackContext, error: Exception
    ) -> None:
        self._end_agent(callback_context.invocation_id, agent, error)

    @_guarded
    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        invocation_id = tool_context.invocation_id
        span = step_span(
            "execute_tool",
            str(field_of(tool, "name") or type(tool).__name__),
            FRAMEWORK,
            parent=self._agent_span(invocation_id, tool_context.agent_name),
            attributes={
                "gen_ai.tool.call.id": field_of(tool_context, "function_call_id") or None,
                "gen_ai.tool.description": field_of(tool, "description") or None,
            },
        )
        self._tools.push(id(tool_context), _Step(span, invocation_id, tool_context))
        return None

    @_guarded
    async def after_tool_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        step = self._tools.pop(id(tool_context))
        if step is not None:
            end_span(step.span)
        return None

    @_guarded
    async def on_tool_error_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        error: Exception,
    ) -> dict[str, Any] | None:
        step = self._tools.pop(id(tool_context))
        if step is not None:
            end_span(step.span, error)
        return None

    # -- the end of a run ------------------------------------------------------------------

    @_guarded
    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        self._close_invocation(invocation_context.invocation_id, None)

    @_guarded
    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        self._close_invocation(invocation_context.invocation_id, error)

    # -- helpers ---------------------------------------------------------------------------

    def _agent_span(self, invocation_id: str, agent_name: str) -> Span | None:
        step = self._agents.top((invocation_id, agent_name))
        return step.span if step is not None else None

    def _end_agent(self, invocation_id: str, agent: object, error: BaseException | None) -> None:
        name = str(field_of(agent, "name") or type(agent).__name__)
        step = self._agents.pop((invocation_id, name))
        if step is not None:
            end_span(step.span, error)

    def _close_invocation(self, invocation_id: str, error: BaseException | None) -> None:
        """End what the run left open: agents that ended the invocation early, tool steps that
        raised, and model calls answered by a callback that produced no event."""
        calls = self._calls.remove(lambda s: s.invocation_id == invocation_id)
        tools = self._tools.remove(lambda s: s.invocation_id == invocation_id)
        steps = self._agents.remove(lambda s: s.invocation_id == invocation_id)
        for state in calls:
            state.done = True
            if error is not None:
                state.open.raised(error)
            else:
                state.open.discard()
        for step in [*tools, *steps]:
            end_span(step.span, error)


def _finish(state: _ModelCall, response: Any) -> None:
    # The model may have added to the request (ADK appends a user turn when needed).
    with guarded("re-reading an ADK request after its model call"):
        state.open.call.messages = request_messages(state.request)
    message = response_message(response)
    logprobs = _logprobs(response) or state.logprobs
    ids: list[int] = [e["token_id"] for e in logprobs if isinstance(e.get("token_id"), int)]
    state.open.finish(
        [
            choice_record(
                message,
                finish_reason=_finish_reason(response, message),
                logprobs=logprobs or None,
                token_ids=ids if ids and len(ids) == len(logprobs) else None,
            )
        ],
        usage=_usage(field_of(response, "usage_metadata")),
        response_id=state.response_id,
        response_model=field_of(response, "model_version"),
        streamed=state.streamed,
    )


# -- LlmRequest / LlmResponse to OpenAI form -------------------------------------------------


def request_messages(llm_request: Any) -> list[dict[str, Any]]:
    """The messages of an ADK ``LlmRequest`` in OpenAI Chat Completions form, as LiteLLM sends
    them: the system instruction first, then each content (``model`` turns as assistant
    messages with ``tool_calls``, function responses as ``tool`` messages with their
    ``tool_call_id``, other user parts as a user message)."""
    messages: list[dict[str, Any]] = []
    system = _system_text(field_of(field_of(llm_request, "config"), "system_instruction"))
    if system:
        messages.append({"role": "system", "content": system})
    for content in field_of(llm_request, "contents") or ():
        messages.extend(_content_messages(content))
    return messages


def request_tools(llm_request: Any) -> list[dict[str, Any]] | None:
    """The function declarations of an ADK ``LlmRequest`` as OpenAI ``tools``."""
    tools: list[dict[str, Any]] = []
    for tool in field_of(field_of(llm_request, "config"), "tools") or ():
        for declaration in field_of(tool, "function_declarations") or ():
            tools.append(_tool_param(declaration))
    return tools or None


def response_message(llm_response: Any) -> dict[str, Any]:
    """An ADK ``LlmResponse`` as the OpenAI assistant message the server returned."""
    content = field_of(llm_response, "content")
    message = _assistant_message(field_of(content, "parts") or ()) if content is not None else None
    if message is None:
        return {"role": "assistant", "content": ""}
    return message


def _content_messages(content: Any) -> list[dict[str, Any]]:
    parts = list(field_of(content, "parts") or ())
    if not parts:
        return []
    role = field_of(content, "role")
    if role in ("model", "assistant"):
        message = _assistant_message(parts)
        return [message] if message is not None else []
    tool_messages = [
        _tool_message(field_of(p, "function_response"))
        for p in parts
        if field_of(p, "function_response") is not None
    ]
    others = [
        p for p in parts if field_of(p, "function_response") is None and not field_of(p, "thought")
    ]
    user = _user_content(others)
    return tool_messages + ([{"role": "user", "content": user}] if user is not None else [])


def _assistant_message(parts: Sequence[Any]) -> dict[str, Any] | None:
    texts: list[str] = []
    thoughts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for part in parts:
        call = field_of(part, "function_call")
        text = field_of(part, "text")
        if call is not None:
            tool_calls.append(
                tool_call(
                    field_of(call, "id") or "", field_of(call, "name"), field_of(call, "args")
                )
            )
        elif text:
            (thoughts if field_of(part, "thought") else texts).append(str(text))
    if not (texts or thoughts or tool_calls):
        return None
    message: dict[str, Any] = {"role": "assistant"}
    if texts:
        message["content"] = "\n".join(texts)
    if tool_calls:
        message["tool_calls"] = tool_calls
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    return message


def _tool_message(response: Any) -> dict[str, Any]:
    value = field_of(response, "response")
    return {
        "role": "tool",
        "tool_call_id": field_of(response, "id") or "",
        "content": value if isinstance(value, str) else json_text(value),
    }


def _user_content(parts: Sequence[Any]) -> str | list[dict[str, Any]] | None:
    if len(parts) == 1 and field_of(parts[0], "text"):
        return str(field_of(parts[0], "text"))
    content = [c for c in (_content_part(p) for p in parts) if c is not None]
    return content or None


def _content_part(part: Any) -> dict[str, Any] | None:
    text = field_of(part, "text")
    if text:
        return {"type": "text", "text": str(text)}
    blob = field_of(part, "inline_data")
    if blob is not None and field_of(blob, "data"):
        mime = str(field_of(blob, "mime_type") or "application/octet-stream")
        data = field_of(blob, "data")
        raw = data if isinstance(data, bytes) else str(data).encode()
        if mime.startswith("text/"):
            return {"type": "text", "text": raw.decode("utf-8", "replace")}
        encoded = base64.b64encode(raw).decode()
        if mime.startswith("audio/"):
            return {
                "type": "input_audio",
                "input_audio": {"data": encoded, "format": mime.split("/", 1)[1]},
            }
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{encoded}"}}
        return {"type": "file", "file": {"file_data": f"data:{mime};base64,{encoded}"}}
    file = field_of(part, "file_data")
    if file is not None and field_of(file, "file_uri"):
        uri, mime = str(field_of(file, "file_uri")), str(field_of(file, "mime_type") or "")
        if mime.startswith("image/") or not mime:
            return {"type": "image_url", "image_url": {"url": uri}}
        return {"type": "file", "file": {"file_id": uri}}
    return None


def _system_text(instruction: Any) -> str | None:
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction
    parts = field_of(instruction, "parts")
    if parts is None:
        parts = instruction if isinstance(instruction, list) else [instruction]
    texts = [p if isinstance(p, str) else field_of(p, "text") for p in parts]
    return "\n".join(str(t) for t in texts if t) or None


def _tool_param(declaration: Any) -> dict[str, Any]:
    schema = field_of(declaration, "parameters_json_schema")
    parameters = None
    if schema is not None:
        parameters = json.loads(json_text(schema))
    elif (declared := field_of(declaration, "parameters")) is not None:
        parameters = (
            declared.json_schema.model_dump(mode="json", exclude_none=True)
            if isinstance(declared, types.Schema)
            else json.loads(json_text(declared))
        )
        parameters.setdefault("type", "object")
        parameters.setdefault("properties", {})
    return function_tool(
        field_of(declaration, "name"), field_of(declaration, "description"), parameters
    )


def _request_params(llm_request: Any) -> dict[str, Any]:
    config = field_of(llm_request, "config")
    params = {name: field_of(config, key) for key, name in _PARAMS.items()}
    return {k: v for k, v in params.items() if v is not None}


def _logprobs(response: Any) -> list[dict[str, Any]]:
    """Gemini's per-token logprobs (``response_logprobs=True``), in OpenAI form; LiteLLM's
    responses carry none."""
    result = field_of(response, "logprobs_result")
    chosen = list(field_of(result, "chosen_candidates") or ())
    top = list(field_of(result, "top_candidates") or ())
    entries = []
    for i, candidate in enumerate(chosen):
        alternatives = field_of(top[i], "candidates") or () if i < len(top) else ()
        entry = token_logprob(*_token(candidate), [_token(a) for a in alternatives])
        entries.append({**entry, "token_id": field_of(candidate, "token_id")})
    return entries


def _token(candidate: Any) -> tuple[str, float]:
    return field_of(candidate, "token") or "", float(field_of(candidate, "log_probability") or 0.0)


def _finish_reason(response: Any, message: Mapping[str, Any]) -> str:
    reason = field_of(response, "finish_reason")
    name = str(getattr(reason, "name", reason or ""))
    if name in _FINISH_REASONS:
        return _FINISH_REASONS[name]
    return "tool_calls" if message.get("tool_calls") else "stop"


def _usage(counts: Any) -> dict[str, int] | None:
    return usage(
        field_of(counts, "prompt_token_count"),
        field_of(counts, "candidates_token_count"),
        field_of(counts, "total_token_count"),
    )


def _served_model(model: str) -> str:
    """The model name the server sees: LiteLLM strips its provider prefix (``openai/``)."""
    prefix, _, rest = model.partition("/")
    if not rest or _LITE_LLM not in sys.modules:
        return model
    try:  # ADK imports LiteLLM on its adapter's first call, which comes right after this one
        from litellm import provider_list
    except ImportError:
        return model
    return rest if prefix in provider_list else model


# -- install / uninstall ---------------------------------------------------------------------
# Each wrapper is marked as arttrace's (capture._unwrap): install wraps unless arttrace's wrapper
# is outermost already, uninstall splices it out wherever it sits, so another library's
# wrappers, inside or outside it, stay; one that cannot be spliced out passes calls through.

_installed = False
_install_lock = threading.Lock()
_added: weakref.WeakKeyDictionary[PluginManager, ArttracePlugin] = weakref.WeakKeyDictionary()
_LITE_LLM = "google.adk.models.lite_llm"


def install() -> None:
    """Give every ADK ``Runner`` an :class:`ArttracePlugin` when it runs (unless it has one),
    and read the server's completion id below ADK's LiteLLM model so each call pairs with the
    OpenAI shim's record of it. Idempotent; :func:`arttrace.instrument` calls it."""
    global _installed
    from google.adk.runners import Runner

    with _install_lock:
        if _installed:
            return
        _installed = True
        _wrap(Runner, "run_async", _run_async)
    when_imported(_LITE_LLM, _hook_lite_llm)  # at once if imported (importing it is slow)


def uninstall() -> None:
    """Undo :func:`install` (idempotent): remove the plugins it added and arttrace's wrappers,
    and nothing else. Plugins you registered yourself and other libraries' wrappers stay."""
    global _installed
    with _install_lock:
        if not _installed:
            return
        _installed = False
        runners = sys.modules.get("google.adk.runners")
        if runners is not None:
            unwrap(runners.Runner, "run_async")
        lite_llm = sys.modules.get(_LITE_LLM)
        if lite_llm is not None:
            unwrap(lite_llm.LiteLLMClient, "acompletion")
        added = list(_added.items())
        _added.clear()
    for manager, plugin in added:  # new lists: runs in flight keep iterating the old ones
        manager.plugins = [p for p in manager.plugins if p is not plugin]


def _wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> None:
    if not ours(owner.__dict__.get(name)):
        wrapt.wrap_function_wrapper(owner, name, mark(wrapper))


def _run_async(
    wrapped: Callable[..., Any], instance: Runner, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if _installed:
        manager = getattr(instance, "plugin_manager", None)
        if manager is not None:
            with _install_lock:
                if not any(isinstance(p, ArttracePlugin) for p in manager.plugins):
                    plugin = ArttracePlugin()
                    # First, so no plugin can hide a call from it; a new list, so a run
                    # iterating the old one in flight sees no shift.
                    manager.plugins = [plugin, *manager.plugins]
                    _added[manager] = plugin
    return wrapped(*args, **kwargs)


def _hook_lite_llm(module: Any) -> None:
    with _install_lock:
        if _installed:
            _wrap(module.LiteLLMClient, "acompletion", _acompletion)


async def _acompletion(
    wrapped: Callable[..., Awaitable[Any]],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    response = await wrapped(*args, **kwargs)
    state = _current_call.get()
    if not _installed or state is None or state.done or state.response_id is not None:
        return response
    if kwargs.get("stream"):
        return _IdStream(response, state)
    with guarded("reading LiteLLM's completion id"):
        _read_id(state, response)
    return response


def _read_id(state: _ModelCall, response: Any) -> None:
    response_id = getattr(response, "id", None)
    if isinstance(response_id, str):
        state.response_id = response_id


class _IdStream(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """LiteLLM's stream, unchanged, reading the completion id off its first chunk."""

    def __init__(self, stream: Any, state: _ModelCall) -> None:
        super().__init__(stream)
        self._self_state = state

    def __aiter__(self) -> _IdStream:
        return self

    async def __anext__(self) -> Any:
        chunk = await self.__wrapped__.__anext__()
        state = self._self_state
        if state.response_id is None and not state.done:
            with guarded("reading LiteLLM's completion id"):
                _read_id(state, chunk)
        return chunk
