"""The scripted model over real HTTP on 127.0.0.1, in a background thread."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from .llm import ScriptedLLM, StreamCut


class LLMServer:
    """``with serve(llm) as server:`` then point any OpenAI client at ``server.base_url``."""

    def __init__(self, llm: ScriptedLLM, port: int = 0) -> None:
        self.llm = llm
        self._httpd = _HTTPServer(("127.0.0.1", port), _handler(llm))
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._json(200, {"object": "list", "data": []})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "the request body is not JSON"}})
                return
            status, payload, chunks = llm.respond(body)
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
