"""Conversations as ART data: dict messages, and each trainable turn an OpenAI ``Choice``
carrying its logprobs and vLLM's ``prompt_token_ids`` / ``token_ids`` (what ART 0.5.23's
tokenizer requires of a trainable turn)."""

from __future__ import annotations

from typing import Any

import art
from art.trajectories import LegacyHistory
from openai.types.chat.chat_completion import Choice

from .capture._conversations import Conversation, Turn


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
    # model_validate on plain dicts (pydantic-core) is far faster than openai's model_construct.
    record, prompt = turn.choice, turn.call.prompt_token_ids
    assert record.logprobs is not None and record.token_ids is not None and prompt is not None
    tokens = record.tokens or [f"token_id:{i}" for i in record.token_ids]
    top = record.top_logprobs or [[] for _ in tokens]
    content = [
        {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": alts}
        for token, logprob, alts in zip(tokens, record.logprobs, top, strict=True)
    ]
    return Choice.model_validate(
        {
            "index": record.index,
            "finish_reason": record.finish_reason,
            "message": record.message,
            "logprobs": {"content": content, "refusal": None},
            "prompt_token_ids": prompt.tolist(),
            "token_ids": record.token_ids.tolist(),
        }
    )


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
