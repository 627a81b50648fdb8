"""Anthropic Messages, served through the upstream's Chat Completions (opt-in).

vLLM's own ``/v1/messages`` returns no token ids or logprobs, so an agent speaking Messages (a
CLI coding harness, the ``anthropic`` SDK) cannot train through it. :class:`MessagesTranslation`
makes each Messages call a Chat Completions call, which the caller records with exact tokens,
and answers in Messages, whole or as the events the ``anthropic`` SDK reads.

The request is built as vLLM's own Messages server builds its chat request (the same system
text, messages, tools and sampling), so a model sees the same prompt through either route.
Choices made where Messages and Chat Completions differ (``docs/translation.md``):

- An earlier assistant turn's ``thinking`` goes back as the message's ``reasoning`` (the field
  vLLM reads and hands to the chat template as ``reasoning_content``); ``redacted_thinking``
  is opaque and dropped.
- ``thinking`` (the request's budget), ``metadata``, ``cache_control``, ``service_tier``,
  ``context_management`` and the like have no Chat Completions counterpart and are dropped;
  a reasoning model thinks as its chat template and the server's reasoning parser say
  (``chat_template_kwargs`` passes through).
- A tool result's ``is_error`` is not marked in the prompt (vLLM's Messages server does not
  either): its text says what failed.
- Anthropic's server tools (web search, code execution, ...), its schema-less client tools
  (``bash_...``, ``text_editor_...``, ``computer_...``), MCP servers, containers and Files API
  references need Anthropic's servers: :class:`TranslationError`.
- Tool arguments that are not a JSON object (malformed, or cut by ``max_tokens``) reach the
  agent as ``input: {}`` with a warning in the log, so the agent's own validation answers the
  model; the turn is recorded as the model sampled it.
- A thinking block is signed ``"arttrace"``: the SDK requires a signature, and nothing checks it.
- A streamed tool call's arguments come in one ``input_json_delta`` when its block closes
  (checked first, so the SDK never meets JSON it cannot parse); text and thinking stream as
  they are sampled.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import orjson

from ._base import TranslationError, upstream_error

__all__ = ["MessagesTranslation", "error_body"]

_log = logging.getLogger("arttrace")

SIGNATURE = "arttrace"
"""The signature of every thinking block (the SDK's ``ThinkingBlock`` requires one)."""

_PASSED = ("temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty")
"""Sampling fields copied as they are (``top_k`` and the last three are vLLM extensions, which
the ``anthropic`` SDK sends through ``extra_body``)."""
_SERVER_ONLY = ("mcp_servers", "container")
"""Request fields that need Anthropic's servers (``context_management``, which clears old
tool results server-side, is dropped: the prompt is then longer, not wrong)."""
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error type for an upstream status (other 4xx: ``invalid_request_error``, other
5xx: ``api_error``)."""


def error_body(status: int, message: str) -> bytes:
    """Anthropic's error body for an HTTP ``status``: ``{"type": "error", "error": {"type":
    ..., "message": message}}``, the type the SDK maps to its exception (429:
    ``rate_limit_error``, 503 and 529: ``overloaded_error``, ...)."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


class MessagesTranslation:
    """One Anthropic Messages call, made as a Chat Completions call.

    ``body`` is the agent's Messages request JSON. Raises :class:`TranslationError` for what
    Chat Completions cannot express.
    """

    api = "messages"

    def __init__(self, body: dict[str, Any]) -> None:
        if not isinstance(body, dict):
            raise TranslationError("a Messages request body is a JSON object")
        self.model = _required(body, "model", str)
        self.stream = bool(body.get("stream"))
        self._stops = [s for s in body.get("stop_sequences") or () if isinstance(s, str)]
        self.upstream_body = _chat_request(body, self.stream)
        # the stream's state
        self._started = self._done = False
        self._blocks = 0
        self._open: str | None = None  # "thinking", "text", "tool_use"
        self._calls: dict[int, _ToolCall] = {}
        self._open_call: _ToolCall | None = None
        self._finish: str | None = None
        self._matched: Any = None
        self._usage: dict[str, Any] | None = None
        self._prompt_tokens = 0
        self._sampled = 0

    # -- whole ---------------------------------------------------------------------------

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The Messages ``Message`` for the upstream's whole Chat Completion ``chat``."""
        choices = chat.get("choices") or [{}]
        choice = choices[0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        reasoning = _reasoning(message)
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": SIGNATURE})
        if isinstance(message.get("content"), str) and message["content"]:
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            name = function.get("name") or ""
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or _tool_id(),
                    "name": name,
                    "input": _tool_input(function.get("arguments"), name),
                }
            )
        reason, sequence = self._stop_reason(
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            any(b["type"] == "tool_use" for b in content),
        )
        return {
            "id": _message_id(chat.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chat.get("model") or self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(chat.get("usage") or {}, None, None),
        }

    # -- streamed ------------------------------------------------------------------------

    def start(self) -> bytes:
        """Nothing: ``message_start`` goes with the first upstream chunk, which carries the
        prompt's size and the upstream's id."""
        return b""

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        """The Messages events for one upstream ``ChatCompletionChunk``."""
        if self._done:
            return b""
        out: list[bytes] = []
        if not self._started:
            self._message_start(chunk, out)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        choices = chunk.get("choices") or ()
        for choice in choices:
            if choice.get("index"):
                continue  # Messages has one answer; the request never asks for more
            ids = choice.get("token_ids")
            if ids:
                self._sampled += len(ids)
            delta = choice.get("delta") or {}
            reasoning = _reasoning(delta)
            if reasoning:
                self._switch("thinking", out)
                out.append(_delta(self._blocks, {"type": "thinking_delta", "thinking": reasoning}))
            text = delta.get("content")
            if text:
                self._switch("text", out)
                out.append(_delta(self._blocks, {"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or ():
                self._tool_delta(call, out)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
                self._close(out)
        if not choices and self._finish is not None and self._usage is not None:
            self._message_end(out)  # the usage chunk after the finish: the caller's end
        return b"".join(out)

    def end(self) -> bytes:
        """The closing events, unless the usage chunk already sent them."""
        if self._done:
            return b""
        out: list[bytes] = []
        if not self._started:
            self._message_start({}, out)
        self._message_end(out)
        return b"".join(out)

    def error(self, status: int, body: bytes) -> bytes:
        """Anthropic's error body for an upstream error (an ``error`` event when streaming)."""
        message = upstream_error(status, body)[0]
        if self.stream:
            self._done = True
            return b"event: error\ndata: " + error_body(status, message) + b"\n\n"
        return error_body(status, message)

    # -- the stream's blocks -------------------------------------------------------------

    def _message_start(self, chunk: dict[str, Any], out: list[bytes]) -> None:
        self._started = True
        prompt = chunk.get("prompt_token_ids")
        usage = chunk.get("usage") or {}
        self._prompt_tokens = len(prompt) if prompt else int(usage.get("prompt_tokens") or 0)
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model") or self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self._prompt_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        out.append(_event("message_start", {"type": "message_start", "message": message}))
        out.append(b'event: ping\ndata: {"type":"ping"}\n\n')

    def _switch(self, kind: str, out: list[bytes]) -> None:
        """Open a ``kind`` block unless one is open (closing the open one of another kind)."""
        if self._open == kind:
            return
        self._close(out)
        block: dict[str, Any] = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        self._begin(kind, block, out)

    def _begin(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        self._open = kind
        out.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self._blocks, "content_block": block},
            )
        )

    def _tool_delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        """A tool call's piece: its block opens once its name is known; its arguments are
        kept until it closes, then sent whole if they parse (see the module's note)."""
        index = int(delta.get("index") or 0)
        function = delta.get("function") or {}
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _ToolCall(delta.get("id") or _tool_id())
        if call.closed:
            _log.warning(
                "arttrace: the upstream streamed more of tool call %d after the next one "
                "began; a Messages stream cannot reopen its block, so this piece is left out "
                "of the agent's tool_use (the recorded call keeps it)",
                index,
            )
            return
        if function.get("name") and not call.name:
            call.name = function["name"]
        if function.get("arguments"):
            call.arguments.append(function["arguments"])
        if not call.opened and call.name:
            self._close(out)
            call.opened = True
            self._open_call = call
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            self._begin("tool_use", block, out)

    def _close(self, out: list[bytes]) -> None:
        """Close the open block: a thinking block gets its signature, a tool call its
        arguments."""
        if self._open is None:
            return
        if self._open == "thinking":
            out.append(_delta(self._blocks, {"type": "signature_delta", "signature": SIGNATURE}))
        elif self._open == "tool_use" and self._open_call is not None:
            call, self._open_call = self._open_call, None
            call.closed = True
            raw = "".join(call.arguments)
            if _tool_input(raw, call.name):  # an object with keys: what the agent reads
                out.append(_delta(self._blocks, {"type": "input_json_delta", "partial_json": raw}))
        out.append(
            _event("content_block_stop", {"type": "content_block_stop", "index": self._blocks})
        )
        self._open = None
        self._blocks += 1

    def _message_end(self, out: list[bytes]) -> None:
        self._close(out)
        for call in self._calls.values():  # a call whose name never came (no block)
            if not call.opened:
                _log.warning(
                    "arttrace: the upstream streamed a tool call without a name; the agent's "
                    "Messages answer leaves it out (the recorded call keeps it)"
                )
        reason, sequence = self._stop_reason(
            self._finish, self._matched, any(c.opened for c in self._calls.values())
        )
        usage = _usage(self._usage or {}, self._prompt_tokens, self._sampled)
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage,
                },
            )
        )
        out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        self._done = True

    def _stop_reason(self, finish: Any, matched: Any, tools: bool) -> tuple[str, str | None]:
        """Messages' ``stop_reason`` and ``stop_sequence`` for a chat ``finish_reason`` (and
        vLLM's ``stop_reason``: the stop string that matched). A turn with tool calls stops
        for ``tool_use`` even when vLLM says ``stop`` (as it does for a named ``tool_choice``),
        so the agent runs them."""
        if finish == "length":
            return "max_tokens", None
        if tools:
            return "tool_use", None
        if finish == "stop" and isinstance(matched, str) and matched in self._stops:
            return "stop_sequence", matched
        if finish == "content_filter":
            return "refusal", None
        return "end_turn", None


class _ToolCall:
    """A streamed tool call: its id, name and arguments so far, and its block's state."""

    __slots__ = ("arguments", "closed", "id", "name", "opened")

    def __init__(self, id: str) -> None:
        self.id, self.name = id, ""
        self.arguments: list[str] = []
        self.opened = self.closed = False


# -- the request -------------------------------------------------------------------------


def _chat_request(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The Chat Completions body for a Messages request."""
    for key in _SERVER_ONLY:
        if body.get(key):
            raise TranslationError(
                f"{key!r} needs Anthropic's servers, and a translated Messages call is served "
                "by the policy's Chat Completions: leave it out, or turn translation off for "
                "this agent"
            )
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise TranslationError("'messages' must be a list of messages")
    chat: dict[str, Any] = {"model": body["model"], "messages": _chat_messages(body, messages)}
    max_tokens = _required(body, "max_tokens", int)
    chat["max_tokens"] = max_tokens
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    for key in _PASSED:
        if body.get(key) is not None:
            chat[key] = body[key]
    if isinstance(body.get("chat_template_kwargs"), dict):
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    tools = body.get("tools")
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
    choice = body.get("tool_choice")
    if choice:
        _tool_choice(choice, chat)
    elif tools:
        chat["tool_choice"] = "auto"
    config = body.get("output_config") or {}
    schema = (config.get("format") or {}).get("schema")
    if schema is not None:
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    if config.get("effort"):
        chat["reasoning_effort"] = config["effort"]
    last = chat["messages"][-1] if chat["messages"] else {}
    if last.get("role") == "assistant" and last.get("content") and not last.get("tool_calls"):
        # a prefill: the answer continues the assistant's text, as Messages does
        chat["continue_final_message"], chat["add_generation_prompt"] = True, False
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _chat_messages(body: dict[str, Any], messages: list[Any]) -> list[dict[str, Any]]:
    """The chat messages: one system message (the ``system`` field's text and any
    ``system`` role's, joined as vLLM joins them), then each message's blocks."""
    system = [*_system_texts(body.get("system"))]
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "system":
            system += _system_texts(message.get("content"))
    out: list[dict[str, Any]] = [{"role": "system", "content": "".join(system)}] if system else []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            if isinstance(message, dict) and message.get("role") == "system":
                continue
            raise TranslationError(
                f"messages[{number}] must be an object with role 'user' or 'assistant'"
            )
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out += _blocks(message["role"], content, number)
        else:
            raise TranslationError(f"messages[{number}].content must be a string or a list")
    return out


def _system_texts(system: Any) -> list[str]:
    """The system text(s), without Claude Code's per-request billing header (a hash that
    would change every prompt's first tokens, as vLLM's own Messages server drops it)."""
    if isinstance(system, str):
        return [system] if system else []
    texts: list[str] = []
    for block in system or ():
        text = block.get("text") if isinstance(block, dict) else None
        if text and not text.startswith("x-anthropic-billing-header"):
            texts.append(text)
    return texts


def _blocks(role: str, blocks: list[Any], number: int) -> list[dict[str, Any]]:
    """One message's blocks as chat messages: a user's tool results become ``tool``
    messages, all of them first (a chat template expects them right after the assistant's
    calls), then one user message with their images (a tool message carries text only) and
    the rest of its content."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    tools: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []  # the tool results'
    for block in blocks:
        if not isinstance(block, dict):
            raise TranslationError(f"messages[{number}].content holds a non-object block")
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, number)}})
        elif kind == "document":
            parts.append({"type": "text", "text": _document_text(block, number)})
        elif kind == "thinking" and role == "assistant":
            if block.get("thinking"):
                reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            pass  # opaque (encrypted by Anthropic): nothing a policy model can read
        elif kind == "tool_use" and role == "assistant":
            calls.append(
                {
                    "id": block.get("id") or _tool_id(),
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            tool, shown = _tool_result(block, number)
            tools.append(tool)
            images += shown
        else:
            raise TranslationError(
                f"messages[{number}] ({role}) holds a {kind!r} block, which a translated "
                "Messages call cannot send to Chat Completions (Anthropic's server tools and "
                "their results need Anthropic's servers): leave it out, or turn translation "
                "off for this agent"
            )
    message: dict[str, Any] = {"role": role}
    parts = images + parts
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if only_text else parts
    if calls:
        message["tool_calls"] = calls
        message.setdefault("content", None)
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if role == "user" and "content" not in message:
        return tools  # only tool results
    if "content" not in message:
        message["content"] = ""
    return [*tools, message]


def _tool_result(block: dict[str, Any], number: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ``tool_result`` as a ``tool`` message (its text blocks joined by newlines), and its
    images as chat image parts."""
    content = block.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    for item in content if isinstance(content, list) else ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text":
            texts.append(item.get("text") or "")
        elif kind == "image":
            images.append({"type": "image_url", "image_url": {"url": _image_url(item, number)}})
        elif kind == "document":
            texts.append(_document_text(item, number))
        else:
            raise TranslationError(
                f"messages[{number}] holds a tool_result with a {kind!r} block; a translated "
                "call can send text, images and text documents"
            )
    tool = {
        "role": "tool",
        "tool_call_id": block.get("tool_use_id") or "",
        "content": "\n".join(texts),
    }
    return tool, images


def _image_url(block: dict[str, Any], number: int) -> str:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return f"data:{source.get('media_type') or 'image/jpeg'};base64,{source.get('data', '')}"
    if source.get("type") == "url" and source.get("url"):
        return str(source["url"])
    raise TranslationError(
        f"messages[{number}] holds an image from a {source.get('type')!r} source; a translated "
        "call can send base64 and URL images (a Files API id needs Anthropic's servers)"
    )


def _document_text(block: dict[str, Any], number: int) -> str:
    """A text document's text (a PDF needs Anthropic's servers to read it)."""
    source = block.get("source") or {}
    if source.get("type") == "text":
        return str(source.get("data") or "")
    if source.get("type") == "content" and isinstance(source.get("content"), list):
        return "".join(
            b.get("text") or "" for b in source["content"] if isinstance(b, dict) and "text" in b
        )
    raise TranslationError(
        f"messages[{number}] holds a {source.get('type')!r} document; a translated call can "
        "send text documents only: send a PDF's text instead, or turn translation off"
    )


def _chat_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise TranslationError("each of 'tools' must be an object")
    name = tool.get("name")
    if tool.get("type") not in (None, "custom") or "input_schema" not in tool:
        raise TranslationError(
            f"tool {name!r} ({tool.get('type')}) is one of Anthropic's own tools, run or defined "
            "by Anthropic's servers, and a translated Messages call is served by the policy's "
            "Chat Completions: declare it as a custom tool with an input_schema, or turn "
            "translation off for this agent"
        )
    function: dict[str, Any] = {"name": name, "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any], chat: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        raise TranslationError(f"tool_choice type {kind!r} is not one Messages defines")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


# -- the answer ---------------------------------------------------------------------------


def _reasoning(message: dict[str, Any]) -> str | None:
    """A reasoning parser's text: ``reasoning`` (vLLM >= 0.11), else ``reasoning_content``
    (0.10; 0.11-0.14 send both, the same text)."""
    reasoning = message.get("reasoning")
    return reasoning if reasoning is not None else message.get("reasoning_content")


def _tool_input(arguments: Any, name: str) -> dict[str, Any]:
    """A tool call's arguments as Messages' ``input`` (an object): ``{}`` when they are
    empty, or not a JSON object (logged: the agent's validation of ``{}`` answers the
    model)."""
    if not arguments:
        return {}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    _log.warning(
        "arttrace: the model called tool %r with arguments that are not a JSON object "
        "(%.200r); the agent gets input {} (the recorded turn keeps what was sampled)",
        name,
        arguments,
    )
    return {}


def _usage(usage: dict[str, Any], prompt: int | None, sampled: int | None) -> dict[str, Any]:
    """Messages' usage from the chat usage (``prompt`` / ``sampled``: the stream's own
    counts, for an upstream that sent none). Cached prompt tokens are
    ``cache_read_input_tokens``, and not part of ``input_tokens``, as Messages counts them."""
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    total = usage.get("prompt_tokens")
    output = usage.get("completion_tokens")
    return {
        "input_tokens": int(total if total is not None else prompt or 0) - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": int(output if output is not None else sampled or 0),
    }


def _message_id(chat_id: Any) -> str:
    """``msg_`` and the upstream call's id (its ``chatcmpl-`` cut), so the two can be matched."""
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def _required(body: dict[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TranslationError(f"{key!r} is required: a {kind.__name__}")
    return value


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return _event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )
