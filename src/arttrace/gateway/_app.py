"""The gateway's ASGI app: each run's OpenAI-compatible API, and the run API (``/runs``)."""

from __future__ import annotations

import hmac
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import quote

import orjson
from multidict import CIMultiDict
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..capture import _context
from ..capture._guard import guarded
from ..capture._redact import remember, remember_query
from ..capture._warnings import warn_unrecorded
from ..capture._wire import Recorder
from ..translation import Chains
from ._admission import Admission, with_cors
from ._relay import TOKEN_HEADER, Relay, Upstream, upstream_headers
from ._runs import Run, RunAPI, RunOptions, Runs, error, unknown_run
from ._translate import refused, translated

_RECORDED = ("chat/completions", "responses", "completions")
_UNRECORDED = {
    "messages": "the Anthropic Messages API (/v1/messages), whose answers carry no token ids "
    "(translated, its turns train: `arttrace gateway --translate messages`, "
    "Gateway(translate='messages') or per run; docs/translation.md)"
}
"""Forwarded, but not recorded: a call to one says so (once). vLLM's Messages API has no field
for logprobs or token ids (vllm/entrypoints/anthropic/protocol.py), so its turns cannot train."""
_TOKEN = TOKEN_HEADER.encode()
_KEY_HEADERS = (b"authorization", _TOKEN, b"x-api-key")
"""Where a caller may present the gateway's token: ``x-api-key`` is where the Anthropic SDK
puts its ``api_key``."""
_RELAYED = re.compile(r"/runs/([^/]+)/v1/(.*)", re.DOTALL)
"""A run's OpenAI API: dispatched before Starlette's router and middleware, which cost a
stream's first byte about 0.1 ms and each of its chunks a wrapper call."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})


class GatewayApp:
    """Checks the gateway's token (when it has one) and what ``admission`` refuses, then
    routes the request."""

    def __init__(
        self,
        runs: Runs,
        upstream: Upstream,
        options: RunOptions,
        token: str | None,
        admission: Admission,
    ) -> None:
        self.runs, self.upstream, self.token = runs, upstream, token
        self.admission = admission
        remember(token)  # the gateway's keys are blanked out of records too
        remember(upstream.api_key)
        self.chains = Chains()
        """The ``previous_response_id`` chains of the runs that translate the Responses API."""
        api = RunAPI(runs, options)
        self.app = Starlette(
            routes=[
                Route("/runs", api.open, methods=["POST"]),
                Route("/runs/{run_id}", api.show, methods=["GET"]),
                Route("/runs/{run_id}/reward", api.reward, methods=["PUT", "POST"]),
                Route("/runs/{run_id}/close", api.close, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_error},
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.upstream.start()
        try:
            yield
        finally:
            await self.upstream.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The gateway's own upstream calls are not calls of a run of this process: a capture
        # layer below (an HTTP-level one) must not record them a second time.
        _context.capturing.set(True)
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = self.admission.origin(scope)
        if origin is not None:  # an allowed web page: answer its preflight, let it read
            preflight = self.admission.preflight(scope, origin)
            if preflight is not None:
                await preflight(scope, receive, send)
                return
            send = with_cors(send, origin)
        refused: Response | None = None
        if self.token is not None and not self._authorized(scope):
            refused = error(
                401,
                "arttrace gateway: this gateway needs its token, as `Authorization: Bearer "
                f"<token>` (the OpenAI client's api_key) or in an `{TOKEN_HEADER}` header",
                "authentication_error",
            )
        else:
            refused = self.admission.refusal(scope, origin)
        if refused is not None:
            await refused(scope, receive, send)
            return
        relayed = _RELAYED.fullmatch(scope["path"])
        if relayed is None:
            await self.app(scope, receive, send)
            return
        run_id, path = relayed.groups()
        relay: Response = (
            await self.relay(Request(scope, receive), run_id, path, _raw_tail(scope))
            if scope["method"] in _METHODS
            else error(405, f"arttrace gateway: {scope['method']} is not relayed")
        )
        await relay(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        return any(
            name in _KEY_HEADERS and self._is_token(value) for name, value in scope["headers"]
        )

    def _is_token(self, value: bytes) -> bool:
        given = value.decode("latin-1").removeprefix("Bearer ").strip()
        return self.token is not None and hmac.compare_digest(given, self.token)

    async def relay(self, request: Request, run_id: str, path: str, as_sent: str) -> Response:
        """Forward a call to ``path`` (decoded) of run ``run_id``; ``as_sent``: the path as the
        caller wrote it, which is what the upstream gets (it decodes it once, as if called
        directly; admission refused any path that could leave the run's ``/v1``)."""
        run = self.runs.get(run_id)
        if run is None:
            return unknown_run(run_id)
        run.trajectory.call_log.gateway_reached = True
        try:
            body = await request.body()
        except ClientDisconnect:  # the caller hung up while sending: nothing was called
            run.hung_up()
            return Response(status_code=499)
        raw = request.headers.raw
        if self.token is not None:  # the gateway's token, given as an Anthropic key
            raw = [(n, v) for n, v in raw if not (n == b"x-api-key" and self._is_token(v))]
        headers = upstream_headers(
            raw,
            drop_authorization=any(n == b"authorization" and self._is_token(v) for n, v in raw),
            api_key=self.upstream.api_key,
        )
        if request.method == "POST" and path in run.options.translate:
            answer = self._translated(request, run, path, body, headers)
            if isinstance(answer, Relay):
                answer.on_hang_up = run.hung_up
            return answer
        open_record: Callable[[], Recorder] | None = None
        if request.method == "POST" and path in _UNRECORDED:
            warn_unrecorded(_UNRECORDED[path], str(run.trajectory.example_id))
        elif request.method == "POST" and path in _RECORDED:
            parsed = _json_object(body)
            if parsed is not None:
                with guarded("the gateway preparing a call's record"):
                    remember_query(request.scope["query_string"])  # blanked out of the record
                    sent = run.body_to_send(path, parsed)
                    if sent is not parsed:
                        body = _dumps(sent)
                    open_record = partial(
                        run.open_recorder, path, sent, self.upstream.server, request.headers
                    )
        url = self.upstream.url(as_sent, request.scope["query_string"])
        relay = Relay(self.upstream, request.method, url, headers, body, open_record)
        relay.on_hang_up = run.hung_up
        return relay

    def _translated(
        self, request: Request, run: Run, api: str, body: bytes, headers: CIMultiDict[str]
    ) -> Response:
        """A call to ``api`` that the run translates: served by the upstream's Chat
        Completions, recorded as a chat call of the run (``_translate``)."""
        parsed = _json_object(body)
        if parsed is None:
            return refused(api, 400, "arttrace gateway: the request body is not a JSON object")

        def prepare(chat: dict[str, Any]) -> tuple[bytes, Callable[[], Recorder] | None]:
            open_record: Callable[[], Recorder] | None = None
            with guarded("the gateway preparing a translated call's record"):
                remember_query(request.scope["query_string"])
                chat = run.body_to_send("chat/completions", chat)
                open_record = partial(
                    run.open_recorder,
                    "chat/completions",
                    chat,
                    self.upstream.server,
                    request.headers,
                )
            return _dumps(chat), open_record

        return translated(api, parsed, self.chains, self.upstream, headers, prepare)


def _raw_tail(scope: Scope) -> str:
    """The part of the caller's raw path after ``/runs/<run_id>/v1/``: admission refused
    encoded slashes, so the raw path's segments are the decoded path's."""
    raw = scope.get("raw_path")
    if raw is None:
        return quote(scope["path"].split("/", 4)[4])
    return str(raw.decode("latin-1").split("/", 4)[4])


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # forwarded as is: the upstream says what is wrong with it
    return parsed if isinstance(parsed, dict) else None


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer beyond 64 bits
        import json

        return json.dumps(body).encode()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = (
            f"arttrace gateway: no route for {request.url.path}. A run's OpenAI base URL is "
            "/runs/<run_id>/v1 (from gateway.url(trajectory) or POST /runs)"
        )
    else:
        message = f"arttrace gateway: {exc.detail}"
    return error(exc.status_code, message)
