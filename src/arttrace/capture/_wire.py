"""A call read off the wire: a JSON request body, then the server's bytes (a whole body or
server-sent events), for layers that see HTTP rather than SDK objects (the gateway, and the
HTTP-client hooks below every SDK).

A Chat Completions call is a :class:`~arttrace.capture._chat.Capture`, opened in the current
context (trajectory, ``@trainable`` scopes), so it lands in the run exactly as an SDK call
would: the server's JSON becomes ``ChatCompletion`` / ``ChatCompletionChunk`` objects fed to
``complete`` / ``add_chunk`` / ``end_stream``.

A Responses API call is forwarded and kept as context: arttrace has no Responses parser for
exact tokens yet, so its text and function calls are recorded, not trained on, and the first
one per model warns (:class:`~arttrace.UntrainableTurnWarning`).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from . import _context
from ._calls import OpenCall, Settings
from ._chat import Capture, message_dict, with_training_fields
from ._guard import guarded
from ._records import ChoiceRecord, LLMCall, jsonable
from ._redact import redact
from ._warnings import warn_untrainable

_RESPONSES_FIX = (
    "arttrace cannot read a Responses API call's exact tokens yet: point the agent at Chat "
    "Completions (for the OpenAI Agents SDK, OpenAIChatCompletionsModel)."
)


class UpstreamError(Exception):
    """The server answered with an error; the caller got that answer unchanged."""


class Recorder(Protocol):
    """One call's record, fed what the server sends."""

    def whole(self, status: int, data: bytes) -> None: ...
    def event(self, data: bytes) -> None: ...
    def ended(self) -> None: ...
    def failed(self, error: BaseException, *, partial: bool) -> None: ...
    def abandoned(self, why: str) -> None: ...


def open_recorder(
    path: str, body: dict[str, Any], settings: Settings, server: Any
) -> tuple[Recorder, dict[str, Any]]:
    """The recorder of a call to ``path`` (``chat/completions`` or ``responses``) made in the
    current context, and the body to send: on a policy call it asks for exact tokens when
    ``settings`` say so (sampling parameters are never touched)."""
    if path == "responses":
        return _ResponsesCall(body, settings, server), body
    policy = _context.policy_scope(str(body.get("model", ""))) is not None
    if policy and settings.request_training_data:
        body = training_fields(body)
    as_sent = Settings(request_training_data=False, export_tokens=settings.export_tokens)
    return _ChatCall(Capture(body, as_sent, server)), body


def training_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` asking for ``logprobs`` and ``return_token_ids`` unless the caller set them:
    the shim's rule (``with_training_fields``), on a JSON body instead of SDK arguments."""
    extra = {"return_token_ids": body["return_token_ids"]} if "return_token_ids" in body else {}
    kwargs = with_training_fields({**body, "extra_body": extra})
    extra = kwargs.pop("extra_body")
    return {**kwargs, **extra}


class _ChatCall:
    """A Chat Completions call, parsed by the capture core."""

    __slots__ = ("capture", "done")

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.done = False

    def whole(self, status: int, data: bytes) -> None:
        self.done = True
        if status >= 400:
            self.capture.fail(UpstreamError(f"the server answered {status}: {_excerpt(data)}"))
            return
        with guarded("reading a Chat Completions response", self._unreadable):
            self.capture.complete(ChatCompletion.model_validate_json(data))

    def event(self, data: bytes) -> None:
        if self.done:
            return
        if data == b"[DONE]":
            self.ended()
            return
        with guarded("reading a Chat Completions stream", self._unreadable):
            try:
                chunk = ChatCompletionChunk.model_validate_json(data)
            except ValidationError:
                event = orjson.loads(data)
                if isinstance(event, dict) and "error" in event:  # vLLM's error in a stream
                    self.failed(
                        UpstreamError(f"the server sent {_excerpt(data)}"),
                        partial=True,
                    )
                    return
                raise
            self.capture.add_chunk(chunk)

    def ended(self) -> None:
        if not self.done:
            self.done = True
            self.capture.end_stream()

    def failed(self, error: BaseException, *, partial: bool) -> None:
        if not self.done:
            self.done = True
            self.capture.fail(error, partial=partial)

    def abandoned(self, why: str) -> None:
        if not self.done:
            self.done = True
            self.capture.abandon(why)

    def _unreadable(self, error: BaseException) -> None:
        self.done = True
        self.capture.lost(error)  # kept as context, marked, one warning if a policy turn


class _ResponsesCall(OpenCall):
    """A Responses API call, kept as context: its input, and its output's text and calls."""

    __slots__ = ()

    def __init__(self, body: dict[str, Any], settings: Settings, server: Any) -> None:
        model = str(body.get("model", ""))
        trajectory = _context.current_trajectory_var.get()
        scope = _context.policy_scope(model) if trajectory is not None else None
        tools = body.get("tools")
        call = LLMCall(
            model=model,
            messages=_input_messages(body),
            tools=[dict(t) for t in tools] if isinstance(tools, list) else None,
            params={
                k: jsonable(v)
                for k, v in body.items()
                if k not in ("input", "instructions", "tools", "model")
            },
            trainable=False,
            agent=scope.name if scope else None,
            streamed=bool(body.get("stream")),
        )
        super().__init__(call, trajectory, settings.export_tokens, server)
        if scope is not None:
            warn_untrainable(model, "a Responses API call", _RESPONSES_FIX)

    def whole(self, status: int, data: bytes) -> None:
        if status >= 400:
            self.fail(UpstreamError(f"the server answered {status}: {_excerpt(data)}"))
            return
        with guarded("reading a Responses response", self._unreadable):
            self._complete(orjson.loads(data))

    def event(self, data: bytes) -> None:
        if self._done:
            return
        with guarded("reading a Responses stream", self._unreadable):
            event = orjson.loads(data)
            kind = event.get("type") if isinstance(event, dict) else None
            if kind in ("response.completed", "response.incomplete"):
                self._complete(event["response"])
            elif kind in ("response.failed", "error"):
                self.fail(UpstreamError(f"the server sent {_excerpt(data)}"))

    def ended(self) -> None:
        self.abandon("the stream ended without a response.completed event")

    def failed(self, error: BaseException, *, partial: bool) -> None:
        self.call.partial = partial
        self.fail(error)

    def abandoned(self, why: str) -> None:
        self.abandon(why)

    def _complete(self, response: dict[str, Any]) -> None:
        text: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        for item in response.get("output") or ():
            if item.get("type") == "message":
                text += [p.get("text", "") for p in item.get("content") or () if "text" in p]
            elif item.get("type") == "function_call":
                tool_calls.append(
                    {
                        "id": item.get("call_id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                    }
                )
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "tool_calls" if tool_calls else "stop"
        self.call.response_id, self.call.response_model = response.get("id"), response.get("model")
        self.call.usage = response.get("usage")
        self.call.choices = [ChoiceRecord(0, message, finish)]
        self._finish()

    def _unreadable(self, error: BaseException) -> None:
        self.lost(error)


def _input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    items = body.get("input")
    messages = [{"role": "user", "content": items}] if isinstance(items, str) else []
    if isinstance(items, list):
        messages = [message_dict(i) for i in items if isinstance(i, dict)]
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    return messages


def _excerpt(data: bytes, limit: int = 500) -> str:
    """The start of a server's error body, without the keys (a 401 may echo the key)."""
    text = redact(data.decode("utf-8", "replace"))
    return text[:limit] + ("..." if len(text) > limit else "")
