"""Translation in this process: which calls translate, and the httpx ``send`` that does it.

``instrument(translate=...)`` sets the protocols for the process, ``trajectory(...,
translate=...)`` for one run (its choice wins). While :func:`arttrace.instrument` is on, a
``POST`` to ``.../responses`` or ``.../messages`` through httpx (which the ``openai`` and
``anthropic`` SDKs, and the OpenAI Agents SDK's default model, all send through) is made as a
``POST`` to ``.../chat/completions`` with the same client, recorded by the HTTP layer as a
Chat Completions call with exact tokens, and answered with an ``httpx.Response`` whose body,
whole or streamed, is the agent's protocol.

The OpenAI SDK shim records a Responses call itself; for a call that is translated it stands
aside (:func:`stand_aside`: an outer wrapper of ``Responses.create`` marks the call), so the
call is recorded once, below, as the chat call it became.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import orjson

from ..capture import _context
from ..capture._guard import guarded
from ..capture._sse import EventReader
from ._base import Translation, TranslationError
from ._registry import apis, open_translation, refusal, upstream_message
from ._responses import Chains

if TYPE_CHECKING:
    import httpx  # or httpx2: never imported here (instrument() imports no HTTP client)

_process: frozenset[str] = frozenset()
_chains: Chains | None = None
aside: ContextVar[bool] = ContextVar("arttrace_translation_aside", default=False)
"""Set while the SDK shim stands aside for a translated call: the HTTP layer records it."""
_SUFFIXES = (("/responses", "responses"), ("/messages", "messages"))


def configure(value: str | Iterable[str] | None) -> None:
    """The protocols this process translates (``instrument(translate=...)``)."""
    global _process
    _process = apis(value)


def active() -> bool:
    """Whether any call may be translated (the first, cheapest check of every send)."""
    return bool(_process) or _runs_translate


_runs_translate = False


def run_translates() -> None:
    """A run chose its own protocols (``trajectory(..., translate=...)``): from now on every
    send looks at the current run."""
    global _runs_translate
    _runs_translate = True


def apis_here() -> frozenset[str]:
    """The protocols translated here: the current run's choice, else the process's."""
    run = _context.current_trajectory_var.get()
    own: frozenset[str] | None = getattr(run, "translate", None) if run is not None else None
    return _process if own is None else own


def chains() -> Chains:
    """This process's ``previous_response_id`` chains."""
    global _chains
    if _chains is None:
        _chains = Chains()
    return _chains


def api_of(method: str, path: str) -> str | None:
    """The protocol a request speaks, if it is translated here (``None``: send it as is)."""
    if method.upper() != "POST":
        return None
    path = path.rstrip("/")
    for suffix, api in _SUFFIXES:
        if path.endswith(suffix) and "/threads/" not in path:  # not the Assistants API's
            return api if api in apis_here() else None
    return None


# -- the OpenAI SDK shim stands aside -----------------------------------------------------------


def stand_aside(module: Any = None) -> None:
    """Wrap ``Responses.create`` (sync and async) outermost, so that a translated call passes
    the shim (it is recorded below, as the chat call it becomes). Called again, it moves its
    wrapper back outside (the shim may have been put around it since)."""
    import wrapt  # once openai is: instrument() itself loads no wrapt
    from openai.resources.responses import AsyncResponses, Responses

    for cls, wrapper in ((Responses, _create), (AsyncResponses, _acreate)):
        _unwrap_aside(cls)
        wrapt.wrap_function_wrapper(cls, "create", wrapper)


def _unwrap_aside(cls: Any) -> None:
    """Splice this module's wrapper out of ``cls.create``, wherever it sits in the chain."""
    import wrapt

    outer: Any = None
    current = cls.__dict__.get("create")
    while isinstance(current, wrapt.FunctionWrapper):
        if getattr(current._self_wrapper, "_aside", False):
            if outer is None:
                cls.create = current.__wrapped__
            else:
                outer.__wrapped__ = current.__wrapped__
            return
        outer, current = current, current.__wrapped__


def reset() -> None:
    """Translate nothing, as before :func:`arttrace.instrument`: no protocol, no run's choice
    looked at, the wrappers of :func:`stand_aside` removed."""
    global _process, _runs_translate
    _process, _runs_translate = frozenset(), False
    restore()


def restore() -> None:
    """Remove the wrappers of :func:`stand_aside`."""
    import sys

    if "openai.resources.responses" not in sys.modules:
        return
    from openai.resources.responses import AsyncResponses, Responses

    for cls in (Responses, AsyncResponses):
        _unwrap_aside(cls)


def _translated_here() -> bool:
    with guarded("deciding whether to translate a Responses call"):
        return "responses" in apis_here()
    return False


def _create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if not active() or not _translated_here():
        return wrapped(*args, **kwargs)
    marks = _context.capturing.set(True), aside.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        aside.reset(marks[1])
        _context.capturing.reset(marks[0])


def _acreate(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if not active() or not _translated_here():
        return wrapped(*args, **kwargs)
    return _acreate_aside(wrapped, args, kwargs)


async def _acreate_aside(wrapped: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    marks = _context.capturing.set(True), aside.set(True)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        aside.reset(marks[1])
        _context.capturing.reset(marks[0])


_create._aside = True  # type: ignore[attr-defined]
_acreate._aside = True  # type: ignore[attr-defined]


# -- the translated send ------------------------------------------------------------------------


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
            return Translated(api, request, open_translation(api, body, chains()), lib)
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
