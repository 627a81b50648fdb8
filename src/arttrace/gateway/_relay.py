"""One call forwarded to the upstream and its answer forwarded back, byte for byte.

A stream reaches the caller piece by piece as the upstream sends it (nothing is buffered); the
recorder reads the same pieces on the side, each before it is forwarded, so a call has been
recorded by the time its caller has the last byte. A caller that hangs up closes the upstream
request and leaves the call marked partial. An upstream error reaches the caller unchanged; a
stream the upstream cuts is cut for the caller too. Both mark the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

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
        TOKEN_HEADER,
    }
)
_POOLS = 16
"""Connection pools to the upstream. An httpx pool scans all its connections on each request
and each response's end: 1,000 streams in one pool cost ~30 s of CPU in those scans alone."""
_NOT_RETURNED = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "te", "trailer", "transfer-encoding"}
)


class Upstream:
    """The policy server the gateway forwards to (an OpenAI base URL, ending in ``/v1``)."""

    def __init__(self, base_url: str, timeout: float | None, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.api_key = timeout, api_key
        self.server = SimpleNamespace(base_url=httpx.URL(self.base_url))
        """What a call's span says of the server (``server.address``, ``server.port``)."""
        self._clients: list[httpx.AsyncClient] = []

    async def start(self) -> None:
        """Open the connection pools, in the server's event loop (no limit on connections: a
        limit would queue rollouts behind each other)."""
        tls = httpx.create_ssl_context(trust_env=False)  # once: ~20 ms each (CA bundle)
        self._clients = [
            httpx.AsyncClient(
                verify=tls,
                timeout=httpx.Timeout(self.timeout),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
                trust_env=False,  # straight to the upstream, never through an environment proxy
            )
            for _ in range(_POOLS)
        ]

    async def stop(self) -> None:
        for client in self._clients:
            await client.aclose()

    def client(self, run_id: str) -> httpx.AsyncClient:
        """The pool of ``run_id``'s calls (the same each time: a multi-turn agent's calls
        reuse its connections)."""
        assert self._clients, "the gateway's server has not started"
        return self._clients[hash(run_id) % len(self._clients)]

    def request(
        self,
        client: httpx.AsyncClient,
        method: str,
        path: str,
        query: bytes,
        headers: httpx.Headers,
        body: bytes,
    ) -> httpx.Request:
        url = f"{self.base_url}/{path}" + (f"?{query.decode('latin-1')}" if query else "")
        return client.build_request(method, url, headers=headers, content=body)


def upstream_headers(
    raw: list[tuple[bytes, bytes]], *, drop_authorization: bool, api_key: str | None
) -> httpx.Headers:
    """The caller's headers for the upstream: its ``Authorization`` as is (unless it carried the
    gateway's own token), or the gateway's upstream key when the caller sent none."""
    headers = httpx.Headers(
        [
            (name, value)
            for name, value in raw
            if name.decode("latin-1") not in _NOT_FORWARDED
            and not (drop_authorization and name == b"authorization")
        ]
    )
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
    """The ASGI answer to one forwarded call: sends ``request`` upstream when called, then
    forwards the upstream's answer while ``recorder`` (if any) records it."""

    def __init__(
        self,
        upstream: Upstream,
        client: httpx.AsyncClient,
        request: httpx.Request,
        recorder: Recorder | None,
    ) -> None:
        self.upstream, self.client, self.upstream_request = upstream, client, request
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = _State()
        async with anyio.create_task_group() as group:
            group.start_soon(_watch_hang_up, receive, group.cancel_scope, state)
            await self._forward(send, state)
            group.cancel_scope.cancel()
        if state.disconnected and not state.answered:
            self._record("abandoned", "the caller disconnected before the response ended")

    async def _forward(self, send: Send, state: _State) -> None:
        try:
            answer = await self.client.send(self.upstream_request, stream=True)
        except httpx.HTTPError as error:
            self._record("failed", error, partial=False)
            state.answered = True
            await _send_whole(
                send,
                502,
                [(b"content-type", b"application/json")],
                _unreachable(self.upstream.base_url, redact(repr(error))),
            )
            return
        try:
            headers = [
                (k, v) for k, v in answer.headers.raw if k.lower().decode() not in _NOT_RETURNED
            ]
            streamed = answer.status_code < 300 and answer.headers.get(
                "content-type", ""
            ).startswith("text/event-stream")
            if not streamed:
                data = await answer.aread()
                self._record("whole", answer.status_code, data)
                state.answered = True
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(data)).encode()))
                await _send_whole(send, answer.status_code, headers, data)
                return
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            await send(
                {"type": "http.response.start", "status": answer.status_code, "headers": headers}
            )
            events = EventReader() if self.recorder is not None else None
            async for piece in answer.aiter_raw():
                if events is not None:
                    for data in events.feed(piece):
                        self._record("event", data)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            self._record("ended")
            state.answered = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as error:  # the upstream cut its answer: cut the caller's too
            self._record("failed", error, partial=True)
            state.answered = True
        finally:
            with anyio.CancelScope(shield=True):  # also when the caller's hang-up cancelled us
                await answer.aclose()

    def _record(self, what: str, *args: object, **kwargs: object) -> None:
        if self.recorder is not None:
            with guarded(f"the gateway recording a call ({what})"):
                getattr(self.recorder, what)(*args, **kwargs)


async def _watch_hang_up(receive: Receive, scope: anyio.CancelScope, state: _State) -> None:
    """Wait for the caller to hang up; then stop forwarding (which closes the upstream call)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if not state.answered:
        state.disconnected = True
        scope.cancel()


async def _send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _unreachable(base_url: str, why: str) -> bytes:
    import json

    message = f"arttrace gateway: the upstream {base_url} could not be reached ({why})"
    return json.dumps(
        {"error": {"message": message, "type": "upstream_unreachable", "param": None, "code": 502}}
    ).encode()
