"""The Responses API (``/v1/responses``): a call read from its JSON request body and the
server's JSON response or stream events.

A Responses call is kept as context: arttrace has no Responses parser for exact tokens yet, so
its text and function calls are recorded, not trained on, and the first one per model warns
(:class:`~arttrace.UntrainableTurnWarning`).
"""

from __future__ import annotations

from typing import Any

import orjson

from . import _context
from ._calls import OpenCall, Settings
from ._chat import message_dict
from ._guard import guarded
from ._records import ChoiceRecord, LLMCall, jsonable
from ._redact import UpstreamError, excerpt
from ._warnings import warn_untrainable

_RESPONSES_FIX = (
    "arttrace cannot read a Responses API call's exact tokens yet: point the agent at Chat "
    "Completions (for the OpenAI Agents SDK, OpenAIChatCompletionsModel)."
)


class ResponsesCall(OpenCall):
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
            self.fail(UpstreamError(f"the server answered {status}: {excerpt(data)}"))
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
                self.fail(UpstreamError(f"the server sent {excerpt(data)}"))

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
