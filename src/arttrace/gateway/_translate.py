"""A call in another protocol (the Responses API, Anthropic Messages) served through the
upstream's Chat Completions, for a run that translates it (``docs/translation.md``).

The agent's request becomes a Chat Completions request (:mod:`arttrace.translation`), sent to
the upstream's ``/chat/completions`` with the training fields and recorded as a chat call of
the run, with exact tokens; the upstream's answer, whole or streamed, goes back to the agent
in its own protocol. The relay's guarantees hold: a caller that hangs up closes the upstream
request (the call is marked partial); an upstream error reaches the caller, in the protocol's
error shape, with the upstream's status and message; a stream the upstream cuts ends with
the protocol's error event. A request that cannot be translated (a built-in tool, an unknown
``previous_response_id``) is a 400 saying why, and nothing is sent upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from multidict import CIMultiDict
from starlette.responses import Response
from starlette.types import Send
from yarl import URL

from ..capture._redact import redact
from ..capture._sse import EventReader
from ..capture._wire import Recorder
from ..translation import Chains, Translation, TranslationError
from ..translation._registry import open_translation, refusal, upstream_message
from ._relay import _MAY_END, _UPSTREAM_FAILED, Relay, Upstream, _send_whole, _State

_log = logging.getLogger("arttrace.gateway")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_CHAT = "chat/completions"


def refused(api: str, status: int, message: str) -> Response:
    """An answer in ``api``'s error shape, before anything was sent upstream."""
    return Response(refusal(api, status, message), status, media_type="application/json")


def translated(
    api: str,
    body: dict[str, Any],
    chains: Chains,
    upstream: Upstream,
    headers: CIMultiDict[str],
    prepare: Callable[[dict[str, Any]], tuple[bytes, Callable[[], Recorder] | None]],
) -> Response:
    """The answer to one call to ``api`` with JSON ``body``: ``prepare`` gives the bytes to
    send for a Chat Completions body (the training fields added) and opens its record."""
    try:
        translation = open_translation(api, body, chains)
    except TranslationError as error:
        return refused(api, 400, f"arttrace gateway: {error}")
    sent, open_record = prepare(translation.upstream_body)
    if api == "messages":
        _bearer(headers)
    url = upstream.url(_CHAT, b"")
    return TranslatedRelay(upstream, url, headers, sent, open_record, translation)


def _bearer(headers: CIMultiDict[str]) -> None:
    """An Anthropic client's ``x-api-key`` as the ``Authorization`` a Chat Completions server
    reads (unless the gateway already put its own upstream key there)."""
    keys = headers.popall("x-api-key", [])
    if keys and "authorization" not in headers:
        headers["authorization"] = f"Bearer {keys[0]}"


class TranslatedRelay(Relay):
    """:class:`Relay` for a translated call: the upstream's Chat Completions answer is read,
    recorded and answered in the agent's protocol (``translation``)."""

    def __init__(
        self,
        upstream: Upstream,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes,
        open_record: Callable[[], Recorder] | None,
        translation: Translation,
    ) -> None:
        super().__init__(upstream, "POST", url, headers, body, open_record)
        self.translation = translation

    def _unreachable(self, why: str) -> bytes:
        message = (
            f"arttrace gateway: the upstream {self.upstream.base_url} could not be reached ({why})"
        )
        return refusal(self.translation.api, 502, message)

    async def _forward(self, send: Send, state: _State) -> None:
        answer = await self._answer(send, state)
        if answer is None:
            return
        try:
            if not (answer.status < 300 and answer.content_type == "text/event-stream"):
                data = await answer.read()
                self._record("whole", answer.status, data)
                state.answered = True
                status, out = self._whole(answer.status, data)
                await _send_whole(send, status, _JSON, out)
                return
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            await self._stream(send, answer.content)
            state.answered = True
        except _UPSTREAM_FAILED as error:  # the upstream cut its answer: say so, and end
            self._record("failed", error, partial=True)
            state.answered = True
            await _end(send, self._failure(f"it cut its answer ({redact(repr(error))})"))
        finally:
            answer.close()  # also when the caller's hang-up cancelled us: closes the upstream

    def _whole(self, status: int, data: bytes) -> tuple[int, bytes]:
        """The agent's status and JSON body for the upstream's whole answer."""
        t = self.translation
        if status >= 300:
            if t.stream:  # refused before any stream began: a plain JSON error
                return status, refusal(t.api, status, upstream_message(status, data))
            return status, t.error(status, data)
        try:
            return 200, orjson.dumps(t.answer(orjson.loads(data)))
        except Exception as error:  # an answer arttrace cannot translate: the caller hears why
            _log.exception("arttrace gateway: translating an answer failed")
            message = f"arttrace gateway: the upstream's answer could not be translated ({error!r})"
            return 502, refusal(t.api, 502, message)

    async def _stream(self, send: Send, content: Any) -> None:
        """The upstream's stream in the agent's protocol: its opening events at once (as a
        server of that protocol sends them), then each piece's events. A piece that may end
        the call is recorded before its events are sent (the call is whole in its run by the
        time the caller has its end); any other is sent first, then recorded."""
        t = self.translation
        events = EventReader()
        await send({"type": "http.response.body", "body": t.start(), "more_body": True})
        failed = False
        while piece := await content.readany():
            ending = _MAY_END.search(events.pending + piece) is not None
            datas = events.feed(piece)
            if ending:
                self._record_all(datas)
            out = bytearray()
            for data in datas:
                if data == b"[DONE]" or failed:
                    continue
                try:
                    chunk = orjson.loads(data)
                    if isinstance(chunk, dict) and "error" in chunk:  # vLLM's error mid-stream
                        failed = True
                        out += t.error(500, data)
                        continue
                    out += t.chunk(chunk)
                except Exception as error:
                    _log.exception("arttrace gateway: translating a stream failed")
                    failed = True
                    out += self._failure(f"its stream could not be translated ({error!r})")
            if out:
                await send({"type": "http.response.body", "body": bytes(out), "more_body": True})
            if not ending:
                self._record_all(datas)
        self._record("ended")
        await _end(send, b"" if failed else self._safely(t.end))

    def _record_all(self, datas: list[bytes]) -> None:
        for data in datas:
            self._record("event", data)

    def _failure(self, why: str) -> bytes:
        """The protocol's error event for a stream that failed because the upstream's ``why``
        (none if the translation fails there too: logged)."""
        body = orjson.dumps(
            {"error": {"message": f"arttrace gateway: the upstream failed: {why}", "code": 502}}
        )
        return self._safely(lambda: self.translation.error(502, body))

    def _safely(self, make: Callable[[], bytes]) -> bytes:
        """The bytes ``make`` gives, or none if the translation fails there (logged)."""
        try:
            return make()
        except Exception:
            _log.exception("arttrace gateway: translating the end of a stream failed")
            return b""


async def _end(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": False})
