"""The standard library's ``http.client`` under the HTTP-client layer (``urllib.request`` sends
through it): ``HTTPConnection.request`` opens the record, ``getresponse`` returns the response
behind a proxy that records each piece the caller reads (``read``, ``read1``, ``readinto``,
``readline``, iteration). The body has ended when ``http.client`` lets go of the socket.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from http.client import HTTPConnection, HTTPResponse
from typing import Any

import wrapt

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_sent, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap

_PENDING = "_arttrace_exchange"
"""Where a connection keeps the exchange of its request until ``getresponse``."""


def patch() -> None:
    for name, wrapper in (("request", _request), ("getresponse", _getresponse)):
        if not ours(HTTPConnection.__dict__[name]):
            wrapt.wrap_function_wrapper(HTTPConnection, name, wrapper)


def unpatch() -> None:
    unwrap(HTTPConnection, "request")
    unwrap(HTTPConnection, "getresponse")


@mark
def _request(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    instance.__dict__.pop(_PENDING, None)
    opened = None if passing() else _open(instance, args, kwargs)
    if opened is None:
        return wrapped(*args, **kwargs)
    exchange, (args, kwargs) = opened
    with _context.sending(exchange.failed):
        result = wrapped(*args, **kwargs)
    instance.__dict__[_PENDING] = exchange
    return result


@starting
def _open(
    connection: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Exchange, tuple[tuple[Any, ...], dict[str, Any]]] | None:
    """The exchange of this ``request`` and the arguments to send, or ``None`` to pass it."""
    call = _Call(*args, **kwargs)
    api = endpoint(call.method, urllib.parse.urlsplit(call.url).path)
    if api is None or not isinstance(call.body, bytes | str):
        return None
    return open_sent(
        api,
        call.body,
        connection.host,
        connection.port,
        headers=call.headers,
        url=call.url,
        send=(args, kwargs),
        rewrite=call.sending,
        what="an http.client request",
    )


class _Call:
    """The arguments of ``HTTPConnection.request``, by name."""

    def __init__(
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: Any = None,
        **keywords: Any,
    ) -> None:
        self.method, self.url, self.body = method, url, body
        self.headers = headers or {}
        self.keywords = keywords

    def sending(self, body: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments of ``request`` sending ``body``, its ``Content-Length`` fixed."""
        headers = dict(self.headers)
        sized_headers(headers, body)
        return (self.method, self.url, body, headers), self.keywords


@mark
def _getresponse(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    exchange: Exchange | None = instance.__dict__.pop(_PENDING, None)
    if exchange is None:
        return wrapped(*args, **kwargs)
    with _context.sending(exchange.failed):
        response = wrapped(*args, **kwargs)
    with guarded("watching an http.client response", exchange.lost):
        exchange.answered(
            response.status,
            response.getheader("content-type"),
            response.getheader("content-encoding"),
        )
        watched = _Response(response, exchange)
        watched._self_check()  # a body that was empty has ended already
        return watched
    return response


class _Response(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """``HTTPResponse`` as the caller knows it, each piece read recorded."""

    def __init__(self, response: HTTPResponse, exchange: Exchange) -> None:
        super().__init__(response)
        self._self_exchange = exchange

    def _self_read(self, method: str, *args: Any) -> Any:
        try:
            piece = getattr(self.__wrapped__, method)(*args)
        except Exception as error:
            self._self_exchange.failed(error, partial=True)
            raise
        if piece:
            self._self_exchange.read(piece)
        self._self_check()
        return piece

    def _self_check(self) -> None:
        if self.__wrapped__.fp is None:  # http.client let go of the socket: the body ended
            self._self_exchange.ended()

    def read(self, *args: Any) -> bytes:
        return self._self_read("read", *args)  # type: ignore[no-any-return]

    def read1(self, *args: Any) -> bytes:
        return self._self_read("read1", *args)  # type: ignore[no-any-return]

    def readline(self, *args: Any) -> bytes:
        return self._self_read("readline", *args)  # type: ignore[no-any-return]

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines = []
        for line in self:
            lines.append(line)
            if 0 < hint <= sum(map(len, lines)):
                break
        return lines

    def readinto(self, buffer: Any) -> int:
        try:
            count: int = self.__wrapped__.readinto(buffer)
        except Exception as error:
            self._self_exchange.failed(error, partial=True)
            raise
        if count:
            self._self_exchange.read(bytes(memoryview(buffer)[:count]))
        self._self_check()
        return count

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_exchange.closed()
