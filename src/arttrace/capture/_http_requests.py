"""requests under the HTTP-client layer: ``Session.send``, which ``requests.post`` and every
session method reach.

A whole answer is recorded from ``response.content`` once ``send`` has read it; a streamed one
(``stream=True``) from the decoded pieces the caller reads through ``response.raw`` (which
``iter_content``, ``iter_lines`` and ``content`` use), passed on as they come.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterator
from typing import Any

import requests
import wrapt

from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_sent, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap


def patch() -> None:
    if not ours(requests.Session.__dict__["send"]):
        wrapt.wrap_function_wrapper(requests.Session, "send", _send)


def unpatch() -> None:
    unwrap(requests.Session, "send")


@starting
def _open(request: Any) -> tuple[Exchange, Any] | None:
    """The exchange of this ``send`` and the request to send, or ``None`` to pass it."""
    if not isinstance(request, requests.PreparedRequest) or request.url is None:
        return None
    url = urllib.parse.urlsplit(request.url)
    api = endpoint(request.method or "", url.path)
    body = request.body
    if api is None or not isinstance(body, bytes | str):
        return None
    return open_sent(
        api,
        body,
        url.hostname,
        url.port,
        headers=request.headers,
        url=request.url,
        send=request,
        rewrite=functools.partial(_rewritten, request),
        what="a requests request",
    )


def _rewritten(request: requests.PreparedRequest, body: bytes) -> Any:
    """``request`` sending ``body``, its ``Content-Length`` fixed."""
    sent = request.copy()
    sent.body = body
    sized_headers(sent.headers, body)
    return sent


@mark
def _send(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    request = args[0] if args else kwargs.get("request")
    opened = None if passing() else _open(request)
    if opened is None:
        return wrapped(*args, **kwargs)
    exchange, request = opened
    if args:
        args = (request, *args[1:])
    else:
        kwargs = {**kwargs, "request": request}
    with _context.sending(exchange.failed):
        response = wrapped(*args, **kwargs)
    with guarded("watching a requests response", exchange.lost):
        content_type = response.headers.get("content-type")
        if not kwargs.get("stream"):
            exchange.whole(response.status_code, content_type, response.content)
        elif response.raw is not None:
            exchange.answered(response.status_code, content_type)
            response.raw = _Raw(response.raw, exchange)
    return response


class _Raw(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """urllib3's response as requests reads it, each decoded piece recorded on the way."""

    def __init__(self, raw: Any, exchange: Exchange) -> None:
        super().__init__(raw)
        self._self_exchange = exchange

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        return self._self_exchange.pieces(self.__wrapped__.stream(*args, **kwargs))

    def read(self, *args: Any, **kwargs: Any) -> Any:
        exchange = self._self_exchange
        try:
            piece = self.__wrapped__.read(*args, **kwargs)
        except Exception as error:
            exchange.failed(error, partial=True)
            raise
        if piece:
            exchange.read(piece)
        elif (args[0] if args else kwargs.get("amt")) != 0:
            exchange.ended()
        return piece

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_exchange.closed()
