"""A scripted model that answers Chat Completions requests the way vLLM does.

It returns logprobs with ``token_id:<int>`` tokens (vLLM's ``--return-tokens-as-token-ids``),
``prompt_token_ids`` and per-choice ``token_ids`` when asked with ``return_token_ids``, streams
one token per chunk (tool-call deltas as vLLM's hermes parser shapes them: the text before
``<tool_call>`` is the content, its newline kept; held-back tokens arrive as ``delta: {}``
with their ids; ``n > 1`` streams interleave), sends ``stop_reason``, a reasoning parser's
``reasoning``, and logprob ``bytes`` as vLLM does, honours ``n``, ``logprobs``,
``top_logprobs``, ``include_reasoning`` and ``stream_options`` (``include_usage``,
``continuous_usage_stats``), and can misbehave on purpose (no logprobs, no token ids, a stream
cut short, vLLM 0.10.2-0.12.x's lost chunks).
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

from .._tokenizers._chat import ChatTokenizer, SimpleChatTokenizer


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
    reasoning: str | None = None
    """What a reasoning parser would split off: sampled first, as ``<think>...</think>``."""
    stop_reason: int | str | None = None
    """vLLM's ``stop_reason``: the stop token id or string that ended the turn (``None``: the
    end-of-sequence token, or a length limit)."""


Responder = Callable[[dict[str, Any]], "Reply | str | Sequence[Reply | str]"]


def echo(request: dict[str, Any]) -> Reply:
    """The default responder: repeats the last user message."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    text = users[-1].get("content") if users else ""
    return Reply(f"You said: {text}")


Answer = tuple[int, dict[str, Any] | None, Iterator[bytes] | None]
"""An endpoint's answer: ``(status, json_body, None)``, or ``(200, None, sse_chunks)`` for a
stream."""


class Endpoint:
    """What every scripted endpoint keeps: the request bodies it received, each numbered."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        """Every request body received, in order."""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _received(self, body: dict[str, Any]) -> int:
        """Keep ``body``; its number (1, 2, ...)."""
        with self._lock:
            self.requests.append(body)
            return next(self._ids)


class ScriptedLLM(Endpoint):
    """The scripted model behind :func:`arttrace.testing.serve` and :meth:`transport`.

    ``replies``: a list consumed one request at a time (an item may be a list for ``n > 1``), or
    a function of the request body; default :func:`echo`. ``logprobs`` / ``token_ids``: set to
    ``False`` to play a server that never returns them. ``tokens_as_ids``: logprob tokens as
    ``token_id:<int>`` (default) or as text. ``cut_stream_after``: streams stop, as a dropped
    connection, after that many chunks. ``drop_held_back``: play vLLM 0.10.2-0.12.x, whose
    streams lose the chunks a tool or reasoning parser held back (their ids and logprobs
    vanish together; the usage still counts them). ``reasoning_keys``: the message and delta
    fields the reasoning goes in: ``("reasoning",)`` as vLLM >= 0.15,
    ``("reasoning", "reasoning_content")`` as 0.11-0.14, ``("reasoning_content",)`` as 0.10.
    ``force_include_usage``: usage on every chunk and a usage chunk last, asked or not (vLLM's
    ``--enable-force-include-usage``).
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
        drop_held_back: bool = False,
        reasoning_keys: Sequence[str] = ("reasoning",),
        force_include_usage: bool = False,
    ) -> None:
        super().__init__()
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
        self.drop_held_back = drop_held_back
        self.reasoning_keys = tuple(reasoning_keys)
        self.force_include_usage = force_include_usage

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

    def respond(self, body: dict[str, Any]) -> Answer:
        """``(status, json_body, None)``, or ``(200, None, sse_chunks)`` for a stream."""
        number = self._received(body)
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
        # vLLM with a parser (this server always parses tool calls, as hermes does) drops the
        # logprobs and token ids when the request hides the reasoning.
        hidden = body.get("include_reasoning") is False
        ask_ids = bool(body.get("return_token_ids")) and self.token_ids
        want_ids = ask_ids and not hidden
        want_logprobs = bool(body.get("logprobs")) and self.logprobs and not hidden
        top = int(body.get("top_logprobs") or 0)
        prompt = self.tokenizer.prompt(messages, tools)
        choices, plans = [], []
        for index, reply in enumerate(replies):
            message, sample = self._sample(messages, tools, reply, number, index, hidden)
            logprobs = [
                self._logprob(number, index, pos, tid) for pos, tid in enumerate(sample.token_ids)
            ]
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": {
                    "content": [
                        self._entry(t, lp, top)
                        for t, lp in zip(sample.token_ids, logprobs, strict=True)
                    ]
                }
                if want_logprobs
                else None,
                "finish_reason": reply.finish_reason
                or ("tool_calls" if reply.tool_calls else "stop"),
                "stop_reason": reply.stop_reason,
            }
            if want_ids:
                choice["token_ids"] = sample.token_ids
            choices.append(choice)
            plans.append((sample, logprobs))
        completion_tokens = sum(len(sample.token_ids) for sample, _ in plans)
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
            "prompt_token_ids": prompt if ask_ids else None,
        }
        return {
            "json": payload,
            "plans": plans,
            "top": top,
            "want_ids": want_ids,
            "want_logprobs": want_logprobs,
        }

    def _sample(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        reply: Reply,
        number: int,
        index: int,
        hidden: bool,
    ) -> tuple[dict[str, Any], _Sample]:
        """The message vLLM returns for ``reply`` and the tokens it sampled, each with its
        stream delta: the reasoning (``<think>...</think>``) first, then the content, then
        the tool calls (hermes' content is the text before ``<tool_call>``, its newline kept),
        then the end token."""
        scripted = _message(reply, number, index)
        completion = self.tokenizer.completion(messages, tools, scripted)
        ids = list(completion.token_ids)
        texts = [self.tokenizer.text(t) for t in ids]
        starts = [k for k, text in enumerate(texts) if "<tool_call>" in text]
        message = dict(scripted)
        if reply.tool_calls and len(starts) == len(reply.tool_calls):
            before = "".join(texts[: starts[0]])
            content_tokens = starts[0]
            if before.rstrip() == (reply.content or "").rstrip():
                message["content"] = before or None
            bounds = [*starts, len(ids) - 1]
            calls = [bounds[i + 1] - bounds[i] for i in range(len(starts))]
        else:
            content_tokens, calls = completion.content_tokens, list(completion.tool_call_tokens)
        deltas = _content_deltas(message.get("content") or "", texts[:content_tokens])
        for k, (tool_call, count) in enumerate(
            zip(message.get("tool_calls") or (), calls, strict=True)
        ):
            deltas += _tool_call_deltas(k, tool_call, count)
        deltas += [{} for _ in range(len(ids) - len(deltas))]
        if reply.reasoning:
            opening, body, closing = (
                _encode(self.tokenizer, text) for text in ("<think>", reply.reasoning, "</think>")
            )
            pieces = [self.tokenizer.text(t) for t in body]
            if "".join(pieces) != reply.reasoning:
                pieces = _spread(reply.reasoning, len(body))
            thinking: list[dict[str, Any]] = [{} for _ in opening]
            thinking += [{"reasoning": p} for p in pieces] + [{} for _ in closing]
            ids, deltas = [*opening, *body, *closing, *ids], [*thinking, *deltas]
        for key in self.reasoning_keys:
            message[key] = None if hidden else reply.reasoning
        return message, _Sample(ids, deltas)

    def _logprob(self, number: int, index: int, position: int, token_id: int) -> float:
        h = zlib.crc32(f"{self.seed}:{number}:{index}:{position}:{token_id}".encode())
        return -round(((h % 10_000) / 10_000) ** 2 * 3 + 1e-4, 6)

    def _entry(self, token_id: int, logprob: float, top: int) -> dict[str, Any]:
        """A logprob entry as vLLM writes it: the sampled token's ``bytes`` are its text's,
        each alternative's are those of its token string (``token_id:<id>`` included)."""
        text = self.tokenizer.text(token_id)
        token = f"token_id:{token_id}" if self.tokens_as_ids else text
        alternatives = [(token, logprob)] + [
            (f"token_id:{token_id + k}" if self.tokens_as_ids else f"{text}~{k}", logprob - k)
            for k in range(1, top)
        ]
        return {
            "token": token,
            "logprob": logprob,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": list(t.encode())}
                for t, lp in alternatives[:top]
            ],
        }

    def _stream(self, body: dict[str, Any], response: dict[str, Any]) -> Iterator[bytes]:
        """vLLM's chunks: a role chunk per choice (each with ``prompt_token_ids``), then the
        choices' tokens interleaved, one per chunk; a token a parser holds back is a chunk with
        ``delta: {}`` and its id (dropped whole with ``drop_held_back``, as vLLM 0.10.2-0.12.x
        did); the usage chunk last when asked for (and usage on every chunk with
        ``continuous_usage_stats``, counted per choice)."""
        payload = response["json"]
        head = {
            "id": payload["id"],
            "object": "chat.completion.chunk",
            "created": payload["created"],
            "model": payload["model"],
        }
        options = body.get("stream_options") or {}
        if self.force_include_usage:
            options = {"include_usage": True, "continuous_usage_stats": True}
        usage = payload["usage"]
        continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats"))

        def chunk(part: dict[str, Any], sent: int) -> dict[str, Any]:
            out = {**head, "choices": [part]}
            if continuous:
                out["usage"] = {
                    "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": sent,
                    "total_tokens": usage["prompt_tokens"] + sent,
                }
            return out

        chunks: list[dict[str, Any]] = []
        for choice in payload["choices"]:
            first = chunk(
                {
                    "index": choice["index"],
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                },
                0,
            )
            if payload["prompt_token_ids"] is not None:
                first["prompt_token_ids"] = payload["prompt_token_ids"]
            chunks.append(first)
        plans = list(zip(payload["choices"], response["plans"], strict=True))
        for pos in range(max((len(p[1][0].token_ids) for p in plans), default=0)):
            for choice, (sample, logprobs) in plans:
                if pos >= len(sample.token_ids):
                    continue
                token_id, delta = sample.token_ids[pos], sample.deltas[pos]
                finishing = pos == len(sample.token_ids) - 1
                part: dict[str, Any] = {
                    "index": choice["index"],
                    "delta": delta,
                    "logprobs": {"content": [self._entry(token_id, logprobs[pos], response["top"])]}
                    if response["want_logprobs"]
                    else None,
                    "finish_reason": choice["finish_reason"] if finishing else None,
                }
                if finishing:
                    part["stop_reason"] = choice["stop_reason"]
                if response["want_ids"]:
                    part["token_ids"] = [token_id]
                if not delta and not finishing:
                    if self.drop_held_back:
                        continue
                    if not response["want_ids"] and not response["want_logprobs"]:
                        continue  # nothing to send for it (vLLM skips such chunks)
                chunks.append(chunk(part, pos + 1))
        if options.get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        lines = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        if self.cut_stream_after is not None:
            return _cut(lines[: self.cut_stream_after])
        return iter(lines)


@dataclass(frozen=True, slots=True)
class _Sample:
    """The token ids sampled for one choice, and the stream delta each one arrives in."""

    token_ids: list[int]
    deltas: list[dict[str, Any]]


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


def _content_deltas(content: str, pieces: list[str]) -> list[dict[str, Any]]:
    """One content delta per content token (the string spread over them when the tokens'
    texts do not add up to it exactly)."""
    if pieces and "".join(pieces) != content:
        pieces = _spread(content, len(pieces))
    return [{"content": p} for p in pieces]


def _tool_call_deltas(k: int, tool_call: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The deltas of one tool call's ``count`` tokens, as hermes streams them: ``<tool_call>``
    held back (``{}``), the name (no ``arguments`` key), the arguments spread over the tokens
    between, ``</tool_call>`` held back. With fewer than four tokens, the name and the
    arguments share the first delta (hermes may send both in one)."""
    function = tool_call["function"]
    named = {
        "index": k,
        "id": tool_call["id"],
        "type": "function",
        "function": {"name": function["name"]},
    }

    def arguments(text: str) -> dict[str, Any]:
        return {"index": k, "function": {"arguments": text}}

    if count < 4:
        both = {"content": None, "tool_calls": [named, arguments(function["arguments"])]}
        return [both] + [{} for _ in range(count - 1)]
    middle = count - 3
    return [
        {},
        {"content": None, "tool_calls": [named]},
        *(
            {"content": None, "tool_calls": [arguments(a)]} if a else {}
            for a in _spread(function["arguments"], middle)
        ),
        {},
    ]


def _encode(tokenizer: ChatTokenizer, text: str) -> list[int]:
    """``text``'s token ids (the built-in tokenizer's ``encode``, a Hugging Face one's)."""
    encode = getattr(tokenizer, "encode", None)
    if encode is not None:
        return list(encode(text))
    hf = getattr(tokenizer, "tokenizer", None)
    if hf is not None:
        return [int(i) for i in hf.encode(text, add_special_tokens=False)]
    raise TypeError(f"a Reply with reasoning needs a tokenizer with encode(), not {tokenizer!r}")


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
