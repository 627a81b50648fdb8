"""A scripted model that answers Chat Completions requests the way vLLM does.

It returns logprobs with ``token_id:<int>`` tokens (vLLM's ``--return-tokens-as-token-ids``),
``prompt_token_ids`` and per-choice ``token_ids`` when asked with ``return_token_ids``, streams
one token per chunk (tool-call deltas as vLLM's hermes parser shapes them), honours ``n``,
``logprobs``, ``top_logprobs`` and ``stream_options.include_usage``, and can misbehave on
purpose (no logprobs, no token ids, a stream cut short).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .tokenizers import ChatTokenizer, SimpleChatTokenizer


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model says: text, tool calls, or both."""

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    finish_reason: str | None = None
    """Default: ``"tool_calls"`` when there are tool calls, else ``"stop"``."""


Responder = Callable[[dict[str, Any]], "Reply | str | Sequence[Reply | str]"]


def echo(request: dict[str, Any]) -> Reply:
    """The default responder: repeats the last user message."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    text = users[-1].get("content") if users else ""
    return Reply(f"You said: {text}")


class ScriptedLLM:
    """The scripted model behind :func:`arttrace.testing.serve` and :meth:`transport`.

    ``replies``: a list consumed one request at a time (an item may be a list for ``n > 1``), or
    a function of the request body; default :func:`echo`. ``logprobs`` / ``token_ids``: set to
    ``False`` to play a server that never returns them. ``tokens_as_ids``: logprob tokens as
    ``token_id:<int>`` (default) or as text. ``cut_stream_after``: streams stop, as a dropped
    connection, after that many chunks.
    """

    def __init__(
        self,
        replies: Responder | Sequence[Reply | str | Sequence[Reply | str]] | None = None,
        *,
        tokenizer: ChatTokenizer | None = None,
        logprobs: bool = True,
        token_ids: bool = True,
        tokens_as_ids: bool = True,
        cut_stream_after: int | None = None,
        seed: int = 0,
    ) -> None:
        if replies is None:
            self._responder: Responder = echo
        elif callable(replies):
            self._responder = replies
        else:
            script = list(replies)
            self._responder = lambda request: self._next_scripted(script, request)
        self.tokenizer: ChatTokenizer = tokenizer or SimpleChatTokenizer()
        self.logprobs, self.token_ids, self.tokens_as_ids = logprobs, token_ids, tokens_as_ids
        self.cut_stream_after = cut_stream_after
        self.seed = seed
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _next_scripted(self, script: list[Any], request: dict[str, Any]) -> Any:
        if not script:
            raise ScriptExhausted(
                f"ScriptedLLM has no reply left for request #{len(self.requests)}; "
                "give it more replies or a responder function"
            )
        return script.pop(0)

    # -- the HTTP face ---------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """An httpx handler: use with ``httpx.MockTransport`` or as a respx ``side_effect``."""
        if request.method == "GET" and request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        status, body, chunks = self.respond(json.loads(request.read() or b"{}"))
        if chunks is None:
            return httpx.Response(status, json=body)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_EventStream(chunks)
        )

    def transport(self) -> httpx.MockTransport:
        """In-process: ``OpenAI(http_client=httpx.Client(transport=llm.transport()))``."""
        return httpx.MockTransport(self.handle)

    def respond(
        self, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | None, Iterator[bytes] | None]:
        """``(status, json_body, None)``, or ``(200, None, sse_chunks)`` for a stream."""
        with self._lock:
            self.requests.append(body)
            number = next(self._ids)
        try:
            replies = self._replies(body)
        except ScriptExhausted as error:
            return 500, {"error": {"message": str(error), "type": "script_exhausted"}}, None
        if not isinstance(body.get("messages"), list) or not body.get("model"):
            return 400, {"error": {"message": "model and messages are required"}}, None
        response = self._response(body, replies, number)
        if body.get("stream"):
            return 200, None, self._stream(body, response)
        return 200, response["json"], None

    # -- building responses ----------------------------------------------------------------

    def _replies(self, body: dict[str, Any]) -> list[Reply]:
        n = int(body.get("n") or 1)
        out = self._responder(body)
        items = [out] if isinstance(out, Reply | str) else list(out)
        replies = [Reply(r) if isinstance(r, str) else r for r in items]
        return (replies * n)[:n] if len(replies) < n else replies[:n]

    def _response(self, body: dict[str, Any], replies: list[Reply], number: int) -> dict[str, Any]:
        messages, tools = body["messages"], body.get("tools")
        want_ids = bool(body.get("return_token_ids")) and self.token_ids
        want_logprobs = bool(body.get("logprobs")) and self.logprobs
        top = int(body.get("top_logprobs") or 0)
        prompt = self.tokenizer.prompt(messages, tools)
        choices, plans = [], []
        for index, reply in enumerate(replies):
            message = _message(reply, number, index)
            completion = self.tokenizer.completion(messages, tools, message)
            logprobs = [
                self._logprob(number, index, pos, tid)
                for pos, tid in enumerate(completion.token_ids)
            ]
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": {
                    "content": [
                        self._entry(t, lp, top)
                        for t, lp in zip(completion.token_ids, logprobs, strict=True)
                    ]
                }
                if want_logprobs
                else None,
                "finish_reason": reply.finish_reason
                or ("tool_calls" if reply.tool_calls else "stop"),
                "stop_reason": None,
            }
            if want_ids:
                choice["token_ids"] = completion.token_ids
            choices.append(choice)
            plans.append((completion, logprobs))
        completion_tokens = sum(len(c.token_ids) for c, _ in plans)
        payload = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
            },
            "prompt_token_ids": prompt if want_ids else None,
        }
        return {
            "json": payload,
            "plans": plans,
            "top": top,
            "want_ids": want_ids,
            "want_logprobs": want_logprobs,
        }

    def _logprob(self, number: int, index: int, position: int, token_id: int) -> float:
        h = zlib.crc32(f"{self.seed}:{number}:{index}:{position}:{token_id}".encode())
        return -round(((h % 10_000) / 10_000) ** 2 * 3 + 1e-4, 6)

    def _entry(self, token_id: int, logprob: float, top: int) -> dict[str, Any]:
        text = self.tokenizer.text(token_id)
        token = f"token_id:{token_id}" if self.tokens_as_ids else text
        alternatives = [{"token": token, "logprob": logprob, "bytes": list(text.encode())}]
        alternatives += [
            {
                "token": f"token_id:{token_id + k}" if self.tokens_as_ids else f"{text}~{k}",
                "logprob": logprob - k,
                "bytes": None,
            }
            for k in range(1, top)
        ]
        return {
            "token": token,
            "logprob": logprob,
            "bytes": list(text.encode()),
            "top_logprobs": alternatives[:top],
        }

    def _stream(self, body: dict[str, Any], response: dict[str, Any]) -> Iterator[bytes]:
        payload = response["json"]
        head = {
            "id": payload["id"],
            "object": "chat.completion.chunk",
            "created": payload["created"],
            "model": payload["model"],
        }
        chunks: list[dict[str, Any]] = []
        for choice, (completion, logprobs) in zip(
            payload["choices"], response["plans"], strict=True
        ):
            first = {
                **head,
                "choices": [
                    {
                        "index": choice["index"],
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if response["want_ids"]:
                first["prompt_token_ids"] = payload["prompt_token_ids"]
            chunks.append(first)
            deltas = _deltas(choice["message"], completion, self.tokenizer)
            last = len(completion.token_ids) - 1
            for pos, (token_id, delta) in enumerate(zip(completion.token_ids, deltas, strict=True)):
                part: dict[str, Any] = {
                    "index": choice["index"],
                    "delta": delta,
                    "logprobs": {"content": [self._entry(token_id, logprobs[pos], response["top"])]}
                    if response["want_logprobs"]
                    else None,
                    "finish_reason": choice["finish_reason"] if pos == last else None,
                }
                if response["want_ids"]:
                    part["token_ids"] = [token_id]
                chunks.append({**head, "choices": [part]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": payload["usage"]})
        lines = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        if self.cut_stream_after is not None:
            return _cut(lines[: self.cut_stream_after])
        return iter(lines)


class ScriptExhausted(Exception):
    """The script has no reply left."""


class StreamCut(Exception):
    """Raised inside a stream body to drop the connection mid-response."""


def _cut(lines: list[bytes]) -> Iterator[bytes]:
    yield from lines
    raise StreamCut


def _message(reply: Reply, number: int, index: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": tc.id or f"call_{number}_{index}_{k}",
                "type": "function",
                "function": {
                    "name": tc.name,
                    "arguments": tc.arguments
                    if isinstance(tc.arguments, str)
                    else json.dumps(tc.arguments),
                },
            }
            for k, tc in enumerate(reply.tool_calls)
        ]
    return message


def _deltas(
    message: dict[str, Any], completion: Any, tokenizer: ChatTokenizer
) -> list[dict[str, Any]]:
    """One delta per sampled token: content pieces, then tool calls (name first, then the
    arguments spread over the call's tokens), then an empty delta for the end token."""
    ids = completion.token_ids
    content = message.get("content") or ""
    pieces = [tokenizer.text(t) for t in ids[: completion.content_tokens]]
    if "".join(pieces) != content:  # tokenizer text is not exact: spread the string instead
        pieces = _spread(content, completion.content_tokens)
    deltas: list[dict[str, Any]] = [{"content": p} for p in pieces]
    for k, (tool_call, count) in enumerate(
        zip(message.get("tool_calls") or (), completion.tool_call_tokens, strict=True)
    ):
        arguments = _spread(tool_call["function"]["arguments"], max(count - 1, 1))
        head = {
            "index": k,
            "id": tool_call["id"],
            "type": "function",
            "function": {
                "name": tool_call["function"]["name"],
                "arguments": "" if count > 1 else arguments[0],
            },
        }
        deltas.append({"content": None, "tool_calls": [head]})
        deltas += [
            {"content": None, "tool_calls": [{"index": k, "function": {"arguments": a}}]}
            for a in arguments[: count - 1]
        ]
    deltas += [{} for _ in range(len(ids) - len(deltas))]
    return deltas


def _spread(text: str, parts: int) -> list[str]:
    size = -(-len(text) // parts) if parts else len(text)
    out = [text[i * size : (i + 1) * size] for i in range(parts)]
    return out if parts else [text]


class _EventStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """An SSE body for httpx that can fail mid-way like a dropped connection."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        except StreamCut:
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            ) from None

    async def __aiter__(self) -> Any:
        for chunk in self:
            yield chunk
