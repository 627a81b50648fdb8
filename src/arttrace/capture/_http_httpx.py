"""httpx under the HTTP-client layer: ``Client.send`` and ``AsyncClient.send``, which every
request of every transport passes through (LiteLLM's, its aiohttp-backed one included).

A whole answer is recorded from ``response.content`` once ``send`` has read it; a streamed one
from its raw bytes as the caller reads them (``response.stream`` replaced by a tap that passes
every piece on as it comes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import wrapt

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_exchange, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap


def patch() -> None:
    for cls, wrapper in ((httpx.Client, _send), (httpx.AsyncClient, _asend)):
        if not ours(cls.__dict__["send"]):
            wrapt.wrap_function_wrapper(cls, "send", wrapper)


def unpatch() -> None:
    unwrap(httpx.Client, "send")
    unwrap(httpx.AsyncClient, "send")


@starting
def _open(
    instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Exchange, httpx.Request] | None:
    """The exchange of this ``send`` and the request to send, or ``None`` to pass it."""
    request = args[0] if args else kwargs.get("request")
    if not isinstance(request, httpx.Request):
        return None
    api = endpoint(request.method, request.url.path)
    if api is None:
        return None
    try:
        body = request.content
    except httpx.RequestNotRead:  # a streamed upload: not an LLM call's JSON
        return None
    opened = open_exchange(
        api,
        body,
        request.url.host,
        request.url.port,
        headers=[*request.headers.multi_items(), *_auth(instance, kwargs)],
        url=str(request.url),
    )
    if opened is None:
        return None
    exchange, new_body = opened
    if new_body is None:
        return exchange, request
    with guarded("rewriting an httpx request", exchange.lost):
        headers = request.headers.copy()
        sized_headers(headers, new_body)
        return exchange, httpx.Request(
            request.method,
            request.url,
            headers=headers,
            content=new_body,
            extensions=request.extensions,
        )
    return exchange, request


def _auth(client: Any, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``Authorization`` that httpx's ``auth`` (of this ``send``, else the client's) will
    add after this hook: a ``BasicAuth``'s is known in advance."""
    auth = kwargs.get("auth", httpx.USE_CLIENT_DEFAULT)
    if auth is httpx.USE_CLIENT_DEFAULT:
        auth = getattr(client, "auth", None)
    if isinstance(auth, tuple) and len(auth) == 2:
        auth = httpx.BasicAuth(*auth)
    header = getattr(auth, "_auth_header", None)
    return [("authorization", header)] if isinstance(header, str) else []


def _args(
    request: httpx.Request, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (request, *args[1:]), kwargs
    return args, {**kwargs, "request": request}


@mark
def _send(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    opened = None if passing() else _open(instance, args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    exchange, request = opened
    args, kwargs = _args(request, args, kwargs)
    token = _context.capturing.set(True)
    try:
        response = wrapped(*args, **kwargs)
    except BaseException as error:
        exchange.failed(error, partial=False)
        raise
    finally:
        _context.capturing.reset(token)
    return _watch(exchange, response, bool(kwargs.get("stream")))


@mark
def _asend(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    opened = None if passing() else _open(instance, args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    exchange, request = opened
    args, kwargs = _args(request, args, kwargs)
    return _asend_recorded(wrapped, args, kwargs, exchange)


async def _asend_recorded(
    wrapped: Any, args: Any, kwargs: dict[str, Any], exchange: Exchange
) -> httpx.Response:
    token = _context.capturing.set(True)
    try:
        response: httpx.Response = await wrapped(*args, **kwargs)
    except BaseException as error:
        exchange.failed(error, partial=False)
        raise
    finally:
        _context.capturing.reset(token)
    return _watch(exchange, response, bool(kwargs.get("stream")))


def _watch(exchange: Exchange, response: httpx.Response, streamed: bool) -> httpx.Response:
    """``response`` as ``send`` returned it, its body recorded as the caller reads it."""
    with guarded("watching an httpx response", exchange.lost):
        content_type = response.headers.get("content-type")
        if not streamed:
            exchange.whole(response.status_code, content_type, response.content)
            return response
        exchange.answered(
            response.status_code, content_type, response.headers.get("content-encoding")
        )
        response.stream = _tap(response.stream, exchange)
    return response


def _tap(stream: Any, exchange: Exchange) -> Any:
    sync = isinstance(stream, httpx.SyncByteStream)
    if isinstance(stream, httpx.AsyncByteStream):
        return _Tap(stream, exchange) if sync else _AsyncTap(stream, exchange)
    return _SyncTap(stream, exchange) if sync else stream


class _SyncTap(httpx.SyncByteStream):
    """The response's byte stream, each piece recorded before it is passed on."""

    def __init__(self, stream: Any, exchange: Exchange) -> None:
        self.stream, self.exchange = stream, exchange

    def __iter__(self) -> Iterator[bytes]:
        return self.exchange.pieces(self.stream)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            self.exchange.closed()


class _AsyncTap(httpx.AsyncByteStream):
    """:class:`_SyncTap` for an async stream."""

    def __init__(self, stream: Any, exchange: Exchange) -> None:
        self.stream, self.exchange = stream, exchange

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.exchange.apieces(self.stream)

    async def aclose(self) -> None:
        try:
            await self.stream.aclose()
        finally:
            self.exchange.closed()


class _Tap(_SyncTap, _AsyncTap):
    """A stream that is both (``httpx.ByteStream``, a mock transport's)."""
