"""aiohttp under the HTTP-client layer: ``ClientSession._request``, which ``session.post``,
``session.request`` and their context managers reach.

The answer is read as the caller reads it: every read of aiohttp's ``StreamReader`` (``read``,
``readany``, ``iter_chunked``, ``readline``, line iteration, ``resp.read()``/``json()``) takes
its bytes through ``_read_nowait_chunk``. The response's reader is switched to a subclass that
adds no state (:class:`_TapReader`, same slots) and records each piece it hands out; the body
has ended when the reader is at its end and empty. Nothing changes for responses not recorded.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import aiohttp
import wrapt
from aiohttp.streams import StreamReader
from multidict import CIMultiDict

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_sent, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap

_taps: dict[int, tuple[StreamReader, Exchange]] = {}
"""The exchange of each tapped reader (its slots hold no room for one), until its end."""
_lock = threading.Lock()
_CLOSED = getattr(aiohttp.client_reqrep, "_CONNECTION_CLOSED_EXCEPTION", None)
"""What aiohttp sets on a reader whose response is closed or released early."""


def patch() -> None:
    if not ours(aiohttp.ClientSession.__dict__["_request"]):
        wrapt.wrap_function_wrapper(aiohttp.ClientSession, "_request", _request)


def unpatch() -> None:
    unwrap(aiohttp.ClientSession, "_request")


@starting
def _open(
    session: aiohttp.ClientSession, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Exchange, dict[str, Any]] | None:
    method, target = (*args, None, None)[:2]
    method, target = kwargs.get("method", method), kwargs.get("str_or_url", target)
    if not isinstance(method, str) or target is None:
        return None
    url = session._build_url(target)
    api = endpoint(method, url.path)
    if api is None:
        return None
    data, body = kwargs.get("data"), kwargs.get("json")
    if body is None and isinstance(data, bytes | str):
        body = data
    if body is None:
        return None
    params = kwargs.get("params")
    return open_sent(
        api,
        body,
        url.host,
        url.port,
        headers=_headers(session, kwargs),
        url=str(url.update_query(params) if params else url),
        send=kwargs,
        rewrite=functools.partial(_rewritten, kwargs),
        what="an aiohttp request",
    )


def _headers(session: aiohttp.ClientSession, kwargs: dict[str, Any]) -> list[Any]:
    """The headers that may carry this request's credentials: the session's and the call's,
    and the ``Authorization`` of their ``BasicAuth``."""
    pairs: list[Any] = [*session.headers.items(), *CIMultiDict(kwargs.get("headers") or {}).items()]
    for auth in (kwargs.get("auth"), session.auth):
        if isinstance(auth, aiohttp.BasicAuth):
            pairs.append(("authorization", auth.encode()))
    return pairs


def _rewritten(kwargs: dict[str, Any], body: Any) -> dict[str, Any]:
    """The keyword arguments of ``_request`` sending ``body`` (an object for ``json=``, else
    bytes for ``data=``, with the caller's ``Content-Length`` fixed)."""
    if kwargs.get("json") is not None:
        return {**kwargs, "json": body}
    sent = {**kwargs, "data": body}
    if kwargs.get("headers") is not None:
        sent["headers"] = CIMultiDict(kwargs["headers"])
        sized_headers(sent["headers"], body)
    return sent


@mark
def _request(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    opened = None if passing() else _open(instance, args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    return _recorded(wrapped, args, *opened)


async def _recorded(
    wrapped: Any, args: Any, exchange: Exchange, kwargs: dict[str, Any]
) -> aiohttp.ClientResponse:
    with _context.sending(exchange.failed):
        response: aiohttp.ClientResponse = await wrapped(*args, **kwargs)
    with guarded("watching an aiohttp response", exchange.lost):
        exchange.answered(response.status, response.headers.get("content-type"))
        _tap(response.content, exchange)
    return response


def _tap(reader: Any, exchange: Exchange) -> None:
    """Record what the caller reads from ``reader`` (a plain ``StreamReader``)."""
    if type(reader) is not StreamReader:
        raise TypeError(f"an aiohttp body reader of type {type(reader).__name__}")
    with _lock:
        _taps[id(reader)] = (reader, exchange)
    reader.__class__ = _TapReader
    reader.on_eof(functools.partial(_check, reader))


def _exchange(reader: StreamReader, *, end: bool = False) -> Exchange | None:
    with _lock:
        entry = _taps.pop(id(reader), None) if end else _taps.get(id(reader))
    return entry[1] if entry is not None and entry[0] is reader else None


def _check(reader: StreamReader) -> None:
    """The body has ended once the reader is at its end and the caller has read it all."""
    if reader._eof and not reader._buffer and reader._exception is None:
        exchange = _exchange(reader, end=True)
        if exchange is not None:
            exchange.ended()


class _TapReader(StreamReader):
    """aiohttp's reader, handing out the same bytes, each recorded first."""

    __slots__ = ()

    def _read_nowait_chunk(self, n: int) -> bytes:
        data = super()._read_nowait_chunk(n)
        exchange = _exchange(self)
        if exchange is not None:
            exchange.read(data)
            _check(self)
        return data

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        super().set_exception(exc, *args, **kwargs)
        exchange = _exchange(self, end=True)
        if exchange is None:
            return
        if exc is _CLOSED:  # the caller released the response before its end
            exchange.closed()
        else:
            exchange.failed(exc, partial=True)
