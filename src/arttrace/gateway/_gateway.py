"""``arttrace.Gateway``: an OpenAI-compatible server in front of the policy server, one URL
per run, so agents in other processes and languages are captured as in-process ones are."""

from __future__ import annotations

try:
    import aiohttp  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "arttrace.Gateway needs starlette, uvicorn and aiohttp: pip install 'arttrace[gateway]'"
    ) from error

import asyncio
import enum
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Self

import anyio.to_thread

from .._asgi_server import ServerThread
from .._errors import ConfigurationError, UsageError
from ..capture import _context
from ..capture._trajectory import Trajectory
from ._admission import Admission
from ._app import GatewayApp
from ._options import (
    host_problem,
    origin_problem,
    port_problem,
    timeout_problem,
    upstream_problem,
)
from ._relay import Upstream
from ._runs import RunOptions, Runs


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (the gateway extra has it, except on Windows):
    its transports cost a streamed chunk ~20 % less CPU than asyncio's (bench_gateway.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class _State(enum.Enum):
    UNOPENED = 1  # made, not started
    OPENED = 2  # serving
    CLOSED = 3  # stopped; a gateway is not restarted


class Gateway:
    """An OpenAI-compatible HTTP server in front of ``upstream`` (the policy server's OpenAI
    base URL, e.g. ``http://127.0.0.1:8000/v1``), with one base URL per run::

        with arttrace.Gateway(upstream=vllm_url) as gateway:        # or `async with`
            with arttrace.trajectory("q-1") as t:
                run_agent(base_url=gateway.url(t))   # any process, any language
                t.reward = ...

    Every Chat Completions call made to ``gateway.url(t)`` is recorded into ``t`` as a policy
    turn (as inside ``@trainable``), with the upstream's exact tokens, which the gateway asks
    for (``logprobs``, ``return_token_ids``) unless the caller set them or
    ``request_training_data=False``. Streams pass through unbuffered, byte for byte.

    ``host`` / ``port``: where it listens (``127.0.0.1``, a free port). ``token``: if set,
    callers must present it (``Authorization: Bearer <token>``, i.e. the OpenAI client's
    ``api_key``, or an ``X-Arttrace-Token`` header); ``upstream_api_key`` is then what the
    upstream gets. Without a token the caller's ``Authorization`` goes to the upstream as is;
    it is never recorded or logged. ``out``: a folder for runs opened over HTTP (``POST
    /runs``), journaled as the ``Trainer`` journals its runs (the folder's lock is held while
    the gateway serves). ``timeout``: seconds an upstream call may take (``None``: no limit).

    Without a token, web pages are kept out (a page its user visits could otherwise spend the
    upstream's key): a request for a ``Host`` other than the gateway's address, a body not
    declared ``application/json``, and a browser's request from another site are refused.
    ``allow_hosts``: other names callers reach it by (``"*"``: any); ``allow_origins``: web
    pages that may call it, like ``"http://localhost:3000"`` (they get CORS answers).

    ``translate``: protocols (``"responses"``, ``"messages"``) whose calls are served through
    the upstream's Chat Completions, so every turn trains (``docs/translation.md``); per run
    with ``url(t, translate=...)``.
    """

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        upstream_api_key: str | None = None,
        request_training_data: bool = True,
        export_tokens: bool = False,
        out: str | Path | None = None,
        timeout: float | None = 600.0,
        allow_hosts: Iterable[str] = (),
        allow_origins: Iterable[str] = (),
        translate: str | Iterable[str] | None = None,
    ) -> None:
        from ..translation._registry import apis

        for name, problem in (
            ("upstream", upstream_problem(upstream)),
            ("port", port_problem(port)),
            ("timeout", timeout_problem(timeout)),
            *(("allow_hosts", host_problem(h)) for h in allow_hosts),
            *(("allow_origins", origin_problem(o)) for o in allow_origins),
        ):
            if problem is not None:
                raise ConfigurationError(f"{name} {problem}")
        self.upstream = upstream.rstrip("/")
        self.host, self.port = host, port
        admission = Admission(
            host,
            [h.strip("[]").rstrip(".").lower() for h in allow_hosts],
            [o.rstrip("/").lower() for o in allow_origins],
            token=token is not None,
        )
        self.options = RunOptions(
            request_training_data=request_training_data,
            export_tokens=export_tokens,
            translate=apis(translate),
        )
        self.out = Path(out) if out is not None else None
        self._upstream = Upstream(self.upstream, timeout, upstream_api_key)
        self.runs = Runs(self._run_url, self.out)
        self._app = GatewayApp(self.runs, self._upstream, self.options, token, admission)
        self._server: ServerThread | None = None
        self._state = _State.UNOPENED

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start serving (in a thread of its own); returns once it accepts connections."""
        if self._state is not _State.UNOPENED:
            raise UsageError(
                "Cannot start a gateway twice."
                if self._state is _State.OPENED
                else "Cannot restart a gateway once it has been stopped; make a new one."
            )
        if self.out is not None:
            self.runs.hold()  # now, not in the first request: a folder in use fails here
        self._server = ServerThread(
            self._app, self.host, self.port, name="the gateway", loop_factory=loop_factory()
        )
        try:
            self._server.start()
        except BaseException:
            self.runs.shutdown()
            raise
        self._state = _State.OPENED
        _context.add_recording_server(self._server.address[1])
        return self

    def stop(self) -> None:
        """Stop serving: calls in flight are cut, runs still open over HTTP are not journaled."""
        if self._state is _State.OPENED:
            assert self._server is not None
            _context.remove_recording_server(self._server.address[1])
            self._server.stop()
            self.runs.shutdown()
        self._state = _State.CLOSED

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await anyio.to_thread.run_sync(self.stop)

    # -- runs ------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """Where the gateway listens, e.g. ``http://127.0.0.1:8123`` (the run API's root)."""
        if self._server is None:
            raise UsageError("the gateway is not started: use `with Gateway(...) as gateway:`")
        host, port = self._server.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def url(
        self,
        trajectory: Trajectory,
        *,
        agent: str | None = None,
        model: str | None = None,
        request_training_data: bool | None = None,
        translate: str | Iterable[str] | None = None,
    ) -> str:
        """The OpenAI base URL (ending in ``/v1``) of ``trajectory``'s run: calls made to it
        are recorded into ``trajectory`` until it ends. The same URL each time it is asked.

        ``agent`` names the policy on its calls (default ``"gateway"``); ``model``: only calls
        to this model are policy turns; ``request_training_data``, ``translate``: per run,
        see the class (``translate=()`` turns the gateway's off for this run; default: the
        trajectory's own ``translate``, else the gateway's)."""
        if self._state is not _State.OPENED:
            raise UsageError("the gateway is not serving: use `with Gateway(...) as gateway:`")
        if not isinstance(trajectory, Trajectory):
            raise ConfigurationError(
                f"gateway.url() takes an arttrace.Trajectory (e.g. "
                f"arttrace.current_trajectory()), got {type(trajectory).__name__}"
            )
        chosen = trajectory.translate if translate is None else translate
        options = RunOptions(
            agent=agent or self.options.agent,
            model=model,
            request_training_data=self.options.request_training_data
            if request_training_data is None
            else request_training_data,
            export_tokens=self.options.export_tokens,
            translate=self.options.translate if chosen is None else _apis(chosen),
        )
        return self._run_url(self.runs.attach(trajectory, options).id)

    def _run_url(self, run_id: str) -> str:
        return f"{self.base_url}/runs/{run_id}/v1"

    def __repr__(self) -> str:
        where = self.base_url if self._state is _State.OPENED else self._state.name.lower()
        return f"Gateway(upstream={self.upstream!r}, {where})"


def _apis(value: str | Iterable[str]) -> frozenset[str]:
    from ..translation._registry import apis

    return apis(value)
