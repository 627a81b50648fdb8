"""Shared by the gateway tests: an upstream that keeps what it was sent and what it answered.

:class:`RecordingUpstream` serves a :class:`~arttrace.testing.ScriptedLLM` over uvicorn on
127.0.0.1 and records, per request, the headers and body it received and the exact bytes it
answered, so a test can compare them with what reached the caller. It can answer slowly, see
the gateway hang up, fail on purpose, and serve a minimal Responses API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

from arttrace._asgi_server import ServerThread
from arttrace.testing import ScriptedLLM
from arttrace.testing.llm import StreamCut

Failure = Callable[[dict[str, str], dict[str, Any]], tuple[int, dict[str, Any]] | None]


@dataclass
class Exchange:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    answer: list[bytes] = field(default_factory=list)
    hung_up: asyncio.Event | None = None
    saw_hang_up: bool = False

    @property
    def answered(self) -> bytes:
        return b"".join(self.answer)


class RecordingUpstream:
    def __init__(
        self,
        llm: ScriptedLLM | None = None,
        *,
        delay: float = 0.0,
        fail: Failure | None = None,
        think: float = 0.0,
        set_cookie: str | None = None,
    ) -> None:
        """``delay``: seconds between a stream's chunks; ``think``: before any answer;
        ``set_cookie``: a ``Set-Cookie`` header on every answer (a load balancer's)."""
        self.llm = llm or ScriptedLLM()
        self.delay, self.fail, self.think = delay, fail, think
        self.cookie = [(b"set-cookie", set_cookie.encode())] if set_cookie else []
        self.exchanges: list[Exchange] = []
        self._server = ServerThread(self, "127.0.0.1", 0, name="the test upstream")

    @property
    def base_url(self) -> str:
        host, port = self._server.address
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> RecordingUpstream:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        request = json.loads(body) if body else {}
        exchange = Exchange(scope["path"], headers, request)
        self.exchanges.append(exchange)
        await asyncio.sleep(self.think)
        failure = self.fail(headers, request) if self.fail else None
        if failure is not None:
            await self._whole(send, exchange, *failure)
        elif scope["path"].endswith("/models"):
            await self._whole(send, exchange, 200, {"object": "list", "data": [{"id": "m"}]})
        elif scope["path"].endswith("/responses"):
            await self._responses(send, exchange, request)
        else:
            status, payload, chunks = self.llm.respond(request)
            if chunks is None:
                await self._whole(send, exchange, status, payload)
            else:
                await self._stream(receive, send, exchange, chunks)

    async def _whole(self, send: Send, exchange: Exchange, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        exchange.answer.append(data)
        headers = [(b"content-type", b"application/json"), (b"x-upstream", b"yes"), *self.cookie]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _stream(
        self, receive: Receive, send: Send, exchange: Exchange, chunks: Iterator[bytes]
    ) -> None:
        hung_up = asyncio.Event()
        exchange.hung_up = hung_up

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            hung_up.set()

        watcher = asyncio.ensure_future(watch())
        headers = [(b"content-type", b"text/event-stream"), (b"x-upstream", b"yes"), *self.cookie]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            for chunk in chunks:
                if hung_up.is_set():
                    exchange.saw_hang_up = True
                    return
                exchange.answer.append(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if self.delay:
                    await asyncio.sleep(self.delay)
        except StreamCut:
            return  # uvicorn drops the connection: a crashed server, mid-body
        finally:
            if not hung_up.is_set():
                watcher.cancel()
        await send({"type": "http.response.body", "body": b""})

    async def _responses(self, send: Send, exchange: Exchange, request: dict[str, Any]) -> None:
        response = {
            "id": "resp_1",
            "object": "response",
            "model": request.get("model"),
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello from Responses"}],
                }
            ],
            "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
        }
        await self._whole(send, exchange, 200, response)
