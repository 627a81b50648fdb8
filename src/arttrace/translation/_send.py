"""The translated httpx ``send``: a call in a protocol this process or run translates
(:mod:`._inprocess`) is sent as a Chat Completions call through the same client, recorded by
the HTTP layer as one (:mod:`arttrace.capture._http_httpx`, which calls :func:`send` and
:func:`asend` through the hooks :mod:`._inprocess` registers, and which tell them the
protocols translated here and whether the SDK shim stood aside), and answered in the caller's
protocol, whole or streamed.

Loaded by the first send that may be translated: httpx (or httpx2) is imported by then.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ..capture import _context
from ..capture._guard import guarded
from ..capture._http import Exchange, open_exchange, starting
from ..capture._http_httpx import auth_headers, library_of, watch, with_request
from ..capture._sse import EventReader
from ._base import Translation, TranslationError
from ._registry import open_translation, refusal, upstream_message
from ._responses import Chains

if TYPE_CHECKING:
    import httpx  # or httpx2

_SUFFIXES = (("/responses", "responses"), ("/messages", "messages"))
_CHAINS = Chains()
"""This process's ``previous_response_id`` chains."""


def api_of(method: str, path: str, apis: frozenset[str]) -> str | None:
    """The protocol a request speaks, if it is one of ``apis`` (``None``: send it as is)."""
    if method.upper() != "POST":
        return None
    path = path.rstrip("/")
    for suffix, api in _SUFFIXES:
        if path.endswith(suffix) and "/threads/" not in path:  # not the Assistants API's
            return api if api in apis else None
    return None


def send(
    wrapped: Any,
    instance: Any,
    args: Any,
    kwargs: dict[str, Any],
    apis: frozenset[str],
    aside: bool,
    is_async: bool,
) -> Any:
    """The answer of an httpx ``Client.send`` in one of ``apis`` (of ``AsyncClient.send`` when
    ``is_async``: a coroutine of it), or ``None`` to send it as is; ``aside``: the SDK shim
    stood aside for the call (the HTTP layer records it)."""
    translated = _translating(args, kwargs, apis)
    if translated is None:
        return None
    if is_async:
        return _asend(wrapped, instance, args, kwargs, translated, aside)
    if not isinstance(translated, Translated):  # the caller's 400
        return translated
    exchange, args, kwargs = _chat(translated, instance, args, kwargs, aside)
    with _context.sending(None if exchange is None else exchange.failed):
        response = wrapped(*args, **kwargs)
    response = _watched(exchange, response, kwargs)
    if translated.streams(response, kwargs):
        return translated.streamed(response, is_async=False)
    try:
        data = response.read()
    finally:
        response.close()
    return translated.answer(response.status_code, data)


async def _asend(
    wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any], translated: Any, aside: bool
) -> Any:
    if not isinstance(translated, Translated):  # the caller's 400
        return translated
    exchange, args, kwargs = _chat(translated, instance, args, kwargs, aside)
    with _context.sending(None if exchange is None else exchange.failed):
        response = await wrapped(*args, **kwargs)
    response = _watched(exchange, response, kwargs)
    if translated.streams(response, kwargs):
        return translated.streamed(response, is_async=True)
    try:
        data = await response.aread()
    finally:
        await response.aclose()
    return translated.answer(response.status_code, data)


@starting
def _translating(args: tuple[Any, ...], kwargs: dict[str, Any], apis: frozenset[str]) -> Any:
    """The translation of this ``send`` (or the caller's 400 when it cannot be translated),
    or ``None`` to send it as it is."""
    if _context.shim_settings() is None:
        return None  # instrument() is off
    request: Any = args[0] if args else kwargs.get("request")
    lib = library_of(request, "Request")
    if lib is None:
        return None
    api = api_of(request.method, request.url.path, apis)
    if api is None or _context.records_itself(request.url.host, request.url.port):
        return None  # not translated here, or a gateway of this process decides
    return Translated.open(api, request, lib)


def _chat(
    translated: Translated, instance: Any, args: Any, kwargs: dict[str, Any], aside: bool
) -> tuple[Exchange | None, Any, dict[str, Any]]:
    """The record of a translated call (``None`` when nothing keeps it, or a layer above
    records it) and the ``send`` arguments of its Chat Completions request."""
    body = orjson.dumps(translated.translation.upstream_body)
    exchange = None
    if _context.recording() and (not _context.capturing.get() or aside):
        url = translated.request.url
        opened = open_exchange(
            "chat/completions",
            body,
            url.host,
            url.port,
            headers=[
                *translated.request.headers.multi_items(),
                *auth_headers(translated.lib, instance, kwargs),
            ],
            url=str(url),
        )
        if opened is not None:
            exchange, sent = opened
            body = sent if sent is not None else body
            if aside:
                _named(exchange)
    args, kwargs = with_request(translated.chat_request(body), args, kwargs)
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


def _watched(exchange: Exchange | None, response: Any, kwargs: dict[str, Any]) -> Any:
    """The upstream's ``response``, recorded as it is read when the call is recorded here."""
    return response if exchange is None else watch(exchange, response, bool(kwargs.get("stream")))


class Translated:
    """One translated httpx call: the chat request to send, and the agent's answer made from
    the upstream's (see the module doc)."""

    def __init__(
        self, api: str, request: httpx.Request, translation: Translation, lib: Any
    ) -> None:
        self.api, self.request, self.translation = api, request, translation
        self.lib = lib
        """httpx, or httpx2 (its fork, which the anthropic SDK sends through)."""

    @staticmethod
    def open(api: str, request: httpx.Request, lib: Any) -> Translated | httpx.Response:
        """The translation of ``request``, or the agent's 400 if it cannot be translated."""
        try:
            body = orjson.loads(request.content)
            if not isinstance(body, dict):
                raise TranslationError("the request body is not a JSON object")
            return Translated(api, request, open_translation(api, body, _CHAINS), lib)
        except (TranslationError, orjson.JSONDecodeError) as error:
            message = f"arttrace: {error}"
            response: httpx.Response = lib.Response(
                400,
                headers={"content-type": "application/json"},
                content=refusal(api, 400, message),
                request=request,
            )
            return response

    def chat_request(self, body: bytes) -> httpx.Request:
        """The upstream's Chat Completions request, with ``body``, the caller's headers (an
        Anthropic ``x-api-key`` as ``Authorization``), through the same client."""
        request = self.request
        path = request.url.path.rstrip("/")
        suffix = "/responses" if self.api == "responses" else "/messages"
        url = request.url.copy_with(path=path[: -len(suffix)] + "/chat/completions", query=None)
        headers = request.headers.copy()
        if self.api == "messages":
            key = headers.get("x-api-key")
            if key is not None:
                del headers["x-api-key"]
                if "authorization" not in headers:
                    headers["authorization"] = f"Bearer {key}"
        headers["content-length"] = str(len(body))
        headers["accept"] = "text/event-stream" if self.translation.stream else "application/json"
        chat: httpx.Request = self.lib.Request(
            "POST", url, headers=headers, content=body, extensions=request.extensions
        )
        return chat

    # -- the answer ------------------------------------------------------------------------

    def streams(self, upstream: httpx.Response, kwargs: dict[str, Any]) -> bool:
        """Whether the agent's answer is streamed from the ``upstream``'s (sent with ``send``'s
        ``kwargs``), rather than made from its whole body."""
        return upstream.status_code < 300 and self.translation.stream and bool(kwargs.get("stream"))

    def answer(self, status: int, data: bytes) -> httpx.Response:
        """The agent's answer for the upstream's whole one."""
        return self.error_response(status, data) if status >= 300 else self.whole(data)

    def error_response(self, status: int, data: bytes) -> httpx.Response:
        t = self.translation
        out = (
            refusal(t.api, status, upstream_message(status, data))
            if t.stream
            else t.error(status, data)
        )
        return self._response(status, "application/json", content=out)

    def whole(self, data: bytes) -> httpx.Response:
        t = self.translation
        if not t.stream:
            body = orjson.dumps(t.answer(orjson.loads(data)))
            return self._response(200, "application/json", content=body)
        # a stream read whole (a client that did not stream the body): translated at once
        return self._response(200, "text/event-stream", content=b"".join(self.events([data])))

    def streamed(self, upstream: httpx.Response, is_async: bool) -> httpx.Response:
        sync_stream, async_stream = _streams(self.lib)
        stream: Any = async_stream(self, upstream) if is_async else sync_stream(self, upstream)
        return self._response(200, "text/event-stream", stream=stream)

    def _response(self, status: int, kind: str, **body: Any) -> httpx.Response:
        response: httpx.Response = self.lib.Response(
            status, headers={"content-type": kind}, request=self.request, **body
        )
        return response

    def events(self, pieces: Iterable[bytes]) -> Iterator[bytes]:
        """The agent's stream for the upstream's stream ``pieces``."""
        translator = _Stream(self.translation)
        yield translator.start()
        for piece in pieces:
            out = translator.feed(piece)
            if out:
                yield out
        yield translator.end()


class _Stream:
    """The upstream's SSE bytes in, the agent's SSE bytes out."""

    def __init__(self, translation: Translation) -> None:
        self.t = translation
        self.reader = EventReader()
        self.failed = False

    def start(self) -> bytes:
        return self.t.start()

    def feed(self, piece: bytes) -> bytes:
        out = bytearray()
        for data in self.reader.feed(piece):
            if data == b"[DONE]" or self.failed:
                continue
            chunk = orjson.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:  # vLLM's error mid-stream
                self.failed = True
                out += self.t.error(500, data)
                continue
            out += self.t.chunk(chunk)
        return bytes(out)

    def end(self) -> bytes:
        return b"" if self.failed else self.t.end()


@functools.cache
def _streams(lib: Any) -> tuple[type[Any], type[Any]]:
    """The stream classes of ``lib`` (its responses accept only its own)."""
    return (
        type("_SyncStream", (_SyncStream, lib.SyncByteStream), {}),
        type("_AsyncStream", (_AsyncStream, lib.AsyncByteStream), {}),
    )


class _SyncStream:
    def __init__(self, translated: Translated, upstream: httpx.Response) -> None:
        self.translated, self.upstream = translated, upstream

    def __iter__(self) -> Iterator[bytes]:
        yield from self.translated.events(self.upstream.iter_bytes())

    def close(self) -> None:
        self.upstream.close()


class _AsyncStream:
    def __init__(self, translated: Translated, upstream: httpx.Response) -> None:
        self.translated, self.upstream = translated, upstream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        translator = _Stream(self.translated.translation)
        yield translator.start()
        async for piece in self.upstream.aiter_bytes():
            out = translator.feed(piece)
            if out:
                yield out
        yield translator.end()

    async def aclose(self) -> None:
        await self.upstream.aclose()
