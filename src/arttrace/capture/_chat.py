"""Chat Completions through the OpenAI SDK: a :class:`Capture` is one call, read from the
request's keyword arguments and finished from the parsed response or from the stream's chunks."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion import Choice

from . import _context
from ._calls import OpenCall, Settings
from ._records import ChoiceRecord, LLMCall, jsonable, token_ids_from_tokens

if TYPE_CHECKING:
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

_NOT_PARAMS = frozenset({"messages", "tools", "extra_headers", "extra_query", "timeout", "model"})
_SENTINELS = (openai.NotGiven, openai.Omit)


def message_dict(message: Any) -> dict[str, Any]:
    """A request message as a plain dict (SDK message objects are dumped, dicts copied)."""
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if dump is not None:
        return dict(dump(exclude_none=True))
    raise TypeError(f"arttrace cannot record a message of type {type(message).__name__}")


def _given(value: Any) -> bool:
    return value is not None and not isinstance(value, _SENTINELS)


def with_training_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` asking for logprobs and vLLM token ids, unless the caller already decided."""
    out = dict(kwargs)
    if not _given(out.get("logprobs")):
        out["logprobs"] = True
    extra_body = out.get("extra_body")
    extra = dict(extra_body) if isinstance(extra_body, Mapping) else {}
    if "return_token_ids" not in extra:
        extra["return_token_ids"] = True
        out["extra_body"] = extra
    return out


class Capture(OpenCall):
    """One Chat Completions call through the OpenAI SDK."""

    __slots__ = ("_choices", "kwargs")

    def __init__(self, kwargs: dict[str, Any], settings: Settings, server: Any) -> None:
        trajectory = _context.current_trajectory_var.get()
        model = str(kwargs.get("model", ""))
        scope = _context.policy_scope(model) if trajectory is not None else None
        if scope is not None and settings.request_training_data:
            kwargs = with_training_fields(kwargs)
        for name in ("messages", "tools"):  # an iterator would be used up by the record
            value = kwargs.get(name)
            if value is not None and _given(value) and not isinstance(value, list | tuple):
                kwargs = {**kwargs, name: list(value)}
        self.kwargs = kwargs
        tools = kwargs.get("tools") if _given(kwargs.get("tools")) else None
        call = LLMCall(
            model=model,
            messages=[message_dict(m) for m in kwargs.get("messages") or ()],
            tools=[dict(t) for t in tools] if tools is not None else None,
            params={
                k: jsonable(v) for k, v in kwargs.items() if k not in _NOT_PARAMS and _given(v)
            },
            trainable=scope is not None,
            agent=scope.name if scope else None,
            streamed=bool(kwargs.get("stream")),
        )
        self._choices: dict[int, _StreamedChoice] = {}
        super().__init__(call, trajectory, settings.export_tokens, server)

    # -- whole responses -------------------------------------------------------------------

    def complete(self, completion: ChatCompletion) -> None:
        call = self.call
        extra = completion.model_extra or {}
        call.prompt_token_ids = _ids(extra.get("prompt_token_ids"))
        call.response_id, call.response_model = completion.id, completion.model
        call.usage = completion.usage.model_dump(exclude_none=True) if completion.usage else None
        call.choices = [_choice_record(c) for c in completion.choices]
        self._finish()

    # -- streams ---------------------------------------------------------------------------

    def add_chunk(self, chunk: ChatCompletionChunk) -> None:
        if self._done:
            return
        call = self.call
        if call.response_id is None:
            call.response_id, call.response_model = chunk.id, chunk.model
        extra = chunk.__pydantic_extra__
        if extra and call.prompt_token_ids is None and "prompt_token_ids" in extra:
            call.prompt_token_ids = _ids(extra["prompt_token_ids"])
        if chunk.usage is not None:
            call.usage = chunk.usage.model_dump(exclude_none=True)
        for choice in chunk.choices:
            acc = self._choices.get(choice.index)
            if acc is None:
                acc = self._choices[choice.index] = _StreamedChoice(choice.index)
            acc.add(choice)

    def end_stream(self) -> None:
        self.call.choices = self._streamed_choices()
        self._finish()

    def _streamed_choices(self) -> list[ChoiceRecord]:
        return [self._choices[i].record() for i in sorted(self._choices)]

    # -- endings ---------------------------------------------------------------------------

    def fail(self, error: BaseException, *, partial: bool = False) -> None:
        """The call raised (``partial``: after part of the response had arrived)."""
        if partial:
            self.call.choices = self._streamed_choices()
        self.call.partial = partial
        super().fail(error)

    def abandon(self, why: str) -> None:
        if not self._done:
            self.call.choices = self._streamed_choices()
        super().abandon(why)


class _StreamedChoice:
    """One choice reassembled from stream deltas."""

    __slots__ = (
        "content",
        "finish_reason",
        "index",
        "logprobs",
        "refusal",
        "saw_logprobs",
        "token_ids",
        "tokens",
        "tool_calls",
        "top",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs = array("d")
        self.tokens: list[str] = []
        self.token_ids: array[int] | None = None
        self.top: list[list[dict[str, Any]]] = []
        self.saw_logprobs = False
        self.finish_reason: str | None = None

    def add(self, choice: Any) -> None:
        delta = choice.delta
        if delta.content:
            self.content.append(delta.content)
        if delta.refusal:
            self.refusal.append(delta.refusal)
        if delta.tool_calls:
            for tc in delta.tool_calls:
                slot = self.tool_calls.get(tc.index)
                if slot is None:
                    slot = self.tool_calls[tc.index] = {"id": None, "name": [], "arguments": []}
                if tc.id:
                    slot["id"] = tc.id
                if tc.function is not None:
                    if tc.function.name:
                        slot["name"].append(tc.function.name)
                    if tc.function.arguments:
                        slot["arguments"].append(tc.function.arguments)
        extra = choice.__pydantic_extra__
        ids = extra.get("token_ids") if extra else None
        if ids:
            if self.token_ids is None:
                self.token_ids = array("q")
            self.token_ids.extend(ids)
        logprobs = choice.logprobs
        if logprobs is not None and logprobs.content is not None:
            self.saw_logprobs = True
            for token in logprobs.content:
                self.logprobs.append(token.logprob)
                if not ids:  # the token strings matter only when the ids are not sent
                    self.tokens.append(token.token)
                if token.top_logprobs:
                    self.top.append(_top(token))
        if choice.finish_reason:
            self.finish_reason = choice.finish_reason

    def record(self) -> ChoiceRecord:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": slot["id"],
                    "type": "function",
                    "function": {
                        "name": "".join(slot["name"]),
                        "arguments": "".join(slot["arguments"]),
                    },
                }
                for _, slot in sorted(self.tool_calls.items())
            ]
        record = ChoiceRecord(index=self.index, message=message, finish_reason=self.finish_reason)
        record.token_ids = self.token_ids
        if self.saw_logprobs:
            record.logprobs = self.logprobs
            _set_tokens(record, self.tokens, self.top)
        return record


def _top(token: ChatCompletionTokenLogprob) -> list[dict[str, Any]]:
    return [{"token": t.token, "logprob": t.logprob} for t in token.top_logprobs or ()]


def _set_tokens(record: ChoiceRecord, tokens: list[str], top: list[list[dict[str, Any]]]) -> None:
    """Token ids from ``token_id:<int>`` tokens when the server sent no ids, else the strings."""
    if tokens and record.token_ids is None:
        record.token_ids = token_ids_from_tokens(tokens)
        if record.token_ids is None:
            record.tokens = tokens
    if record.logprobs is not None and len(top) == len(record.logprobs):
        record.top_logprobs = top


def _ids(raw: Any) -> array[int] | None:
    return None if raw is None else array("q", raw)


def _choice_record(choice: Choice) -> ChoiceRecord:
    m = choice.message
    message: dict[str, Any] = {"role": "assistant", "content": m.content}
    if m.refusal:
        message["refusal"] = m.refusal
    if m.tool_calls:
        message["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in m.tool_calls]
    record = ChoiceRecord(index=choice.index, message=message, finish_reason=choice.finish_reason)
    extra = choice.model_extra
    record.token_ids = _ids(extra.get("token_ids")) if extra else None
    logprobs = choice.logprobs
    if logprobs is not None and logprobs.content is not None:
        content = logprobs.content
        record.logprobs = array("d", [t.logprob for t in content])
        tokens = [t.token for t in content] if record.token_ids is None else []
        top = [_top(t) for t in content] if content and content[0].top_logprobs else []
        _set_tokens(record, tokens, top)
    return record
