"""The legacy Completions API (``/v1/completions``): a prompt in, text out.

ART trains chat conversations, so a Completions call is kept as context, never trained on: its
prompt and texts are recorded, and the first one per model made inside ``@trainable`` warns
(:class:`~arttrace.UntrainableTurnWarning`) with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import _context
from ._calls import OpenCall, Settings
from ._guard import guarded
from ._records import ChoiceRecord, LLMCall, jsonable

COMPLETIONS_FIX = (
    "ART trains chat conversations: call the model through Chat Completions "
    "(/v1/chat/completions) to train on its turns."
)


class CompletionsCall(OpenCall):
    """A Completions call, kept as context: its prompt, and each choice's text."""

    __slots__ = ("_finish_reasons", "_texts")

    def __init__(self, body: dict[str, Any], settings: Settings, server: Any) -> None:
        model = str(body.get("model", ""))
        trajectory = _context.current_trajectory_var.get()
        scope = _context.policy_scope(model) if trajectory is not None else None
        prompt = body.get("prompt")
        call = LLMCall(
            model=model,
            messages=[{"role": "user", "content": prompt if isinstance(prompt, str) else None}],
            params={k: jsonable(v) for k, v in body.items() if k not in ("prompt", "model")},
            agent=scope.name if scope else None,
            policy=scope.policy if scope else None,
            streamed=bool(body.get("stream")),
        )
        if not isinstance(prompt, str):
            call.params["prompt"] = jsonable(prompt)
        self._texts: dict[int, list[str]] = {}
        self._finish_reasons: dict[int, str | None] = {}
        super().__init__(call, trajectory, settings.export_tokens, server)
        if scope is not None:
            self._warn("a Completions API call", COMPLETIONS_FIX)

    def whole(self, status: int, data: bytes) -> None:
        if self.refused(status, data):
            return
        with guarded("reading a Completions response", self.lost):
            self._read(orjson.loads(data))
            self._end()

    def event(self, data: bytes) -> None:
        if data == b"[DONE]":
            self.ended()
        elif not self._done:
            with guarded("reading a Completions stream", self.lost):
                self._read(orjson.loads(data))

    def ended(self) -> None:
        if not self._done:
            with guarded("ending a Completions stream", self.lost):
                self._end()

    def failed(self, error: BaseException, *, partial: bool) -> None:
        self.fail(error, partial=partial)

    def abandoned(self, why: str) -> None:
        self.abandon(why)

    def _read(self, answer: dict[str, Any]) -> None:
        call = self.call
        call.response_id = call.response_id or answer.get("id")
        call.response_model = call.response_model or answer.get("model")
        usage = answer.get("usage")
        if isinstance(usage, Mapping) and usage:
            call.usage = dict(usage)
        for choice in answer.get("choices") or ():
            index = int(choice.get("index", 0))
            self._texts.setdefault(index, []).append(choice.get("text") or "")
            if choice.get("finish_reason"):
                self._finish_reasons[index] = choice["finish_reason"]

    def _end(self) -> None:
        self.call.choices = [
            ChoiceRecord(
                i,
                {"role": "assistant", "content": "".join(self._texts[i])},
                self._finish_reasons.get(i),
            )
            for i in sorted(self._texts)
        ]
        self._finish()
