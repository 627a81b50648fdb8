"""The scripted model over real HTTP on 127.0.0.1, in a background thread: Chat Completions
(``/v1/chat/completions``), the Responses API (``/v1/responses``, :mod:`._responses`) and
legacy Completions (``/v1/completions``, :mod:`._completions`), each answered as vLLM does."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from ._completions import CompletionsAPI
from ._llm import Answer, ScriptedLLM, StreamCut
from ._responses import ResponsesAPI

Route = Callable[[dict[str, Any]], Answer]


class LLMServer:
    """``with serve(llm) as server:`` then point any OpenAI client at ``server.base_url``.

    ``responses`` and ``completions`` are the endpoints' answerers (their ``requests``, and
    ``responses.token_generations``)."""

    def __init__(self, llm: ScriptedLLM, port: int = 0) -> None:
        self.llm = llm
        self.responses = ResponsesAPI(llm)
        self.completions = CompletionsAPI(llm)
        routes: dict[str, Route] = {
            "/chat/completions": llm.respond,
            "/responses": self.responses.respond,
            "/completions": self.completions.respond,
        }
        self._httpd = _HTTPServer(("127.0.0.1", port), _handler(routes))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> Self:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # concurrent rollouts open many connections at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hung up: not an error
            super().handle_error(request, client_address)


def serve(llm: ScriptedLLM | None = None, port: int = 0) -> LLMServer:
    """A running server for ``llm`` (default: a fresh :class:`ScriptedLLM`), on a free port."""
    return LLMServer(llm or ScriptedLLM(), port).start()


def _handler(routes: dict[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # each streamed chunk leaves at once, as vLLM's do

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._json(200, {"object": "list", "data": []})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if len(raw) < length:  # the client went away mid-body: nobody to answer
                self.close_connection = True
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "the request body is not JSON"}})
                return
            path = self.path.split("?")[0].rstrip("/")
            route = next((r for suffix, r in routes.items() if path.endswith(suffix)), None)
            if route is None:
                self._json(404, {"error": {"message": f"no route {path}"}})
                return
            status, payload, chunks = route(body)
            if chunks is None:
                self._json(status, payload)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for chunk in chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            except StreamCut:  # drop the connection mid-body, as a crashed server would
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
