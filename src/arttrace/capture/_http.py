"""The HTTP-client layer: the calls of clients arttrace does not wrap, read off the wire.

While :func:`arttrace.instrument` is on, each HTTP client is hooked when the application
imports it (never before): httpx and its fork httpx2 (``Client.send``, ``AsyncClient.send``),
aiohttp (``ClientSession._request``), requests (``Session.send``), the standard library's
``http.client`` (``HTTPConnection``, under ``urllib.request``) and the socket transports of
DSPy's default engine (lm15's ``StdlibTransport``). A ``POST`` to an OpenAI-compatible path
(``/chat/completions``, ``/responses``, ``/completions``) made where a run or a span would keep
it is recorded by the wire recorders (:func:`._wire.open_recorder`), as the gateway records.

Exactly one layer records a call: while a captured OpenAI SDK call runs, or an outer HTTP
client's send (httpx over aiohttp, requests over ``http.client``), ``_context.capturing`` is
set and this layer passes the call through untouched. A framework's record of the same call is
merged with this one (:mod:`._layers`).

What the caller sees does not change: the answer's bytes are read on the side as the caller
reads them (a stream is never buffered); the only change to a request is on a policy call,
``logprobs`` / ``return_token_ids`` added to the JSON body unless the caller set them or
``instrument(request_training_data=False)``. Every step runs under :func:`._guard.guarded`.
"""

from __future__ import annotations

import functools
import importlib
import sys
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from . import _context
from ._guard import guarded
from ._imports import when_imported
from ._redact import remember_request
from ._sse import EventReader

if TYPE_CHECKING:
    from ._wire import Recorder

SOURCE = "http"
"""The ``source`` of this layer's records."""
_HOOKS = {
    "httpx": "_http_httpx",
    "httpx2": "_http_httpx",  # httpx's fork, which the anthropic SDK sends through
    "aiohttp": "_http_aiohttp",
    "requests": "_http_requests",
    "http.client": "_http_stdlib",
    "dspy._vendor.lm15.transports": "_http_lm15",
}
"""Client module -> the module of arttrace that hooks it (``patch()`` / ``unpatch()``)."""
_ENDPOINTS = (
    ("/chat/completions", "chat/completions"),
    ("/responses", "responses"),
    ("/completions", "completions"),
)
_on = False
_P = ParamSpec("_P")
_R = TypeVar("_R")


def install() -> None:
    """Hook each client now if it is imported, else when it is (idempotent)."""
    global _on
    _on = True
    for client, hook in _HOOKS.items():
        when_imported(client, functools.partial(_on_import, hook), key=(__name__, client))


def uninstall() -> None:
    """Remove the hooks (those under another library's wrapper stay, inert)."""
    global _on
    _on = False
    for hook in _HOOKS.values():
        module = sys.modules.get(f"{__package__}.{hook}")
        if module is not None:
            with guarded(f"unhooking {hook}"):
                module.unpatch()


def _on_import(hook: str, _module: ModuleType) -> None:
    if _on:
        with guarded(f"hooking an HTTP client ({hook}); its calls are not recorded"):
            importlib.import_module(f"{__package__}.{hook}").patch()


def starting(open_call: Callable[_P, _R | None]) -> Callable[_P, _R | None]:
    """``open_call`` (a client hook's first step: is this a call to record, and how to send
    it), guarded: if arttrace fails there, the call passes untouched (and the failure is
    logged)."""

    @functools.wraps(open_call)
    def start(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        with guarded("starting the record of an HTTP call"):
            return open_call(*args, **kwargs)
        return None

    return start


def passing() -> bool:
    """Whether every call passes untouched now (capture off, or another layer recording): the
    first, cheapest check of every hook. If arttrace fails deciding, the call passes."""
    with _DECIDING:
        return not _on or _context.capturing.get()
    return True


_DECIDING = guarded("deciding whether to record an HTTP call; it passes untouched")
"""One guard for every call (it holds no state)."""


def endpoint(method: str, path: str) -> str | None:
    """The API a request calls (``chat/completions``, ``responses``, ``completions``), or
    ``None`` when this layer lets it pass: not a ``POST`` to such a path, or nothing that would
    keep the record (after :func:`passing`)."""
    if method.upper() != "POST":
        return None
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, name in _ENDPOINTS:
        if path.endswith(suffix):
            if _context.shim_settings() is None or not _context.recording():
                return None
            return name
    return None


class _Address:
    __slots__ = ("host", "port")

    def __init__(self, host: str, port: int | None) -> None:
        self.host, self.port = host, port


class _Server:
    """What a call's span says of the server (``server.address``, ``server.port``)."""

    __slots__ = ("base_url",)

    def __init__(self, base_url: _Address) -> None:
        self.base_url = base_url


def open_exchange(
    api: str,
    body: Any,
    host: str | None,
    port: int | None,
    *,
    headers: Any = None,
    url: Any = None,
) -> tuple[Exchange, Any] | None:
    """The exchange recording a call to ``api`` with JSON ``body`` (its bytes, or the object
    a client will serialise), and the body to send instead, in the same form (``None``: send
    the caller's). ``None`` when the body is not a JSON object or arttrace failed (the call
    then passes untouched; the failure is logged). The credentials in ``headers`` and in the
    query of ``url`` are blanked out of whatever is recorded (:mod:`._redact`)."""
    with guarded("starting the record of an HTTP call"):
        remember_request(headers, url)
        if not body or _context.records_itself(host, port):
            return None  # no JSON to read, or an arttrace.Gateway here records the call
        import orjson

        from ._wire import open_recorder

        try:
            parsed = orjson.loads(body) if isinstance(body, bytes | str) else body
        except orjson.JSONDecodeError:
            return None  # not a JSON body: not a call this layer can read
        settings = _context.shim_settings()
        if not isinstance(parsed, dict) or settings is None:
            return None
        recorder, sent = open_recorder(
            api, parsed, settings, _Server(_Address(host or "", port)), source=SOURCE
        )
        exchange = Exchange(recorder)
        if sent == parsed:
            return exchange, None
        if parsed is body:
            return exchange, sent
        with guarded("asking for exact tokens in an HTTP call", exchange.lost):
            return exchange, orjson.dumps(sent)
        return exchange, None  # sent as the caller wrote it; the call is marked
    return None


def open_sent(
    api: str,
    body: Any,
    host: str | None,
    port: int | None,
    *,
    headers: Any,
    url: Any,
    send: _R,
    rewrite: Callable[[Any], _R],
    what: str,
) -> tuple[Exchange, _R] | None:
    """:func:`open_exchange`, and what the client hook sends: ``send`` (the caller's request)
    while its body stays, else ``rewrite(new_body)``; if rewriting ``what`` fails, ``send``
    (the failure is logged, the call marked)."""
    opened = open_exchange(api, body, host, port, headers=headers, url=url)
    if opened is None:
        return None
    exchange, new_body = opened
    if new_body is None:
        return exchange, send
    with guarded(f"rewriting {what}", exchange.lost):
        return exchange, rewrite(new_body)
    return exchange, send


def sized_headers(headers: Any, body: bytes) -> None:
    """Fix ``headers``' ``Content-Length`` (a mutable mapping) to ``body``, where it is set."""
    for name in [n for n in headers if isinstance(n, str) and n.lower() == "content-length"]:
        headers[name] = str(len(body))


class Exchange:
    """One recorded call's answer, read on the side as the caller reads it.

    The client hook tells it the status and headers (:meth:`answered`), each piece of the body
    as the caller gets it (:meth:`read`), and how it ended (:meth:`ended`, :meth:`failed`,
    :meth:`closed`). A server-sent-events body is fed to the recorder event by event; any other
    body whole at its end. Every method is guarded: a failure marks the call, never the caller.
    """

    __slots__ = ("_body", "_decode", "_events", "_reading", "_status", "done", "recorder")

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.done = False
        self._status = 0
        self._events: EventReader | None = None
        self._body = bytearray()
        self._decode: Callable[[bytes], bytes] | None = None
        self._reading = guarded("reading an HTTP call's answer", self.lost)

    def answered(self, status: int, content_type: str | None, encoding: str | None = None) -> None:
        """The answer's head arrived; ``encoding``: its ``Content-Encoding`` when the pieces
        will come as sent (not yet decoded)."""
        with guarded("reading an HTTP call's status", self.lost):
            self._status = status
            if status < 300 and (content_type or "").startswith("text/event-stream"):
                self._events = EventReader()
            if encoding:
                self._decode = _decoder(encoding)

    def read(self, piece: bytes) -> None:
        """A piece of the body, as the caller gets it."""
        if self.done:
            return
        with self._reading:
            if self._decode is not None:
                piece = self._decode(piece)
            if self._events is None:
                self._body += piece
                return
            for data in self._events.feed(piece):
                self.recorder.event(data)

    def pieces(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` (the body's pieces), each passed on as it comes and read on the way;
        their end, a failure, or the caller stopping early is recorded."""
        with self:
            for piece in chunks:
                self.read(piece)
                yield piece

    async def apieces(self, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """:meth:`pieces` of an async body."""
        with self:
            async for piece in chunks:
                self.read(piece)
                yield piece

    def __enter__(self) -> None:
        """``with exchange:`` around the reading of the body's pieces, whose end it records."""

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        if error is None:
            self.ended()
        elif isinstance(error, GeneratorExit):  # the caller stopped reading
            self.closed()
        elif isinstance(error, Exception):
            self.failed(error, partial=True)

    def ended(self) -> None:
        """The body ended (the caller has it all)."""
        if self.done:
            return
        with guarded("ending an HTTP call's record", self.lost):
            self.done = True
            if self._events is None:
                self.recorder.whole(self._status, bytes(self._body))
            else:
                self.recorder.ended()

    def whole(self, status: int, content_type: str | None, data: bytes) -> None:
        """The whole answer at once (a client that read it before returning)."""
        self.answered(status, content_type)
        self.read(data)
        self.ended()

    def failed(self, error: BaseException, *, partial: bool) -> None:
        """The call raised (``partial``: after part of the answer had arrived)."""
        if self.done:
            return
        self.done = True
        with guarded("recording a failed HTTP call", self.lost):
            if isinstance(error, Exception):
                self.recorder.failed(error, partial=partial)
            else:  # cancelled, interrupted
                self.recorder.abandoned(f"the call was interrupted ({type(error).__name__})")

    def closed(self) -> None:
        """The caller closed the answer: abandoned, unless it had read it all."""
        if self.done:
            return
        self.done = True
        with guarded("recording an abandoned HTTP call", self.lost):
            self.recorder.abandoned("the caller closed the response before its end")

    def lost(self, error: BaseException) -> None:
        """arttrace failed recording this call (already logged): it ends, kept as context and
        marked; the rest of the answer is not read."""
        self.done = True
        self.recorder.lost(error)


class UnreadableEncoding(ValueError):
    """A body compressed in a way this layer does not decode."""


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    value = encoding.strip().lower()
    if value in ("", "identity"):
        return None
    if value in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(zlib.MAX_WBITS | 32).decompress  # gzip or zlib header
    raise UnreadableEncoding(f"arttrace cannot read a body with Content-Encoding {encoding!r}")
