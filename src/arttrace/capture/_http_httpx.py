"""httpx under the HTTP-client layer: ``Client.send`` and ``AsyncClient.send``, which every
request of every transport passes through (LiteLLM's, its aiohttp-backed one included), in
httpx and in ``httpx2``, its fork with the same API that the ``anthropic`` SDK sends through.

A whole answer is recorded from ``response.content`` once ``send`` has read it; a streamed one
from its raw bytes as the caller reads them (``response.stream`` replaced by a tap that passes
every piece on as it comes).

A call in a protocol this process or run translates (``instrument(translate=...)``, see
:mod:`arttrace.translation._inprocess`) is sent as a Chat Completions call through the same
client, recorded as one, and answered in the caller's protocol.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import httpx
import orjson
import wrapt

from ..translation import _inprocess
from . import _context
from ._guard import guarded
from ._http import Exchange, endpoint, open_exchange, passing, sized_headers, starting
from ._unwrap import mark, ours, unwrap

_LIBRARIES = ("httpx", "httpx2")


def _libraries() -> list[ModuleType]:
    """httpx, and httpx2 when it is imported."""
    return [sys.modules[name] for name in _LIBRARIES if name in sys.modules]


def _library(obj: Any, kind: str) -> Any:
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
    lib = _library(request, "Request")
    if lib is None:
        return None
    api = endpoint(request.method, request.url.path)
    if api is None:
        return None
    try:
        body = request.content
    except lib.RequestNotRead:  # a streamed upload: not an LLM call's JSON
        return None
    opened = open_exchange(
        api,
        body,
        request.url.host,
        request.url.port,
        headers=[*request.headers.multi_items(), *_auth(lib, instance, kwargs)],
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
        return exchange, lib.Request(
            request.method,
            request.url,
            headers=headers,
            content=new_body,
            extensions=request.extensions,
        )
    return exchange, request


def _auth(lib: Any, client: Any, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``Authorization`` that httpx's ``auth`` (of this ``send``, else the client's) will
    add after this hook: a ``BasicAuth``'s is known in advance."""
    auth = kwargs.get("auth", lib.USE_CLIENT_DEFAULT)
    if auth is lib.USE_CLIENT_DEFAULT:
        auth = getattr(client, "auth", None)
    if isinstance(auth, tuple) and len(auth) == 2:
        auth = lib.BasicAuth(*auth)
    header = getattr(auth, "_auth_header", None)
    return [("authorization", header)] if isinstance(header, str) else []


def _args(
    request: httpx.Request, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        return (request, *args[1:]), kwargs
    return args, {**kwargs, "request": request}


@starting
def _translating(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The translation of this ``send`` (or the caller's 400 when it cannot be translated),
    or ``None`` to send it as it is."""
    if _context.shim_settings() is None:
        return None  # instrument() is off
    request: Any = args[0] if args else kwargs.get("request")
    lib = _library(request, "Request")
    if lib is None:
        return None
    api = _inprocess.api_of(request.method, request.url.path)
    if api is None or _context.records_itself(request.url.host, request.url.port):
        return None  # not translated here, or a gateway of this process decides
    return _inprocess.Translated.open(api, request, lib)


def _chat(
    translated: _inprocess.Translated, instance: Any, args: Any, kwargs: dict[str, Any]
) -> tuple[Exchange | None, Any, dict[str, Any]]:
    """The record of a translated call (``None`` when nothing keeps it, or a layer above
    records it) and the ``send`` arguments of its Chat Completions request."""
    body = orjson.dumps(translated.translation.upstream_body)
    exchange = None
    if _context.recording() and (not _context.capturing.get() or _inprocess.aside.get()):
        url = translated.request.url
        opened = open_exchange(
            "chat/completions",
            body,
            url.host,
            url.port,
            headers=[
                *translated.request.headers.multi_items(),
                *_auth(translated.lib, instance, kwargs),
            ],
            url=str(url),
        )
        if opened is not None:
            exchange, sent = opened
            body = sent if sent is not None else body
            if _inprocess.aside.get():
                _named(exchange)
    args, kwargs = _args(translated.chat_request(body), args, kwargs)
    return exchange, args, kwargs


def _named(exchange: Exchange) -> None:
    """A call the SDK shim stood aside for is named as the shim names its calls (a framework
    hook, such as the OpenAI Agents SDK's, names its agent and step)."""
    shim = sys.modules.get("arttrace.capture._openai")
    call = getattr(exchange.recorder, "capture", None)
    if shim is None or call is None:
        return
    for namer in shim._namers:
        with guarded("naming a call", call.lost):
            namer(call)


def _send_translated(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    translated = _translating(args, kwargs)
    if translated is None:
        return None
    if not isinstance(translated, _inprocess.Translated):  # the caller's 400
        return translated
    exchange, args, kwargs = _chat(translated, instance, args, kwargs)
    token = _context.capturing.set(True)
    try:
        response = wrapped(*args, **kwargs)
    except BaseException as error:
        if exchange is not None:
            exchange.failed(error, partial=False)
        raise
    finally:
        _context.capturing.reset(token)
    streamed = bool(kwargs.get("stream"))
    if exchange is not None:
        response = _watch(exchange, response, streamed)
    if response.status_code >= 300 or not translated.translation.stream or not streamed:
        try:
            data = response.read()
        finally:
            response.close()
        if response.status_code >= 300:
            return translated.error_response(response.status_code, data)
        return translated.whole(data)
    return translated.streamed(response, is_async=False)


async def _asend_translated(
    wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any], translated: Any
) -> Any:
    if not isinstance(translated, _inprocess.Translated):  # the caller's 400
        return translated
    exchange, args, kwargs = _chat(translated, instance, args, kwargs)
    token = _context.capturing.set(True)
    try:
        response = await wrapped(*args, **kwargs)
    except BaseException as error:
        if exchange is not None:
            exchange.failed(error, partial=False)
        raise
    finally:
        _context.capturing.reset(token)
    streamed = bool(kwargs.get("stream"))
    if exchange is not None:
        response = _watch(exchange, response, streamed)
    if response.status_code >= 300 or not translated.translation.stream or not streamed:
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        if response.status_code >= 300:
            return translated.error_response(response.status_code, data)
        return translated.whole(data)
    return translated.streamed(response, is_async=True)


@mark
def _send(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if _inprocess.active():
        answer = _send_translated(wrapped, instance, args, kwargs)
        if answer is not None:
            return answer
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
    if _inprocess.active():
        translated = _translating(args, kwargs)
        if translated is not None:
            return _asend_translated(wrapped, instance, args, kwargs, translated)
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
        response.stream = _tap(_library(response, "Response") or httpx, response.stream, exchange)
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
