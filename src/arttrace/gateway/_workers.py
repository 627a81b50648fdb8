"""``arttrace gateway --workers N``: one gateway served by N processes, so it uses N cores.

**Sharing the port.** The parent process binds the sockets, then forks its workers: on Linux
one ``SO_REUSEPORT`` socket per worker on the shared port, so the kernel spreads new
connections evenly over the workers; elsewhere one socket they all accept from. Each worker
also listens on a private port of its own (same host). The parent keeps every socket open, so
a worker that is restarted takes up the same ones, and connections that came meanwhile wait in
their backlog instead of being refused.

**Any worker serves any run.** A run lives in the worker that opened it, and its id names that
worker and the worker's generation (``w1g0.<random>``). ``POST /runs`` answers with the run's
URL on its worker's private port, so the agent's calls go straight to it; a request for the run
that lands on another worker (the shared port's ``/runs/{id}/...``: its calls, ``GET``,
``reward``, ``close``) is handed to the owner over loopback, byte for byte, streams included,
and the owner checks it as if it had been called directly (token, ``Host``, paths). So every
call is recorded in exactly one place.

**Journals.** Worker ``i`` journals the runs it closes under ``OUT/worker-i`` (a run folder of
its own, with its own lock), so no two processes write one file; the parent holds ``OUT``'s
lock, so no Trainer or other gateway writes there meanwhile.

**A worker that dies** loses the runs it held (their trajectories were in its memory): the
parent says so on stderr at once and restarts it, and requests for those runs then answer 410
("the worker that held this run died") instead of reaching a run that no longer exists. A worker
that keeps dying right after it starts stops the whole gateway (exit status 1). Ctrl-C and
SIGTERM stop every worker, gracefully.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

_log = logging.getLogger(__name__)
_OWNED = re.compile(r"/runs/w(\d+)g(\d+)\.")
"""A run id of a worker: ``w<worker>g<generation>.<random>``."""
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"expect",
    }
)
_START_TIMEOUT = 120.0
"""Seconds a worker may take to start serving (importing the gateway's stack on a busy
machine takes a few)."""
_FLAPPING = 3, 10.0
"""A worker that dies this many times in a row, each within this many seconds of starting,
stops the gateway: restarting it again would only hide the cause."""


def run_id_prefix(index: int, generation: int) -> str:
    """How the run ids of worker ``index`` (started ``generation`` times before) begin."""
    return f"w{index}g{generation}."


# -- in each worker ---------------------------------------------------------------------------


class HandOff:
    """The worker's ASGI app: ``app`` (the gateway), after handing each request for another
    worker's run to that worker (``peers[i]``, ``None`` for this one) and answering 410 for a
    run of this worker's earlier life."""

    def __init__(self, app: Any, index: int, generation: int, peers: Sequence[Any]) -> None:
        self.app, self.index, self.generation, self.peers = app, index, generation, peers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        owned = _OWNED.match(scope["path"]) if scope["type"] == "http" else None
        if owned is not None:
            owner, generation = int(owned[1]), int(owned[2])
            if owner != self.index and owner < len(self.peers):
                await self._hand_off(self.peers[owner], scope, receive, send)
                return
            if owner == self.index and generation != self.generation:
                await _gone(scope["path"].split("/")[2], owner)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _lifespan(self, scope: Any, receive: Any, send: Any) -> None:
        peers = [p for p in self.peers if p is not None]
        for peer in peers:
            await peer.start()
        try:
            await self.app(scope, receive, send)
        finally:
            for peer in peers:
                await peer.stop()

    async def _hand_off(self, peer: Any, scope: Any, receive: Any, send: Any) -> None:
        """Forward the request as it came (its ``Host``, token and body) to the worker that
        holds the run, and its answer back as it comes."""
        from multidict import CIMultiDict
        from starlette.requests import ClientDisconnect, Request

        from ._relay import Relay

        try:
            body = await Request(scope, receive).body()
        except ClientDisconnect:  # the caller hung up while sending: nothing to hand over
            _log.debug("a caller hung up while sending a call for %s", peer.base_url)
            return
        headers: CIMultiDict[str] = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k not in _HOP_BY_HOP
        )
        raw = scope.get("raw_path") or scope["path"].encode()
        url = peer.url(raw.decode("latin-1").lstrip("/"), scope["query_string"])
        await Relay(peer, scope["method"], url, headers, body, None)(scope, receive, send)


def _gone(run_id: str, owner: int) -> Any:
    from ._runs import error

    return error(
        410,
        f"arttrace gateway: run {run_id!r} was held by worker {owner}, which died and was "
        "restarted: the run's calls and reward were lost with it (the gateway's log says "
        "when). Open a new run (POST /runs)",
        "not_found_error",
    )


def serve_worker(config: dict[str, Any], sockets: list[socket.socket], ready: int) -> int:
    """A worker's life (in the forked child): serve the gateway on ``sockets`` until told to
    stop; writes a line to the pipe ``ready`` once it serves."""
    import asyncio

    from .._errors import ArttraceError, RunLockedError
    from ._gateway import Gateway, loop_factory
    from ._relay import Upstream

    index, generation = int(config["index"]), int(config["generation"])
    logging.basicConfig(  # the parent's configuration, naming the worker
        level=logging.INFO,
        format=f"%(asctime)s %(name)s (worker {index}): %(message)s",
        force=True,
    )
    host = str(config["host"])
    out = Path(config["out"]) / f"worker-{index}"
    try:
        gateway = Gateway(
            config["upstream"],
            host=host,
            token=os.environ.get("ARTTRACE_GATEWAY_TOKEN") or None,
            upstream_api_key=os.environ.get("ARTTRACE_UPSTREAM_API_KEY") or None,
            request_training_data=bool(config["request_training_data"]),
            out=out,
            timeout=config["timeout"],
            allow_hosts=config["allow_hosts"],
            allow_origins=config["allow_origins"],
            translate=config["translate"],
        )
        gateway.runs.hold()
    except RunLockedError:
        return _say(f"worker {index}: {out} is in use by another process: stop it", 2)
    except ArttraceError as error:
        return _say(f"worker {index}: {error}", 2)
    own = f"http://{_in_url(host)}:{config['ports'][index]}"
    gateway.runs.id_prefix = run_id_prefix(index, generation)
    gateway.runs.url = lambda run_id: f"{own}/runs/{run_id}/v1"
    peers = [
        None
        if i == index
        else Upstream(
            f"http://{_in_url(_loopback(host))}:{port}",
            config["timeout"],
            None,
            name=f"worker {i}, which holds this run,",
        )
        for i, port in enumerate(config["ports"])
    ]
    app = HandOff(gateway._app, index, generation, peers)
    server = _Server(
        uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,  # the gateway's paths hold run ids: no request is logged
            server_header=False,
            date_header=False,
            lifespan="on",
            backlog=4096,
            timeout_keep_alive=60,
            timeout_graceful_shutdown=2,
        )
    )
    try:
        asyncio.run(_serve(server, sockets, ready), loop_factory=loop_factory())
    finally:
        gateway.runs.shutdown()
    return 0 if server.started else _say(f"worker {index} did not start; see the log above", 2)


class _Server(uvicorn.Server):  # type: ignore[misc]  # uvicorn is untyped here
    """uvicorn's server, stopped by the parent's SIGTERM (or by the parent's end) and not by
    Ctrl-C's SIGINT, which reaches the whole process group: the parent stops its workers
    itself, and must not mistake one that stopped on its own for one that died. uvicorn's
    own handling would also re-raise the signal afterwards, ending the worker before its runs
    are shut down."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(*_: object) -> None:
            self.should_exit = True

        previous = signal.signal(signal.SIGTERM, stop), signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])


async def _serve(server: _Server, sockets: list[socket.socket], ready: int) -> None:
    import asyncio

    parent = os.getppid()
    serving = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        os.write(ready, b"ready\n")  # the parent waits for this line
    os.close(ready)
    while not serving.done():  # a parent killed outright leaves no worker behind
        await asyncio.wait({serving}, timeout=1.0)
        if os.getppid() != parent:
            server.should_exit = True
    await serving


def _say(message: str, status: int) -> int:
    print(f"arttrace gateway: {message}", file=sys.stderr, flush=True)
    return status


def _in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _loopback(host: str) -> str:
    """Where a worker reaches another's private port: on loopback when it listens on all."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


# -- the parent ---------------------------------------------------------------------------------


@dataclass
class _Worker:
    index: int
    sockets: list[socket.socket]
    """Its share of the port, and its private port: held by the parent for its next life."""
    pid: int = 0
    ready: int = -1
    """The read end of the pipe it says it serves on."""
    generation: int = -1
    started: float = 0.0
    quick_deaths: int = 0
    status: int | None = None
    """How it ended (``os.waitstatus_to_exitcode``), once it has."""

    def ended(self) -> bool:
        if self.status is None and self.pid:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None


class Workers:
    """The parent of ``count`` gateway workers: binds the shared port and the private ones,
    forks the workers, restarts one that dies, and stops them all.

    Workers are forked (POSIX) from a parent that has imported the gateway's stack and runs no
    thread or event loop yet, so a worker serves within milliseconds of being started, and a
    restart loses no time to imports."""

    def __init__(self, count: int, config: dict[str, Any]) -> None:
        self.count, self.config = count, config
        self.host, self.port = str(config["host"]), int(config["port"])
        self.workers: list[_Worker] = []
        self._lock: Any = None

    # -- start -----------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind every socket (raises ``OSError`` when the port is taken), and take ``OUT``
        (``RunLockedError`` when a Trainer or another gateway has it)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        reuse_port = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")
        shared: list[socket.socket] = []
        try:
            if reuse_port and self.port:  # a port another gateway's workers share is in use
                with _listening(family) as probe:  # too: binding it plainly says so
                    probe.bind((self.host, self.port))
            for _ in range(self.count if reuse_port else 1):
                s = _listening(family)
                if reuse_port:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                shared.append(s)
                s.bind((self.host, self.port))
                s.listen(4096)
                self.port = s.getsockname()[1]  # port 0: the others take the one it got
            for i in range(self.count):
                private = _listening(family)
                self.workers.append(_Worker(i, [shared[i if reuse_port else 0], private]))
                private.bind((self.host, 0))
                private.listen(4096)
            from .._journal import RunLock

            self._lock = RunLock(Path(self.config["out"]))
            self._lock.acquire()
        except BaseException:
            for s in shared:
                s.close()
            self.close()
            raise
        ports = [w.sockets[1].getsockname()[1] for w in self.workers]
        self.config = {**self.config, "ports": ports}
        from ._gateway import Gateway  # noqa: F401 - imported once here, not in each worker

    def start(self) -> None:
        """Start every worker; returns once all serve. Raises ``RuntimeError`` with the
        cause when one cannot start."""
        for worker in self.workers:
            self._fork(worker)
        for worker in self.workers:
            self._wait_ready(worker)

    def _fork(self, worker: _Worker) -> None:
        worker.generation += 1
        worker.status = None
        config = {**self.config, "index": worker.index, "generation": worker.generation}
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 70  # EX_SOFTWARE, if serving raised
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (SIGTERM)
                os.close(read)
                for other in self.workers:
                    if other is not worker:
                        for s in other.sockets:
                            if s not in worker.sockets:
                                s.close()
                        if other.ready >= 0:
                            os.close(other.ready)
                status = serve_worker(config, worker.sockets, write)
            except BaseException:
                logging.getLogger(__name__).exception("worker %d failed", worker.index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(write)
        worker.pid, worker.ready, worker.started = pid, read, time.monotonic()
        _say(f"worker {worker.index} is process {pid}", 0)

    def _wait_ready(self, worker: _Worker) -> None:
        ready, _, _ = select.select([worker.ready], [], [], _START_TIMEOUT)
        line = os.read(worker.ready, 64) if ready else b""
        os.close(worker.ready)
        worker.ready = -1
        if line.strip() != b"ready":
            if not worker.ended():
                os.kill(worker.pid, signal.SIGKILL)
                os.waitpid(worker.pid, 0)
            raise RuntimeError(
                f"worker {worker.index} did not start ({_status(worker.status)}); see its "
                "message above"
            )

    # -- serve -----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{_in_url(self.host)}:{self.port}"

    def supervise(self, stop: threading.Event) -> int:
        """Until ``stop`` is set: restart a worker that dies, saying so. Returns the exit
        status: 0, or 1 when a worker keeps dying."""
        while not stop.wait(0.2):
            for worker in self.workers:
                if not worker.ended():
                    continue
                lived = time.monotonic() - worker.started
                worker.quick_deaths = worker.quick_deaths + 1 if lived < _FLAPPING[1] else 1
                _say(
                    f"worker {worker.index} (pid {worker.pid}) died ({_status(worker.status)}): "
                    "the runs it held are lost (their URLs now answer 410, and they will not "
                    "be journaled)",
                    0,
                )
                if worker.quick_deaths >= _FLAPPING[0]:
                    _say(
                        f"worker {worker.index} keeps dying ({worker.quick_deaths} times, each "
                        f"within {_FLAPPING[1]:g} s of starting): stopping the gateway",
                        0,
                    )
                    return 1
                _say(f"restarting worker {worker.index}", 0)
                self._fork(worker)
                try:
                    self._wait_ready(worker)
                except RuntimeError as error:
                    _say(f"{error}: stopping the gateway", 0)
                    return 1
        return 0

    def stop(self) -> None:
        """Stop every worker (SIGTERM; killed after 15 s), then close the sockets."""
        running = [w for w in self.workers if w.pid and not w.ended()]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for worker in running:
            while not worker.ended():
                if time.monotonic() > deadline:
                    os.kill(worker.pid, signal.SIGKILL)
                    os.waitpid(worker.pid, 0)
                    break
                time.sleep(0.02)
        self.close()

    def close(self) -> None:
        for worker in self.workers:
            for s in worker.sockets:
                s.close()
            if worker.ready >= 0:
                os.close(worker.ready)
                worker.ready = -1
        if self._lock is not None and self._lock.held:
            self._lock.release()


def _listening(family: socket.AddressFamily) -> socket.socket:
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (see _asgi_server).
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"
