"""The OpenAI SDK shim: Chat Completions ``create`` and ``parse`` (sync and async, streaming or
not, ``with_raw_response``, and the ``stream()`` helper, which calls ``create``) wrapped with
``wrapt``; the caller sees what it would see without it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import openai
import wrapt
from openai._legacy_response import LegacyAPIResponse
from openai.resources.chat.completions import AsyncCompletions, Completions
from openai.types.chat import ChatCompletion

from . import _context
from ._calls import Settings
from ._chat import Capture
from ._guard import guarded
from ._unwrap import mark, ours, unwrap

_Client = TypeVar("_Client", openai.OpenAI, openai.AsyncOpenAI)
_ABANDONED = "the stream was closed before its end"
_METHODS = ("create", "parse")
_CLASSES = ((Completions, False), (AsyncCompletions, True))


def patch() -> None:
    """Wrap the SDK's Chat Completions methods, once; they read the settings of
    :func:`arttrace.instrument` at each call."""
    for cls, is_async in _CLASSES:
        for method in _METHODS:
            if not ours(cls.__dict__[method]):
                wrapt.wrap_function_wrapper(cls, method, _wrapper(_context.shim_settings, is_async))


def unpatch() -> None:
    """Remove arttrace's wrappers, keeping any another library put around them."""
    for cls, _ in _CLASSES:
        for method in _METHODS:
            unwrap(cls, method)


def wrap(client: _Client, settings: Settings) -> _Client:
    """Capture the Chat Completions calls of this one client (see :func:`arttrace.wrap_openai`)."""
    completions = client.chat.completions
    is_async = isinstance(completions, AsyncCompletions)
    for method in _METHODS:
        if ours(completions.__dict__.get(method)):
            completions.__dict__.pop(method)
        wrapped = wrapt.FunctionWrapper(
            getattr(completions, method), _wrapper(lambda: settings, is_async)
        )
        setattr(completions, method, wrapped)
    completions.__dict__.pop("with_raw_response", None)  # rebuilt over the wrapped methods
    return client


def _wrapper(settings: Callable[[], Settings | None], is_async: bool) -> Any:
    def sync_create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        capture = _start(settings, instance, kwargs)
        if capture is None:
            return wrapped(*args, **kwargs)
        token = _context.capturing.set(True)
        try:
            result = wrapped(*args, **capture.kwargs)
        except BaseException as error:
            _failed(capture, error, partial=False)
            raise
        finally:
            _context.capturing.reset(token)
        return _observe(capture, result)

    async def _async_create(wrapped: Any, args: Any, capture: Capture) -> Any:
        token = _context.capturing.set(True)
        try:
            result = await wrapped(*args, **capture.kwargs)
        except BaseException as error:
            _failed(capture, error, partial=False)
            raise
        finally:
            _context.capturing.reset(token)
        return _observe(capture, result)

    def async_create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        capture = _start(settings, instance, kwargs)
        if capture is None:
            return wrapped(*args, **kwargs)
        return _async_create(wrapped, args, capture)

    return mark(async_create if is_async else sync_create)


def _start(
    settings: Callable[[], Settings | None], instance: Any, kwargs: dict[str, Any]
) -> Capture | None:
    """A capture for this call, or ``None`` to let it pass untouched (also when arttrace
    fails to start one: the call runs uncaptured and the failure is logged)."""
    with guarded("starting the capture of a Chat Completions call"):
        current = settings()
        if current is None or _context.capturing.get():
            return None
        if not _context.recording():
            return None  # nothing would keep the record, nothing would export the span
        return Capture(kwargs, current, getattr(instance, "_client", None))
    return None


# Every step of a capture on the caller's path runs guarded: a failure marks the call (lost)
# and the caller gets its result, chunk or exception exactly as without arttrace.


def _observe(capture: Capture, result: Any) -> Any:
    """Return ``result`` as the caller expects it, with the capture watching it."""
    with guarded("reading a Chat Completions response", capture.lost):
        if isinstance(result, ChatCompletion):
            capture.complete(result)
            return result
        if isinstance(result, openai.Stream):
            return _Stream(result, capture)
        if isinstance(result, openai.AsyncStream):
            return _AsyncStream(result, capture)
        if isinstance(result, LegacyAPIResponse):
            return _RawResponse(result, capture)
        capture.abandon(f"unrecognised response type {type(result).__name__}")
    return result


def _failed(capture: Capture, error: BaseException, *, partial: bool) -> None:
    with guarded("recording a failed call", capture.lost):
        capture.fail(error, partial=partial)


def _ended(capture: Capture) -> None:
    with guarded("ending a stream", capture.lost):
        capture.end_stream()


def _closed(capture: Capture) -> None:
    with guarded("closing a stream", capture.lost):
        capture.abandon(_ABANDONED)


class _Stream(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """``openai.Stream`` as the caller knows it, reassembled on the side."""

    def __init__(self, stream: openai.Stream[Any], capture: Capture) -> None:
        super().__init__(stream)
        self._self_capture = capture
        self._self_reading = guarded("reading a stream chunk", capture.lost)

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        try:
            chunk = self.__wrapped__.__next__()
        except StopIteration:
            _ended(self._self_capture)
            raise
        except Exception as error:
            _failed(self._self_capture, error, partial=True)
            raise
        with self._self_reading:  # one guard per stream: it runs for every chunk
            self._self_capture.add_chunk(chunk)
        return chunk

    def __enter__(self) -> _Stream:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc)
        finally:
            _closed(self._self_capture)

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            _closed(self._self_capture)


class _AsyncStream(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """``openai.AsyncStream`` as the caller knows it, reassembled on the side."""

    def __init__(self, stream: openai.AsyncStream[Any], capture: Capture) -> None:
        super().__init__(stream)
        self._self_capture = capture
        self._self_reading = guarded("reading a stream chunk", capture.lost)

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            _ended(self._self_capture)
            raise
        except Exception as error:
            _failed(self._self_capture, error, partial=True)
            raise
        with self._self_reading:  # one guard per stream: it runs for every chunk
            self._self_capture.add_chunk(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncStream:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc)
        finally:
            _closed(self._self_capture)

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            _closed(self._self_capture)


class _RawResponse(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """``with_raw_response``: the same ``LegacyAPIResponse``; ``parse()`` gives a watched stream."""

    def __init__(self, response: LegacyAPIResponse[Any], capture: Capture) -> None:
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
        result = self.__wrapped__.parse(*args, **kwargs)
        if isinstance(result, openai.Stream | openai.AsyncStream):
            if self._self_stream is None or self._self_stream.__wrapped__ is not result:
                self._self_stream = _observe(self._self_capture, result)
            return self._self_stream
        return result
