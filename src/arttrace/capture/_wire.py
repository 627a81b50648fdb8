"""A call read off the wire: a JSON request body, then the server's bytes (a whole body or
server-sent events), for layers that see HTTP rather than SDK objects (the gateway, and the
HTTP-client layer below every SDK, :mod:`._http`).

A Chat Completions call is a :class:`~arttrace.capture._chat.Capture`, opened in the current
context (trajectory, ``@trainable`` scopes), so it lands in the run exactly as an SDK call
would: the server's JSON, parsed with orjson and read field by field (no model object per
chunk), is fed to ``complete`` / ``add_event`` / ``end_stream``.

A Responses API call is a :class:`~arttrace.capture._responses.ResponsesCall`; a legacy
Completions call a :class:`~arttrace.capture._completions.CompletionsCall` (context only).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from . import _context
from ._calls import Settings
from ._chat import Capture, with_training_fields
from ._completions import CompletionsCall
from ._guard import guarded
from ._records import LLMCall
from ._redact import UpstreamError, excerpt
from ._responses import ResponsesCall
from ._responses import with_training_fields as responses_training_fields


class Recorder(Protocol):
    """One call's record, fed what the server sends."""

    def whole(self, status: int, data: bytes) -> None: ...
    def event(self, data: bytes) -> None: ...
    def ended(self) -> None: ...
    def failed(self, error: BaseException, *, partial: bool) -> None: ...
    def abandoned(self, why: str) -> None: ...
    def lost(self, error: BaseException) -> None: ...


def open_recorder(
    path: str, body: dict[str, Any], settings: Settings, server: Any, *, source: str = "openai"
) -> tuple[Recorder, dict[str, Any]]:
    """The recorder of a call to ``path`` (``chat/completions``, ``responses`` or
    ``completions``) made in the current context, and the body to send: on a policy call it
    asks for exact tokens when ``settings`` say so (sampling parameters are never touched).
    ``source`` names the layer on the record (the layer merge reads it)."""
    recorder: _ChatCall | ResponsesCall | CompletionsCall
    if path == "responses":
        recorder = ResponsesCall(body, settings, server)
        body = recorder.body  # on a policy call, with the training fields
    elif path == "completions":
        recorder = CompletionsCall(body, settings, server)
    else:
        model = str(body.get("model", ""))
        if settings.request_training_data and _context.policy_scope(model) is not None:
            body = training_body(path, body)
        as_sent = Settings(request_training_data=False, export_tokens=settings.export_tokens)
        recorder = _ChatCall(Capture(body, as_sent, server))
    recorder.call.source = source
    return recorder, body


def training_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A policy call's ``body`` asking for the exact tokens unless the caller set them (the
    shim's rule, on a JSON body instead of SDK arguments): ``logprobs`` and
    ``return_token_ids`` for Chat Completions, the Responses API's own fields for it; other
    paths' bodies as they are."""
    if path == "responses":
        return responses_training_fields(body, sdk=False)
    if path != "chat/completions":
        return body
    extra = {"return_token_ids": body["return_token_ids"]} if "return_token_ids" in body else {}
    kwargs = with_training_fields({**body, "extra_body": extra})
    extra = kwargs.pop("extra_body")
    return {**kwargs, **extra}


class _ChatCall:
    """A Chat Completions call, parsed by the capture core.

    A stream is whole once every choice has its finish reason and, when the request asked
    for it (``stream_options.include_usage``), the usage chunk has come: it ends there, without
    waiting for ``[DONE]``, which a client may never read (LiteLLM's sync stream stops at the
    finish reason and leaves the response open). A caller that stops reading after that point
    has the whole answer, so the call is not abandoned.
    """

    __slots__ = ("_choices", "_finished", "_reading", "_usage", "capture", "done")

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.done = False
        self._reading = guarded("reading a Chat Completions stream", self._unreadable)
        body = capture.kwargs
        n, options = body.get("n"), body.get("stream_options")
        self._choices = n if type(n) is int and n > 0 else 1
        self._usage = isinstance(options, dict) and bool(options.get("include_usage"))
        """A usage chunk is still to come."""
        self._finished: set[int] = set()

    @property
    def call(self) -> LLMCall:
        return self.capture.call

    def whole(self, status: int, data: bytes) -> None:
        self.done = True
        if self.capture.refused(status, data):
            return
        with guarded("reading a Chat Completions response", self._unreadable):
            self.capture.complete(orjson.loads(data))

    def event(self, data: bytes) -> None:
        if self.done:
            return
        if data == b"[DONE]":
            self.ended()
            return
        with self._reading:  # one guard per stream: it runs for every event
            event = orjson.loads(data)  # read as plain JSON: no model built per chunk
            if type(event) is dict and "error" in event and "choices" not in event:
                self.failed(UpstreamError(f"the server sent {excerpt(data)}"), partial=True)
                return  # vLLM's error in a stream
            self.capture.add_event(event)
            for choice in event["choices"]:  # read and checked by add_event
                if choice.get("finish_reason"):
                    self._finished.add(choice["index"])
            if event.get("usage") is not None:
                self._usage = False
            if self._answered() and not self._usage:
                self.ended()

    def _answered(self) -> bool:
        """Every choice has its finish reason."""
        return len(self._finished) >= self._choices

    def ended(self) -> None:
        if not self.done:
            self.done = True
            self.capture.end_stream()

    def failed(self, error: BaseException, *, partial: bool) -> None:
        if not self.done:
            self.done = True
            self.capture.fail(error, partial=partial)

    def abandoned(self, why: str) -> None:
        if self._answered():  # the caller has every choice whole (the usage may be missing)
            self.ended()
        elif not self.done:
            self.done = True
            self.capture.abandon(why)

    def lost(self, error: BaseException) -> None:
        """arttrace failed recording the call (``error``, already logged): kept as context,
        marked, one warning if a policy turn."""
        self.done = True
        self.capture.lost(error)

    def _unreadable(self, error: BaseException) -> None:
        self.lost(error)
