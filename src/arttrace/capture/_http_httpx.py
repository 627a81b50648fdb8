"""httpx under the HTTP-client layer: ``Client.send`` and ``AsyncClient.send``, which every
request of every transport passes through (LiteLLM's, its aiohttp-backed one included), in
httpx and in ``httpx2``, its fork with the same API that the ``anthropic`` SDK sends through.

A whole answer is recorded from ``response.content`` once ``send`` has read it; a streamed one
from its raw bytes as the caller reads them (``response.stream`` replaced by a tap that passes
every piece on as it comes).

A call in a protocol this process or run translates (``instrument(translate=...)``) is taken
over by the send hooks translation registers (``_context.send_hooks``): sent as a Chat
Completions call through the same client, recorded here as one (:func:`watch`), and answered
in the caller's protocol.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import httpx
import wrapt

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_sent, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap

_LIBRARIES = ("httpx", "httpx2")


def _libraries() -> list[ModuleType]:
    """httpx, and httpx2 when it is imported."""
    return [sys.modules[name] for name in _LIBRARIES if name in sys.modules]


def library_of(obj: Any, kind: str) -> Any:
    """The library (httpx or httpx2) whose ``kind`` class ``obj`` is an instance of, or
    ``None``."""
    for lib in _libraries():
        if isinstance(obj, getattr(lib, kind)):
            return lib
    return None


def patch() -> None:
    for lib in _libraries():
        for cls, wrapper in ((lib.Client, _send), (lib.AsyncClient, _asend)):
            if not ours(cls.__dict__["send"]):
                wrapt.wrap_function_wrapper(cls, "send", wrapper)


def unpatch() -> None:
    for lib in _libraries():
        unwrap(lib.Client, "send")
        unwrap(lib.AsyncClient, "send")


@starting
def _open(
    instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Exchange, httpx.Request] | None:
    """The exchange of this ``send`` and the request to send, or ``None`` to pass it."""
    request: Any = args[0] if args else kwargs.get("request")
    lib = library_of(request, "Request")
    if lib is None:
        return None
    api = endpoint(request.method, request.url.path)
    if api is None:
        return None
    try:
        body = request.content
    except lib.RequestNotRead:  # a streamed upload: not an LLM call's JSON
        return None
    return open_sent(
        api,
        body,
        request.url.host,
        request.url.port,
        headers=[*request.headers.multi_items(), *auth_headers(lib, instance, kwargs)],
        url=str(request.url),
        send=request,
        rewrite=functools.partial(_rewritten, lib, request),
        what="an httpx request",
    )


def _rewritten(lib: Any, request: httpx.Request, body: bytes) -> httpx.Request:
    """``request`` sending ``body``, its ``Content-Length`` fixed."""
    headers = request.headers.copy()
    sized_headers(headers, body)
    sent: httpx.Request = lib.Request(
        request.method, request.url, headers=headers, content=body, extensions=request.extensions
    )
    return sent


def auth_headers(lib: Any, client: Any, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``Authorization`` that httpx's ``auth`` (of this ``send``, else the client's) will
    add after this hook: a ``BasicAuth``'s is known in advance."""
    auth = kwargs.get("auth", lib.USE_CLIENT_DEFAULT)
    if auth is lib.USE_CLIENT_DEFAULT:
        auth = getattr(client, "auth", None)
    if isinstance(auth, tuple) and len(auth) == 2:
        auth = lib.BasicAuth(*auth)
    header = getattr(auth, "_auth_header", None)
    return [("authorization", header)] if isinstance(header, str) else []


def with_request(
    request: httpx.Request, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (request, *args[1:]), kwargs
    return args, {**kwargs, "request": request}


def _sender(is_async: bool) -> Any:
    """The wrapper of ``Client.send`` (of ``AsyncClient.send`` when ``is_async``)."""

    @mark
    def send(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        hooks = _context.send_hooks
        if hooks is not None:  # translation may take the call over
            answer = hooks[is_async](wrapped, instance, args, kwargs)
            if answer is not None:
                return answer
        opened = None if passing() else _open(instance, args, kwargs)
        if opened is None:
            return wrapped(*args, **kwargs)
        exchange, request = opened
        args, kwargs = with_request(request, args, kwargs)
        if is_async:
            return _asend_recorded(wrapped, args, kwargs, exchange)
        with _context.sending(exchange.failed):
            response = wrapped(*args, **kwargs)
        return watch(exchange, response, bool(kwargs.get("stream")))

    return send


_send, _asend = _sender(is_async=False), _sender(is_async=True)


async def _asend_recorded(
    wrapped: Any, args: Any, kwargs: dict[str, Any], exchange: Exchange
) -> httpx.Response:
    with _context.sending(exchange.failed):
        response: httpx.Response = await wrapped(*args, **kwargs)
    return watch(exchange, response, bool(kwargs.get("stream")))


def watch(exchange: Exchange, response: httpx.Response, streamed: bool) -> httpx.Response:
    """``response`` as ``send`` returned it, its body recorded as the caller reads it."""
    with guarded("watching an httpx response", exchange.lost):
        content_type = response.headers.get("content-type")
        if not streamed:
            exchange.whole(response.status_code, content_type, response.content)
            return response
        exchange.answered(
            response.status_code, content_type, response.headers.get("content-encoding")
        )
        response.stream = _tap(library_of(response, "Response") or httpx, response.stream, exchange)
    return response


def _tap(lib: Any, stream: Any, exchange: Exchange) -> Any:
    sync_tap, async_tap, tap = _taps(lib)
    sync = isinstance(stream, lib.SyncByteStream)
    if isinstance(stream, lib.AsyncByteStream):
        return tap(stream, exchange) if sync else async_tap(stream, exchange)
    return sync_tap(stream, exchange) if sync else stream


@functools.cache
def _taps(lib: Any) -> tuple[type[Any], type[Any], type[Any]]:
    """The tap classes of ``lib`` (its responses accept only its own stream classes)."""
    sync_tap = type("_SyncTap", (_SyncTap, lib.SyncByteStream), {})
    async_tap = type("_AsyncTap", (_AsyncTap, lib.AsyncByteStream), {})
    both = type("_Tap", (_SyncTap, _AsyncTap, lib.SyncByteStream, lib.AsyncByteStream), {})
    return sync_tap, async_tap, both


class _SyncTap:
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


class _AsyncTap:
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
