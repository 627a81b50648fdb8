"""Shared by the gateway tests: an upstream that keeps what it was sent and what it answered.

:class:`RecordingUpstream` serves a :class:`~arttrace.testing.ScriptedLLM` over uvicorn on
127.0.0.1 and records, per request, the headers and body it received and the exact bytes it
answered, so a test can compare them with what reached the caller. It can answer slowly, see
the gateway hang up, fail on purpose, and serve a minimal Responses API.

:func:`gateway_process` runs ``arttrace gateway`` as a process of its own, and
:func:`raw_request` speaks HTTP/1.1 over a bare socket, so a test sends the request line and
headers exactly as written (no client normalising ``..`` or setting ``Host``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.types import Receive, Scope, Send

from arttrace._asgi_server import ServerThread
from arttrace.testing import ScriptedLLM
from arttrace.testing._llm import StreamCut

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


@contextmanager
def gateway_process(
    upstream: str, out: Path, *options: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``arttrace gateway`` in front of ``upstream`` on a free port; yields its base URL."""
    command = [sys.executable, "-m", "arttrace.app.cli", "gateway", "--upstream", upstream]
    command += ["--port", "0", "--out", str(out), *options]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        assert "listening on http://" in line, line or process.stderr.read()
        yield line.split("listening on ")[1].split(" ")[0]
    finally:
        process.terminate()
        process.communicate(timeout=30)


def raw_request(
    base: str, method: str, target: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request sent as written (``target`` and ``headers`` byte for byte; a
    ``Host`` of the base URL's unless given): the status, headers and body of the answer."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    head = {"Host": f"{host}:{port}", **headers, "Connection": "close"}
    if body:
        head["Content-Length"] = str(len(body))
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    top, _, content = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode("latin-1").split("\r\n")
    answered = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        answered[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), answered, content
