"""One call forwarded to the upstream and its answer forwarded back, byte for byte.

A stream reaches the caller piece by piece as the upstream sends it (nothing is buffered); the
recorder reads the same pieces on the side. A piece that may end the call (``_MAY_END``) is read
before it is forwarded, so a call has been recorded by the time its caller has its end; the
others are read just after, off the caller's way (the first chunk, which carries the prompt's
token ids, is the largest). A caller that hangs up closes the upstream request and leaves the
call marked partial. An upstream error reaches the caller unchanged; a
stream the upstream cuts is cut for the caller too. Both mark the call.

The upstream is called with aiohttp: its C parser reads a stream for a third of httpx's CPU,
and it hands over all that has arrived at once, so a gateway that falls behind catches up in
one forward instead of one per chunk (``bench/bench_gateway.py``: 10 ms of the gateway's CPU per
64-token stream with httpx, 3-4 ms with aiohttp).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import httpx
from multidict import CIMultiDict
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from yarl import URL

from ..capture._guard import guarded
from ..capture._redact import redact
from ..capture._sse import EventReader
from ..capture._wire import Recorder

TOKEN_HEADER = "x-arttrace-token"
"""Where a caller may put the gateway's own token, leaving ``Authorization`` for the upstream."""
_NOT_FORWARDED = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "accept-encoding",  # identity upstream: the recorder reads the bytes it forwards
        "expect",  # the gateway has the whole body: the upstream's 100 Continue is a wait
        TOKEN_HEADER,
    }
)
_NOT_RETURNED = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"te", b"trailer", b"transfer-encoding"}
)
_MAY_END = re.compile(
    rb'"finish_reason":\s*"|"usage":\s*\{|\[DONE\]|"error"|"response\.(?:completed|incomplete|failed)"'
)
"""What in a stream may end its call: a finish reason, the usage, the end, an error, a final
Responses event. A caller may stop reading there (LiteLLM's sync stream stops at the finish
reason) and end its run."""
_RECORDING_EVENT = guarded("the gateway recording a call (event)")
_UPSTREAM_FAILED = (aiohttp.ClientError, OSError, TimeoutError)
"""How an upstream call fails (aiohttp raises these, and a timeout as ``TimeoutError``)."""


class Upstream:
    """The policy server the gateway forwards to (an OpenAI base URL, ending in ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        timeout: float | None,
        api_key: str | None,
        *,
        name: str = "the upstream",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.api_key = timeout, api_key
        self.name = name
        """What it is, in the error a caller gets when it cannot be reached."""
        self.server = SimpleNamespace(base_url=httpx.URL(self.base_url))
        """What a call's span says of the server (``server.address``, ``server.port``)."""
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool, in the server's event loop (no limit on connections: a
        limit would queue rollouts behind each other)."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0,
                ssl=httpx.create_ssl_context(trust_env=False),  # httpx's CA bundle, as before
                # An idle connection is let go before vLLM's server (uvicorn: 5 s) closes it,
                # so a call is not sent down a connection the server is closing.
                keepalive_timeout=4.0,
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, sock_read=self.timeout
            ),
            auto_decompress=False,  # the caller gets the upstream's bytes as they are
            # No jar: the gateway forwards for many callers, and a cookie the upstream set on
            # one's answer (a load balancer's sticky session) must not ride on another's call.
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # straight to the upstream, never through an environment proxy
            skip_auto_headers=("user-agent", "accept", "content-type"),  # the caller's only
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    def url(self, path: str, query: bytes) -> URL:
        url = f"{self.base_url}/{path}" + (f"?{query.decode('latin-1')}" if query else "")
        return URL(url, encoded=True)  # the caller's path and query as they were sent


def upstream_headers(
    raw: list[tuple[bytes, bytes]], *, drop_authorization: bool, api_key: str | None
) -> CIMultiDict[str]:
    """The caller's headers for the upstream: its ``Authorization`` as is (unless it carried the
    gateway's own token), or the gateway's upstream key when the caller sent none."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in raw:
        key = name.decode("latin-1")
        if key not in _NOT_FORWARDED and not (drop_authorization and key == "authorization"):
            headers.add(key, value.decode("latin-1"))
    if api_key is not None and "authorization" not in headers:
        headers["authorization"] = f"Bearer {api_key}"
    headers["accept-encoding"] = "identity"
    return headers


@dataclass(slots=True)
class _State:
    answered: bool = False
    """The caller has the whole answer (or the upstream cut it): a hang-up now is no loss."""
    disconnected: bool = False


class Relay(Response):
    """The ASGI answer to one forwarded call: sends the request upstream when called, then
    forwards the upstream's answer while the record ``open_record`` opens (if any) records it.
    The record is opened once the request has gone out, while the upstream works on it, so
    opening it adds nothing to the caller's wait."""

    def __init__(
        self,
        upstream: Upstream,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes,
        open_record: Callable[[], Recorder] | None,
    ) -> None:
        self.upstream, self.method, self.url = upstream, method, url
        self.upstream_headers, self.body = headers, body
        self.open_record = open_record
        self.recorder: Recorder | None = None
        self.on_hang_up: Callable[[], None] | None = None
        """Called when the caller hangs up before the answer ends (the run counts it)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = _State()
        forwarding = asyncio.current_task()
        assert forwarding is not None
        # A task, not a task group: anyio's costs the caller's first byte about 0.1 ms.
        watcher = asyncio.get_running_loop().create_task(_watch_hang_up(receive, forwarding, state))
        try:
            await self._forward(send, state)
        except asyncio.CancelledError:
            if not (state.disconnected and forwarding.uncancel() == 0):
                raise  # cancelled by someone else too (the server shutting down)
        finally:
            watcher.cancel()
        if state.disconnected and not state.answered:
            self._record("abandoned", "the caller disconnected before the response ended")
            if self.on_hang_up is not None:
                self.on_hang_up()

    async def _answer(self, send: Send, state: _State) -> aiohttp.ClientResponse | None:
        """The upstream's answer (the call's record opened while the request goes out), or
        ``None`` once the caller has been told that the upstream could not be reached."""
        session = self.upstream.session
        assert session is not None, "the gateway's server has not started"
        request = asyncio.ensure_future(
            session.request(
                self.method,
                self.url,
                headers=self.upstream_headers,
                data=self.body if self.body or self.method != "GET" else None,
                allow_redirects=False,
            )
        )
        try:
            if self.open_record is not None:
                await asyncio.sleep(0)  # the request goes out (or starts to connect) first
                with guarded("the gateway opening a call's record"):
                    self.recorder = self.open_record()
            return await request
        except _UPSTREAM_FAILED as error:
            self._record("failed", error, partial=False)
            state.answered = True
            await _send_whole(
                send,
                502,
                [(b"content-type", b"application/json")],
                self._unreachable(redact(repr(error))),
            )
            return None
        except BaseException:  # the caller hung up before the answer came
            _let_go(request)
            raise

    def _unreachable(self, why: str) -> bytes:
        """The body of the 502 the caller gets when the upstream cannot be reached."""
        return _unreachable(self.upstream, why)

    async def _forward(self, send: Send, state: _State) -> None:
        answer = await self._answer(send, state)
        if answer is None:
            return
        silence: _Silence | None = None
        try:
            headers = [(k, v) for k, v in answer.raw_headers if k.lower() not in _NOT_RETURNED]
            streamed = answer.status < 300 and (answer.content_type == "text/event-stream")
            if not streamed:
                data = await answer.read()
                self._record("whole", answer.status, data)
                state.answered = True
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(data)).encode()))
                await _send_whole(send, answer.status, headers, data)
                return
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            events = EventReader() if self.recorder is not None else None
            content = answer.content
            silence = _Silence.watch(answer, self.upstream.timeout)
            while piece := await content.readany():  # all that has arrived, as soon as it has
                if silence is not None:
                    silence.heard += 1
                body = {"type": "http.response.body", "body": piece, "more_body": True}
                if events is None:
                    await send(body)
                elif _MAY_END.search(events.pending + piece if events.pending else piece):
                    self._read(events, piece)
                    await send(body)
                else:
                    await send(body)
                    self._read(events, piece)
            self._record("ended")
            state.answered = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except _UPSTREAM_FAILED as error:  # the upstream cut its answer: cut the caller's too
            self._record("failed", error, partial=True)
            state.answered = True
        finally:
            if silence is not None:
                silence.stop()
            answer.close()  # also when the caller's hang-up cancelled us: closes the upstream

    def _read(self, events: EventReader, piece: bytes) -> None:
        assert self.recorder is not None
        record = self.recorder.event
        for data in events.feed(piece):
            _RECORDING_EVENT.call(record, data)  # the guard's cheap form: once per chunk

    def _record(self, what: str, *args: object, **kwargs: object) -> None:
        if self.recorder is not None:
            with guarded(f"the gateway recording a call ({what})"):
                getattr(self.recorder, what)(*args, **kwargs)


class _Silence:
    """An upstream silent for ``timeout`` seconds in the middle of a stream fails the stream's
    read, as aiohttp's ``sock_read`` timeout does, but checked a few times per ``timeout``
    (a silence is found after ``timeout`` to 1.25 × ``timeout``) instead of by a timer that
    aiohttp cancels and arms again for every chunk: at 1,000 streams those timers fill the
    event loop's heap with cancelled handles."""

    __slots__ = ("_content", "_handle", "_loop", "_period", "_quiet", "_seen", "_timeout", "heard")

    def __init__(self, content: aiohttp.StreamReader, timeout: float) -> None:
        self._content, self._timeout, self._period = content, timeout, timeout / 4
        self._loop = asyncio.get_running_loop()
        self.heard = self._seen = 0
        """Pieces read so far; pieces read at the last check."""
        self._quiet = 0.0
        self._handle = self._loop.call_later(self._period, self._check)

    @classmethod
    def watch(cls, answer: aiohttp.ClientResponse, timeout: float | None) -> _Silence | None:
        """The watch of a streamed ``answer``, taking over from aiohttp's own timeout."""
        connection = answer.connection
        if timeout is None or connection is None or connection.protocol is None:
            return None
        connection.protocol.read_timeout = None  # this request's only: each sets its own
        return cls(answer.content, timeout)

    def _check(self) -> None:
        if self.heard != self._seen:
            self._seen, self._quiet = self.heard, 0.0
        else:
            self._quiet += self._period
        if self._quiet >= self._timeout:  # what aiohttp's own timeout raises in the read
            self._content.set_exception(
                aiohttp.SocketTimeoutError("Timeout on reading data from socket")
            )
        else:
            self._handle = self._loop.call_later(self._period, self._check)

    def stop(self) -> None:
        self._handle.cancel()


def _let_go(request: asyncio.Future[aiohttp.ClientResponse]) -> None:
    """Stop an upstream request no one will read: cancel it, or close the answer it has."""
    if not request.done():
        request.cancel()
    elif not request.cancelled() and request.exception() is None:
        request.result().close()


async def _watch_hang_up(receive: Receive, forwarding: asyncio.Task[None], state: _State) -> None:
    """Wait for the caller to hang up; then stop forwarding (which closes the upstream call).
    A server whose ``receive`` fails leaves the call unwatched, not failed."""
    with guarded("the gateway watching for the caller hanging up"):
        while (await receive())["type"] != "http.disconnect":
            pass
        if not state.answered:
            state.disconnected = True
            forwarding.cancel()


async def _send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _unreachable(upstream: Upstream, why: str) -> bytes:
    import json

    message = f"arttrace gateway: {upstream.name} {upstream.base_url} could not be reached ({why})"
    return json.dumps(
        {"error": {"message": message, "type": "upstream_unreachable", "param": None, "code": 502}}
    ).encode()
