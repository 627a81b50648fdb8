"""DSPy's default engine under the HTTP-client layer.

DSPy 3.4's native engine (its vendored lm15) sends with its own HTTP/1.1 transports on bare
sockets, not with httpx, requests or ``http.client``: every request passes through
``StdlibTransport.stream`` (sync) or ``StdlibAsyncTransport._do_stream`` (async), which return
a response whose iteration yields the body's pieces. The pieces are recorded as the caller
iterates (its ``read()`` and ``iter_lines()`` iterate too); a response released before its
end is abandoned.
"""

from __future__ import annotations

import dataclasses
import functools
import urllib.parse
from typing import Any

import wrapt
from dspy._vendor.lm15.transports import StdlibAsyncTransport, StdlibTransport

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_sent, passing, starting
from ._unwrap import mark, ours, unwrap


def patch() -> None:
    for cls, name, wrapper in _HOOKS:
        if not ours(cls.__dict__[name]):
            wrapt.wrap_function_wrapper(cls, name, wrapper)


def unpatch() -> None:
    for cls, name, _ in _HOOKS:
        unwrap(cls, name)


@starting
def _open(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Exchange, Any] | None:
    request: Any = args[0] if args else kwargs.get("request")
    url = urllib.parse.urlsplit(getattr(request, "url", "") or "")
    api = endpoint(getattr(request, "method", ""), url.path)
    if api is None:
        return None
    return open_sent(
        api,
        request.body,
        url.hostname,
        url.port,
        headers=getattr(request, "headers", None),
        url=getattr(request, "url", None),
        send=request,
        rewrite=functools.partial(_rewritten, request),
        what="a DSPy request",
    )


def _rewritten(request: Any, body: bytes) -> Any:
    """``request`` (a ``TransportRequest``) sending ``body``, its ``Content-Length`` fixed."""
    headers = [
        (k, str(len(body)) if k.lower() == "content-length" else v) for k, v in request.headers
    ]
    return dataclasses.replace(request, body=body, headers=headers)


@mark
def _stream(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    opened = None if passing() else _open(args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    exchange, request = opened
    with _context.sending(exchange.failed):
        response = wrapped(request)
    with guarded("watching a DSPy response", exchange.lost):
        _watch(exchange, response, exchange.pieces(response._chunks))
        release = response._release

        def released(body_consumed: bool) -> Any:
            try:
                return release(body_consumed)
            finally:
                exchange.closed()

        response._release = released
    return response


@mark
def _do_stream(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    opened = None if passing() else _open(args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    return _do_stream_recorded(wrapped, *opened)


async def _do_stream_recorded(wrapped: Any, exchange: Exchange, request: Any) -> Any:
    with _context.sending(exchange.failed):
        response = await wrapped(request)
    with guarded("watching a DSPy response", exchange.lost):
        _watch(exchange, response, exchange.apieces(response._chunks))
        release = response._release

        async def released(body_consumed: bool) -> Any:
            try:
                return await release(body_consumed)
            finally:
                exchange.closed()

        response._release = released
    return response


def _watch(exchange: Exchange, response: Any, pieces: Any) -> None:
    """The response's pieces pass through ``pieces`` (the caller's iteration drives it)."""
    exchange.answered(response.status, response.header("content-type"))
    response._chunks = pieces


_HOOKS = ((StdlibTransport, "stream", _stream), (StdlibAsyncTransport, "_do_stream", _do_stream))
