"""The OpenAI SDK shim: ``create`` and ``parse`` of Chat Completions and of the Responses API
(sync and async, streaming or not, ``with_raw_response``, ``with_streaming_response``, and the
``stream()`` helpers, which call ``create``) wrapped with ``wrapt``; the caller sees what it
would see without it.

A framework integration whose framework calls through the OpenAI SDK (the OpenAI Agents SDK)
names the shim's record instead of keeping its own: :func:`add_namer`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import openai
import wrapt
from openai._legacy_response import LegacyAPIResponse
from openai._response import APIResponse, AsyncAPIResponse
from openai.resources.chat.completions import AsyncCompletions, Completions
from openai.resources.responses import AsyncResponses, Responses
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from . import _context
from ._calls import OpenCall, Settings
from ._chat import Capture, as_unasked
from ._guard import Guard, guarded
from ._responses import ResponsesCall
from ._unwrap import mark, ours, unwrap

_Client = TypeVar("_Client", openai.OpenAI, openai.AsyncOpenAI)
_Recorder = Capture | ResponsesCall
_ABANDONED = "the stream was closed before its end"
_METHODS = ("create", "parse")
_CLASSES = (
    (Completions, False),
    (AsyncCompletions, True),
    (Responses, False),
    (AsyncResponses, True),
)
_WHOLE = (ChatCompletion, Response)
_namers: list[Callable[[OpenCall], None]] = []


def add_namer(namer: Callable[[OpenCall], None]) -> None:
    """Call ``namer`` with each call the shim opens (run under a guard), so a framework can name
    it (``call.framework``, ``call.step``, span attributes) instead of recording it again."""
    if namer not in _namers:
        _namers.append(namer)


def remove_namer(namer: Callable[[OpenCall], None]) -> None:
    if namer in _namers:
        _namers.remove(namer)


def patch() -> None:
    """Wrap the SDK's Chat Completions and Responses methods, once; they read the settings of
    :func:`arttrace.instrument` at each call."""
    for cls, is_async in _CLASSES:
        for method in _METHODS:
            if not ours(cls.__dict__[method]):
                wrapper = _wrapper(_context.shim_settings, is_async, _recorder_of(cls))
                wrapt.wrap_function_wrapper(cls, method, wrapper)


def unpatch() -> None:
    """Remove arttrace's wrappers, keeping any another library put around them."""
    for cls, _ in _CLASSES:
        for method in _METHODS:
            unwrap(cls, method)


def wrap(client: _Client, settings: Settings) -> _Client:
    """Capture the Chat Completions and Responses calls of this one client (see
    :func:`arttrace.wrap_openai`)."""
    for resource in (client.chat.completions, client.responses):
        is_async = isinstance(resource, AsyncCompletions | AsyncResponses)
        opened = _recorder_of(type(resource))
        for method in _METHODS:
            if ours(resource.__dict__.get(method)):
                resource.__dict__.pop(method)
            wrapped = wrapt.FunctionWrapper(
                getattr(resource, method), _wrapper(lambda: settings, is_async, opened)
            )
            setattr(resource, method, wrapped)
        for view in ("with_raw_response", "with_streaming_response"):
            resource.__dict__.pop(view, None)  # rebuilt over the wrapped methods
    return client


def _recorder_of(cls: type) -> Callable[[dict[str, Any], Settings, Any], _Recorder]:
    if issubclass(cls, Responses | AsyncResponses):
        return lambda kwargs, settings, client: ResponsesCall(kwargs, settings, client, sdk=True)
    # A policy stream may ask for the usage chunk (to check every token arrived): the stream
    # proxies hide it from a caller who did not ask.
    return lambda kwargs, settings, client: Capture(kwargs, settings, client, hide_usage=True)


def _wrapper(
    settings: Callable[[], Settings | None],
    is_async: bool,
    opened: Callable[[dict[str, Any], Settings, Any], _Recorder],
) -> Any:
    def sync_create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        capture = _start(settings, instance, kwargs, opened)
        if capture is None:
            return wrapped(*args, **kwargs)
        with _context.sending(functools.partial(_failed, capture)):
            result = wrapped(*args, **capture.kwargs)
        return _observe(capture, result)

    async def _async_create(wrapped: Any, args: Any, capture: _Recorder) -> Any:
        with _context.sending(functools.partial(_failed, capture)):
            result = await wrapped(*args, **capture.kwargs)
        return _observe(capture, result)

    def async_create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        capture = _start(settings, instance, kwargs, opened)
        if capture is None:
            return wrapped(*args, **kwargs)
        return _async_create(wrapped, args, capture)

    return mark(async_create if is_async else sync_create)


def _start(
    settings: Callable[[], Settings | None],
    instance: Any,
    kwargs: dict[str, Any],
    opened: Callable[[dict[str, Any], Settings, Any], _Recorder],
) -> _Recorder | None:
    """A capture for this call, or ``None`` to let it pass untouched (also when arttrace
    fails to start one: the call runs uncaptured and the failure is logged)."""
    with guarded("starting the capture of a call"):
        current = settings()
        if current is None or _context.capturing.get():
            return None
        if not _context.recording():
            return None  # nothing would keep the record, nothing would export the span
        client = getattr(instance, "_client", None)
        url = getattr(client, "base_url", None)
        if url is not None and _context.records_itself(url.host, url.port):
            return None  # an arttrace.Gateway of this process records it (as the HTTP layer)
        capture = opened(kwargs, current, client)
        for namer in _namers:
            with guarded("naming a call", capture.lost):
                namer(capture)
        return capture
    return None


# Every step of a capture on the caller's path runs guarded: a failure marks the call (lost)
# and the caller gets its result, chunk or exception exactly as without arttrace.


def _observe(capture: _Recorder, result: Any) -> Any:
    """Return ``result`` as the caller expects it, with the capture watching it."""
    with guarded("reading a response", capture.lost):
        if isinstance(result, _WHOLE):
            capture.complete(result)  # type: ignore[arg-type]  # each recorder its own type
            return result
        if isinstance(result, openai.Stream):
            return _Stream(result, capture)
        if isinstance(result, openai.AsyncStream):
            return _AsyncStream(result, capture)
        if isinstance(result, LegacyAPIResponse):
            return _RawResponse(result, capture)
        if isinstance(result, APIResponse):
            return _StreamingResponse(result, capture)
        if isinstance(result, AsyncAPIResponse):
            return _AsyncStreamingResponse(result, capture)
        capture.abandon(f"unrecognised response type {type(result).__name__}")
    return result


def _failed(capture: _Recorder, error: BaseException, *, partial: bool) -> None:
    with guarded("recording a failed call", capture.lost):
        capture.fail(error, partial=partial)


def _ended(capture: _Recorder) -> None:
    with guarded("ending a stream", capture.lost):
        capture.end_stream()


class _Reader:
    """A stream's chunk reader: called with each chunk, it records it (under the stream's one
    guard) and says whether the caller must not see it (the usage chunk arttrace asked for and
    the caller did not). Everything it needs is bound once: it runs for every chunk."""

    __slots__ = ("add", "capture", "chat", "guard")

    def __init__(self, capture: _Recorder) -> None:
        self.capture = capture
        self.add = capture.add_chunk
        self.chat = capture if isinstance(capture, Capture) else None
        """A Chat Completions capture: one that may have asked for a usage chunk to hide."""
        self.guard: Guard = guarded("reading a stream chunk", capture.lost)

    def __call__(self, chunk: Any) -> bool:
        chat = self.chat
        hidden = chat is not None and chat.usage_added and _hidden(chat, chunk)
        try:
            self.add(chunk)
        except Exception as error:
            self.guard.failed(error)
        return hidden

    def stopped(self, error: Exception) -> None:
        """The stream raised ``error``: its end (``StopIteration``), else a failure."""
        if isinstance(error, StopIteration | StopAsyncIteration):
            _ended(self.capture)
        else:
            _failed(self.capture, error, partial=True)


def _hidden(capture: Capture, chunk: Any) -> bool:
    """Whether the caller must not see ``chunk``. The caller did not ask for the usage chunk, so
    without arttrace it would never see one: if deciding fails, the chunk is still hidden when
    it is one (no choice, a usage), and the call is marked."""
    with guarded("hiding the usage chunk arttrace asked for", capture.lost):
        return capture.conceal(chunk)
    with guarded("hiding the usage chunk arttrace asked for (by its shape)"):
        return as_unasked(chunk)
    return False


def _closed(capture: _Recorder) -> None:
    with guarded("closing a stream", capture.lost):
        capture.abandon(_ABANDONED)


class _Proxy(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """An SDK stream or response as the caller knows it, feeding ``capture``; closed before
    its end, the call is abandoned."""

    def __init__(self, wrapped: Any, capture: _Recorder) -> None:
        super().__init__(wrapped)
        self._self_capture = capture

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            _closed(self._self_capture)


class _AsyncProxy(_Proxy):
    """:class:`_Proxy` of an async stream or response."""

    async def close(self) -> None:  # type: ignore[override]
        try:
            await self.__wrapped__.close()
        finally:
            _closed(self._self_capture)


class _Stream(_Proxy):
    """``openai.Stream`` as the caller knows it, reassembled on the side."""

    def __init__(self, stream: openai.Stream[Any], capture: _Recorder) -> None:
        super().__init__(stream, capture)
        self._self_next = stream.__next__
        self._self_read = _Reader(capture)

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        next_chunk, read = self._self_next, self._self_read
        while True:
            try:
                chunk = next_chunk()
            except Exception as error:  # StopIteration too
                read.stopped(error)
                raise
            if not read(chunk):
                return chunk

    def __enter__(self) -> _Stream:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc)
        finally:
            _closed(self._self_capture)


class _AsyncStream(_AsyncProxy):
    """``openai.AsyncStream`` as the caller knows it, reassembled on the side."""

    def __init__(self, stream: openai.AsyncStream[Any], capture: _Recorder) -> None:
        super().__init__(stream, capture)
        self._self_next = stream.__anext__
        self._self_read = _Reader(capture)

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        next_chunk, read = self._self_next, self._self_read
        while True:
            try:
                chunk = await next_chunk()
            except Exception as error:  # StopAsyncIteration too
                read.stopped(error)
                raise
            if not read(chunk):
                return chunk

    async def __aenter__(self) -> _AsyncStream:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc)
        finally:
            _closed(self._self_capture)


class _RawResponse(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """``with_raw_response``: the same ``LegacyAPIResponse``; ``parse()`` gives a watched stream."""

    def __init__(self, response: LegacyAPIResponse[Any], capture: _Recorder) -> None:
        super().__init__(response)
        self._self_capture = capture
        self._self_stream: Any = None
        if not capture.call.streamed:
            try:  # parse() is cached by the SDK: the caller's own parse() gets this same object
                completion = response.parse()
            except Exception as error:  # the caller's own parse() will raise it
                _failed(capture, error, partial=True)
            else:
                _observe(capture, completion)

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return _watched(self, self.__wrapped__.parse(*args, **kwargs))


class _StreamingResponse(_Proxy):
    """``with_streaming_response``: the same ``APIResponse``; ``parse()`` gives a watched stream
    or completes the record with the parsed response; closing it ends a stream not read out."""

    def __init__(self, response: APIResponse[Any], capture: _Recorder) -> None:
        super().__init__(response, capture)
        self._self_stream: Any = None

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        return _watched(self, self.__wrapped__.parse(*args, **kwargs))


class _AsyncStreamingResponse(_AsyncProxy):
    """``with_streaming_response`` of an async client (:class:`_StreamingResponse`)."""

    def __init__(self, response: AsyncAPIResponse[Any], capture: _Recorder) -> None:
        super().__init__(response, capture)
        self._self_stream: Any = None

    async def parse(self, *args: Any, **kwargs: Any) -> Any:
        return _watched(self, await self.__wrapped__.parse(*args, **kwargs))


def _watched(proxy: Any, result: Any) -> Any:
    """A parsed result of a raw or streaming response, watched once (the SDK caches
    ``parse()``; a whole result already recorded is left alone)."""
    if isinstance(result, openai.Stream | openai.AsyncStream):
        if proxy._self_stream is None or proxy._self_stream.__wrapped__ is not result:
            proxy._self_stream = _observe(proxy._self_capture, result)
        return proxy._self_stream
    if isinstance(result, _WHOLE):
        _observe(proxy._self_capture, result)  # a second parse() finds the record ended
    return result
