"""The server's own bytes, kept beside what arttrace recorded.

``Tee`` is an httpx transport under the OpenAI client: it forwards each request to the real
server and keeps a copy of every response byte as the caller reads it (streams stay streams).
``Raw`` reads those bytes the way vLLM wrote them: one JSON body, or SSE ``data:`` events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Exchange:
    """One request as sent on the wire and the response bytes that came back."""

    path: str
    body: dict[str, Any]
    status: int = 0
    data: bytearray = field(default_factory=bytearray)


class _TeeStream(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, sink: bytearray) -> None:
        self._stream, self._sink = stream, sink

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._sink += chunk
            yield chunk

    def close(self) -> None:
        self._stream.close()


class _AsyncTeeStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, sink: bytearray) -> None:
        self._stream, self._sink = stream, sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._sink += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class Tee(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport (sync and async) that keeps the raw response bytes of every request
    as the caller reads them, and the request body as it went on the wire."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self._async_inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    def _open(self, request: httpx.Request, content: bytes) -> Exchange:
        exchange = Exchange(request.url.path, json.loads(content or b"null"))
        self.exchanges.append(exchange)
        return exchange

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = self._open(request, request.read())
        response = self._inner.handle_request(request)
        exchange.status = response.status_code
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, exchange.data),
            extensions=response.extensions,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = self._open(request, await request.aread())
        response = await self._async_inner.handle_async_request(request)
        exchange.status = response.status_code
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncTeeStream(response.stream, exchange.data),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._async_inner.aclose()

    def completions(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.endswith("/chat/completions")]


@dataclass
class RawChoice:
    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    had_token_ids: bool = False


@dataclass
class Raw:
    """What vLLM sent for one call, read straight from its bytes."""

    prompt_token_ids: list[int] | None
    prompt_token_id_events: int
    """How many SSE events carried ``prompt_token_ids`` (vLLM: one per choice)."""
    choices: dict[int, RawChoice]
    usage: dict[str, Any] | None
    events: int

    @classmethod
    def read(cls, exchange: Exchange) -> Raw:
        assert exchange.status == 200, bytes(exchange.data)[:2000]
        if exchange.body.get("stream"):
            return cls._stream(bytes(exchange.data))
        return cls._whole(json.loads(exchange.data))

    @classmethod
    def _whole(cls, body: dict[str, Any]) -> Raw:
        choices = {}
        for c in body["choices"]:
            message = c["message"]
            choice = RawChoice(
                c["index"],
                finish_reason=c["finish_reason"],
                content=message.get("content"),
                reasoning=message.get("reasoning") or message.get("reasoning_content"),
                tool_calls=message.get("tool_calls") or [],
            )
            _add_ids_and_logprobs(choice, c)
            choices[c["index"]] = choice
        prompt = body.get("prompt_token_ids")
        return cls(prompt, int(prompt is not None), choices, body.get("usage"), 1)

    @classmethod
    def _stream(cls, data: bytes) -> Raw:
        events = []
        for line in data.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
        assert data.decode().rstrip().endswith("data: [DONE]"), "the stream did not end"
        prompt, prompt_events, usage = None, 0, None
        choices: dict[int, RawChoice] = {}
        calls: dict[int, dict[int, dict[str, Any]]] = {}
        for event in events:
            if event.get("prompt_token_ids") is not None:
                prompt_events += 1
                assert prompt is None or prompt == event["prompt_token_ids"]
                prompt = event["prompt_token_ids"]
            if event.get("usage"):
                usage = event["usage"]
            for c in event.get("choices", []):
                choice = choices.setdefault(c["index"], RawChoice(c["index"]))
                delta = c.get("delta") or {}
                if delta.get("content"):
                    choice.content = (choice.content or "") + delta["content"]
                reasoning = delta.get("reasoning") or delta.get("reasoning_content")
                if reasoning:
                    choice.reasoning = (choice.reasoning or "") + reasoning
                for tc in delta.get("tool_calls") or ():
                    slot = calls.setdefault(c["index"], {}).setdefault(
                        tc["index"], {"id": "", "type": "function", "name": "", "arguments": ""}
                    )
                    slot["id"] += tc.get("id") or ""
                    function = tc.get("function") or {}
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
                if c.get("finish_reason"):
                    choice.finish_reason = c["finish_reason"]
                _add_ids_and_logprobs(choice, c)
        for index, slots in calls.items():
            choices[index].tool_calls = [
                {
                    "id": s["id"],
                    "type": "function",
                    "function": {"name": s["name"], "arguments": s["arguments"]},
                }
                for _, s in sorted(slots.items())
            ]
        return cls(prompt, prompt_events, choices, usage, len(events))


def _add_ids_and_logprobs(choice: RawChoice, part: dict[str, Any]) -> None:
    if part.get("token_ids") is not None:
        choice.had_token_ids = True
        choice.token_ids += part["token_ids"]
    for entry in (part.get("logprobs") or {}).get("content") or ():
        choice.logprobs.append(entry["logprob"])
        choice.tokens.append(entry["token"])
