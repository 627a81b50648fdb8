"""The Responses API served through Chat Completions (see :mod:`._base` for the contract).

A Responses request becomes one Chat Completions request: ``instructions`` the system
message, the ``input`` items chat messages (``function_call`` items the assistant's tool
calls, ``function_call_output`` items tool messages, ``reasoning`` items the assistant's
``reasoning_content``), function tools and ``tool_choice`` in their chat form,
``max_output_tokens`` as ``max_tokens``, ``text.format`` as ``response_format``. What has no
chat form (a built-in tool such as ``web_search``, ``background`` mode, a stored
``prompt`` or ``conversation``) is refused with a :class:`TranslationError` saying so.

The answer comes back as a Responses ``Response`` (a ``reasoning`` item, a ``message`` with
one ``output_text``, one ``function_call`` item per tool call, the usage) or, streamed, as
the ``response.*`` events a Responses server sends, in its order, each with its
``sequence_number``.

``previous_response_id`` chains are kept by arttrace (the upstream's Chat Completions holds
no state): each answered response's conversation (its input and output, as chat messages) is
kept in a bounded, least-recently-used :class:`Chains` store of the gateway or process, and a
request continuing it is sent the whole conversation. An id the store does not hold (evicted,
from another process, or answered with ``store: false``) is a :class:`TranslationError`.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson

from ._base import TranslationError, upstream_error

LOGPROBS_INCLUDE = "message.output_text.logprobs"
CHAINS_ENV = "ARTTRACE_TRANSLATE_CHAINS"
"""How many responses a :class:`Chains` store keeps by default (an environment variable)."""
DEFAULT_CHAINS = 4096

_BUILT_IN = {
    "web_search": "web search",
    "web_search_preview": "web search",
    "file_search": "file search",
    "computer_use_preview": "computer use",
    "computer": "computer use",
    "code_interpreter": "the code interpreter",
    "image_generation": "image generation",
    "mcp": "remote MCP servers",
    "local_shell": "the local shell tool",
    "shell": "the shell tool",
    "apply_patch": "the apply_patch tool",
    "custom": "custom (free-form) tools",
}
"""Tools a Responses server runs itself (or formats itself): Chat Completions has none."""
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "text",
        "previous_response_id",
        "store",
        "stream",
        "stream_options",
        "include",
        "metadata",
        "reasoning",
        "truncation",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "background",
        "conversation",
        "prompt",
        "max_tool_calls",
        "top_logprobs",
        "context_management",
        "enable_response_messages",
    }
)
"""Fields of a Responses request that are not Chat Completions fields (translated or left
out); any other field (``temperature``, ``top_p``, ``user``, a server's own sampling extras
such as vLLM's ``top_k``) goes to the upstream as it is."""


class Chains:
    """Response id -> the conversation it ended (chat messages, its input and its output),
    for ``previous_response_id``: bounded, least recently used first out, thread-safe.

    ``size``: how many responses are kept (default: the ``ARTTRACE_TRANSLATE_CHAINS``
    environment variable, else 4096). Each entry holds references to the messages, which
    the conversation's later entries share, so a long chain costs one list per turn."""

    def __init__(self, size: int | None = None) -> None:
        if size is None:
            size = int(os.environ.get(CHAINS_ENV) or DEFAULT_CHAINS)
        if size < 1:
            raise ValueError(f"a chain store keeps at least 1 response, got {size}")
        self.size = size
        self._kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            messages = self._kept.get(response_id)
            if messages is not None:
                self._kept.move_to_end(response_id)
            return messages

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._kept[response_id] = messages
            self._kept.move_to_end(response_id)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


class ResponsesTranslation:
    """One Responses call, made as a Chat Completions call (see the module doc)."""

    api = "responses"

    def __init__(self, body: dict[str, Any], chains: Chains) -> None:
        self.request = body
        self.chains = chains
        self.stream = bool(body.get("stream"))
        self.id = f"resp_{secrets.token_hex(24)}"
        self.created = int(time.time())
        self._logprobs = LOGPROBS_INCLUDE in (body.get("include") or ())
        self._history = self._conversation(body)
        self.upstream_body = self._chat_body(body, self._history)
        # streaming state
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._model = str(body.get("model", ""))
        self._reasoning = ""
        self._content = ""
        self._logprob_entries: list[dict[str, Any]] = []

    # -- the request -----------------------------------------------------------------------

    def _conversation(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The chat messages of the call, ``instructions`` left out (they are not carried
        along a chain, as on a Responses server)."""
        for name, why in (
            ("background", "background mode (the answer would have to be polled for)"),
            ("conversation", "server-side conversations"),
            ("prompt", "stored prompt templates"),
        ):
            if body.get(name):
                raise TranslationError(_refused(why, name))
        if "input" not in body:
            raise TranslationError("a Responses request needs `input`")
        messages: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous:
            kept = self.chains.get(str(previous))
            if kept is None:
                raise TranslationError(
                    f"previous_response_id {previous!r} is not known to arttrace's translation: "
                    f"it keeps the last {self.chains.size} responses of this gateway or process "
                    f"in memory (set {CHAINS_ENV} to keep more), so this one was evicted, "
                    "answered by another process, or answered with `store: false`. Send the "
                    "whole conversation as `input` instead"
                )
            messages += kept
        skipped: list[str] = []
        messages += [_upstream_message(m) for m in input_messages(body["input"], skipped)]
        if skipped:
            raise TranslationError(
                f"input items of type {', '.join(sorted(set(skipped)))} have no Chat "
                "Completions form (a built-in tool's call or an item_reference, which need "
                "a Responses server's own state); " + _refused("them", "input")
            )
        return messages

    def _chat_body(self, body: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
        chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _RESPONSES_ONLY}
        instructions = body.get("instructions")
        system: list[dict[str, Any]] = []
        if isinstance(instructions, str) and instructions:
            system = [{"role": "system", "content": instructions}]
        elif isinstance(instructions, list):
            system = [_upstream_message(m) for m in input_messages(instructions)]
        chat["messages"] = system + history
        tools = body.get("tools")
        if tools:
            for tool in tools:
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind != "function":
                    what = _BUILT_IN.get(str(kind), f"tools of type {kind!r}")
                    raise TranslationError(
                        f"{what} is a Responses server's built-in tool, which Chat Completions "
                        "does not have; " + _refused("it", "tools")
                    )
            chat["tools"] = chat_tools(tools)
        choice = body.get("tool_choice")
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if body.get("top_logprobs"):
            chat["top_logprobs"] = body["top_logprobs"]
        effort = (body.get("reasoning") or {}).get("effort")
        if effort:
            chat["reasoning_effort"] = effort
        text_format = (body.get("text") or {}).get("format")
        if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
            schema = {k: v for k, v in text_format.items() if k != "type"}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif isinstance(text_format, dict) and text_format.get("type") == "json_object":
            chat["response_format"] = {"type": "json_object"}
        if self.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        return chat

    # -- the whole answer ------------------------------------------------------------------

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        choices = chat.get("choices") or [{}]
        choice = choices[0]
        message = choice.get("message") or {}
        self._model = str(chat.get("model") or self._model)
        self.created = int(chat.get("created") or self.created)
        finish = choice.get("finish_reason")
        incomplete = finish in ("length", "content_filter")
        status = "incomplete" if incomplete else "completed"
        output: list[dict[str, Any]] = []
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:
            output.append(_reasoning_item(_item_id("rs"), reasoning, status))
        entries = ((choice.get("logprobs") or {}).get("content") or []) if self._logprobs else []
        if message.get("content") or message.get("refusal"):
            output.append(
                _message_item(
                    _item_id("msg"),
                    message.get("content") or "",
                    [_logprob(e) for e in entries],
                    status,
                    message.get("refusal"),
                )
            )
        for call in message.get("tool_calls") or ():
            output.append(_call_item(_item_id("fc"), call, "completed"))
        self._keep(output)
        return self._response(status, output, _usage(chat.get("usage")), finish)

    # -- the streamed answer ---------------------------------------------------------------

    def start(self) -> bytes:
        initial = self._response("in_progress", [], None, None)
        return self._event("response.created", response=initial) + self._event(
            "response.in_progress", response=initial
        )

    def chunk(self, chunk: dict[str, Any]) -> bytes:
        out = bytearray()
        if chunk.get("model"):
            self._model = str(chunk["model"])
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # a Responses call samples one answer
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                item = self._opened(out, "reasoning")
                item["text"] += reasoning
                out += self._event(
                    "response.reasoning_text.delta",
                    **_where(item),
                    content_index=0,
                    delta=reasoning,
                )
            entries = (choice.get("logprobs") or {}).get("content") or []
            if self._logprobs:
                self._logprob_entries += entries
            if delta.get("content"):
                item = self._opened(out, "message")
                item["text"] += delta["content"]
                logprobs = [_logprob(e) for e in entries] if self._logprobs else []
                item["logprobs"] += logprobs
                out += self._event(
                    "response.output_text.delta",
                    **_where(item),
                    content_index=0,
                    delta=delta["content"],
                    logprobs=logprobs,
                )
            for tool_call in delta.get("tool_calls") or ():
                out += self._tool_call_delta(tool_call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return bytes(out)

    def _tool_call_delta(self, delta: dict[str, Any]) -> bytes:
        out = bytearray()
        index = int(delta.get("index", 0))
        function = delta.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            item = self._opened(
                out,
                "function_call",
                call_id=delta.get("id") or f"call_{secrets.token_hex(12)}",
                name=function.get("name") or "",
            )
            self._calls[index] = item
        elif function.get("name") and not item["name"]:
            item["name"] = function["name"]
        arguments = function.get("arguments")
        if arguments:
            item["text"] += arguments
            out += self._event(
                "response.function_call_arguments.delta", **_where(item), delta=arguments
            )
        return bytes(out)

    def end(self) -> bytes:
        out = bytearray()
        self._close(out)
        status = "incomplete" if self._finish in ("length", "content_filter") else "completed"
        output = [self._done_item(item, status) for item in self._items]
        self._keep(output)
        response = self._response(status, output, _usage(self._usage), self._finish)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out += self._event(kind, response=response)
        return bytes(out)

    def error(self, status: int, body: bytes) -> bytes:
        message, kind, code = upstream_error(status, body)
        if self.stream:
            return self._event("error", code=code, message=message, param=None)
        return orjson.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}
        )

    # -- streaming helpers -----------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"

    def _opened(self, out: bytearray, kind: str, **extra: Any) -> dict[str, Any]:
        """The open item of ``kind`` (a new one, the open one closed, if another is open)."""
        if self._open is not None and self._open["type"] == kind and kind != "function_call":
            return self._open
        self._close(out)
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item: dict[str, Any] = {
            "type": kind,
            "id": _item_id(prefix),
            "index": len(self._items),
            "text": "",
            "logprobs": [],
            **extra,
        }
        self._items.append(item)
        self._open = item
        added: dict[str, Any]
        if kind == "message":
            added = {
                "id": item["id"],
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        elif kind == "reasoning":
            added = {"id": item["id"], "type": "reasoning", "summary": [], "status": "in_progress"}
        else:
            added = _call_item(item["id"], _as_call(item, ""), "in_progress")
        out += self._event("response.output_item.added", output_index=item["index"], item=added)
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added", **_where(item), content_index=0, part=part
            )
        elif kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            out += self._event(
                "response.content_part.added", **_where(item), content_index=0, part=part
            )
        return item

    def _close(self, out: bytearray) -> None:
        item, self._open = self._open, None
        if item is None:
            return
        where = _where(item)
        if item["type"] == "message":
            text = item["text"]
            out += self._event(
                "response.output_text.done",
                **where,
                content_index=0,
                text=text,
                logprobs=item["logprobs"],
            )
            part = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": item["logprobs"],
            }
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
        elif item["type"] == "reasoning":
            text = item["text"]
            out += self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            part = {"type": "reasoning_text", "text": text}
            out += self._event("response.content_part.done", **where, content_index=0, part=part)
        else:
            out += self._event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["text"],
            )
        done = self._done_item(item, "completed")
        out += self._event("response.output_item.done", output_index=item["index"], item=done)

    def _done_item(self, item: dict[str, Any], status: str) -> dict[str, Any]:
        if item["type"] == "message":
            return _message_item(item["id"], item["text"], item["logprobs"], status, None)
        if item["type"] == "reasoning":
            return _reasoning_item(item["id"], item["text"], status)
        return _call_item(item["id"], _as_call(item, item["text"]), "completed")

    # -- shared ------------------------------------------------------------------------------

    def _keep(self, output: list[dict[str, Any]]) -> None:
        """Keep the conversation this response ends, for a later ``previous_response_id``
        (not with ``store: false``: the caller said it will not continue it)."""
        if self.request.get("store") is False or not output:
            return
        said = _upstream_message(assistant_message(output))
        self.chains.put(self.id, [*self._history, said])

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        finish: str | None,
    ) -> dict[str, Any]:
        body = self.request
        incomplete = None
        if status == "incomplete":
            reason = "content_filter" if finish == "content_filter" else "max_output_tokens"
            incomplete = {"reason": reason}
        text = body.get("text") or {"format": {"type": "text"}}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": self._model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "service_tier": body.get("service_tier") or "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": text,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation") or "disabled",
            "usage": usage,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }


# -- pieces ---------------------------------------------------------------------------------


def input_messages(items: Any, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The capture core's reading of Responses input items (imported when first used: it
    loads the ``openai`` package, which a process translating only Messages may not use)."""
    from ..capture._responses import input_messages as read

    return read(items, skipped)


def assistant_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    from ..capture._responses import assistant_message as read

    return read(items)


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    from ..capture._responses import chat_tools as read

    return read(tools)


def _refused(what: str, field: str) -> str:
    return (
        f"arttrace's translation to Chat Completions cannot serve {what} (`{field}`). Turn "
        "translation off for this run to send the call to the upstream's own Responses API "
        "(its turns then train only where the server sends token ids), or drop it from the "
        "request"
    )


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # "auto", "none", "required"
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else type(choice).__name__
    raise TranslationError(
        f"tool_choice of type {kind!r} has no Chat Completions form; "
        + _refused("it", "tool_choice")
    )


def _upstream_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as the upstream reads it: reasoning as ``reasoning_content`` (the
    field vLLM and chat templates take on input)."""
    if "reasoning" not in message:
        return message
    message = dict(message)
    message["reasoning_content"] = message.pop("reasoning")
    return message


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def _where(item: dict[str, Any]) -> dict[str, Any]:
    return {"item_id": item["id"], "output_index": item["index"]}


def _as_call(item: dict[str, Any], arguments: str) -> dict[str, Any]:
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": arguments},
    }


def _message_item(
    item_id: str,
    text: str,
    logprobs: list[dict[str, Any]],
    status: str,
    refusal: str | None,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text or not refusal:
        content.append(
            {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        )
    if refusal:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _call_item(item_id: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.get("id") or f"call_{secrets.token_hex(12)}",
        "name": function.get("name") or "",
        "arguments": function.get("arguments") or "",
        "status": status,
    }


def _logprob(entry: dict[str, Any]) -> dict[str, Any]:
    token = str(entry.get("token", ""))
    return {
        "token": token,
        "logprob": entry.get("logprob", 0.0),
        "bytes": entry.get("bytes") or list(token.encode()),
        "top_logprobs": [
            {
                "token": t.get("token"),
                "logprob": t.get("logprob"),
                "bytes": t.get("bytes") or list(str(t.get("token", "")).encode()),
            }
            for t in entry.get("top_logprobs") or ()
        ],
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }
