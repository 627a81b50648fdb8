"""Conversations as ART data: dict messages, and each trainable turn an OpenAI ``Choice``
carrying its logprobs and vLLM's ``prompt_token_ids`` / ``token_ids`` (what ART 0.5.23's
tokenizer requires of a trainable turn).

A Choice carries one pydantic object per sampled token, the bulk of a training step's
conversion to ART. Those objects are built here as ``model_validate`` would build them, without
checking again what the record's types already guarantee (``bench/bench_convert.py``: a
5-20% saving; allocating them is most of the cost); ``tests/capture/test_art_convert.py`` holds them
equal to validated ones."""

from __future__ import annotations

from typing import Any

import art
from art.trajectories import LegacyHistory
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from pydantic import BaseModel, TypeAdapter

from ._conversations import Conversation, Turn
from ._records import AS_OPENAI_FINISH_REASON, ChoiceRecord

_new, _set = object.__new__, object.__setattr__
_TOKENS = TypeAdapter(list[str])
_ALTERNATIVES = TypeAdapter(list[list[TopLogprob]])
_TOKEN_NAMES: dict[int, str] = {}
"""``token_id:<id>`` strings by id: immutable, so every token of an id can share one (most of
a step's tokens come from a few thousand ids)."""
_MAX_TOKEN_NAMES = 1 << 16


def messages_and_choices(conversation: Conversation) -> list[Any]:
    return [
        (_choice(item) if item.trainable else _context_message(item))
        if isinstance(item, Turn)
        else item
        for item in conversation.items
    ]


def history(conversation: Conversation) -> LegacyHistory:
    return LegacyHistory(
        messages_and_choices=messages_and_choices(conversation),
        tools=conversation.tools,  # type: ignore[arg-type]  # plain dicts of that TypedDict shape
    )


def _context_message(turn: Turn) -> dict[str, Any]:
    message = dict(turn.choice.message)
    if message.get("content") is None and not message.get("tool_calls"):
        message["content"] = ""
    return message


def _choice(turn: Turn) -> Choice:
    """The turn's Choice. Its message, finish reason and the extras are validated (once per
    turn); its logprobs are built directly (once per token). A finish reason outside the
    OpenAI set that still means a complete sample (vLLM's ``repetition``) becomes the one
    that means the same to GRPO (``length``), since a Choice accepts only OpenAI's."""
    record, prompt = turn.choice, turn.call.prompt_token_ids
    assert prompt is not None and record.token_ids is not None  # a trainable turn has both
    finish = record.finish_reason or ""
    return Choice.model_validate(
        {
            "index": record.index,
            "finish_reason": AS_OPENAI_FINISH_REASON.get(finish, finish),
            "message": record.message,
            "logprobs": _built(
                ChoiceLogprobs, {"content": _token_logprobs(record), "refusal": None}
            ),
            "prompt_token_ids": prompt.tolist(),
            "token_ids": record.token_ids.tolist(),
        }
    )


def _token_logprobs(record: ChoiceRecord) -> list[ChatCompletionTokenLogprob]:
    """``ChatCompletionTokenLogprob.model_validate`` of each token's ``{"token", "bytes": None,
    "logprob", "top_logprobs"}``, built directly: each logprob is a float (the record holds them
    in an ``array("d")``), each token a string (``token_id:<id>``, or checked here), and the
    alternatives, present only when the request asked for them, are validated."""
    assert record.logprobs is not None
    tokens = _TOKENS.validate_python(record.tokens) if record.tokens else _token_names(record)
    top = (
        _ALTERNATIVES.validate_python(record.top_logprobs)
        if record.top_logprobs
        else [[] for _ in tokens]
    )
    out: list[ChatCompletionTokenLogprob] = []
    append, cls = out.append, ChatCompletionTokenLogprob
    for token, logprob, alternatives in zip(tokens, record.logprobs, top, strict=True):
        item = _new(cls)  # _built(), inlined: this loop runs once per sampled token
        _set(
            item,
            "__dict__",
            {"token": token, "bytes": None, "logprob": logprob, "top_logprobs": alternatives},
        )
        _set(item, "__pydantic_fields_set__", {"token", "bytes", "logprob", "top_logprobs"})
        _set(item, "__pydantic_extra__", {})
        _set(item, "__pydantic_private__", None)
        append(item)
    return out


def _token_names(record: ChoiceRecord) -> list[str]:
    """``token_id:<id>`` for each sampled id (vLLM's form), one shared string per id."""
    assert record.token_ids is not None
    names = _TOKEN_NAMES
    if len(names) > _MAX_TOKEN_NAMES:
        names.clear()
    return [names.get(i) or names.setdefault(i, f"token_id:{i}") for i in record.token_ids]


def _built[M: BaseModel](cls: type[M], values: dict[str, Any]) -> M:
    """``cls`` holding ``values`` (every field, in declaration order, already of its type) as
    ``cls.model_validate(values)`` builds it, without validating."""
    model = _new(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", {})
    _set(model, "__pydantic_private__", None)
    return model


def trainable_tokens(trajectory: art.Trajectory) -> int:
    """Sampled tokens ART will train on in ``trajectory`` (its trainable Choices)."""
    histories = [trajectory.messages_and_choices] + [
        h.messages_and_choices for h in trajectory.additional_histories
    ]
    return sum(
        len((item.model_extra or {}).get("token_ids") or ())
        for history in histories
        for item in history
        if isinstance(item, Choice) and item.logprobs is not None
    )
