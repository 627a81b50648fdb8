"""uvicorn serving an ASGI app in a thread of its own, with its own event loop: the gateway's
server and the CPU backend's inference server.

Its own thread, not the caller's event loop: a rollout that blocks its loop (``subprocess.run``
of an agent that calls back through the gateway) must not stop the server from answering.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp

from ._errors import UsageError


class ServerThread:
    """``start()`` binds ``host:port`` (port 0: a free one) and returns once it is serving;
    ``name`` says whose server it is in errors and the thread's name; ``loop_factory``, the
    event loop's (asyncio's when ``None``)."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        *,
        name: str,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ) -> None:
        self.name = name
        self.loop_factory = loop_factory
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so. Without it,
        # Nagle's algorithm holds each small write (a chunk of a stream) until the previous one
        # is acknowledged, ~40 ms with the caller's delayed ACK.
        self.socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as error:
            self.socket.close()
            raise UsageError(f"{name} cannot listen on {host}:{port}: {error}") from error
        bound = self.socket.getsockname()
        self.address: tuple[str, int] = (str(bound[0]), int(bound[1]))
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_config=None,  # a library leaves the application's logging alone
                log_level="warning",
                access_log=False,  # the gateway's paths hold run ids: no request is logged
                server_header=False,  # the gateway's caller gets the upstream's own headers
                date_header=False,
                lifespan="on",
                backlog=4096,
                timeout_keep_alive=60,
                timeout_graceful_shutdown=2,
            )
        )
        self._thread = threading.Thread(target=self._serve, name=f"arttrace: {name}", daemon=True)
        self._failure: BaseException | None = None

    def _serve(self) -> None:
        try:  # in a fresh context: the server is no part of a run it was started in
            serving = self.server.serve(sockets=[self.socket])
            contextvars.Context().run(asyncio.run, serving, loop_factory=self.loop_factory)
        except BaseException as error:  # reported by start()
            self._failure = error

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                raise UsageError(f"{self.name} did not start ({self._failure!r}); see the log")
            time.sleep(0.005)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.socket.close()
