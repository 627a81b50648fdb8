"""Assembly: the calls of one trajectory become conversations.

A call whose messages extend an earlier conversation (that conversation's messages and sampled
turns, in order) continues it; a call that extends none starts another one (a sub-agent, a
summariser, a context reset). With ``n > 1`` the first choice continues the conversation and
each other choice branches off it; a branch repeats the shared prefix as context only, so no
sampled turn is trained twice.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._records import ChoiceRecord, LLMCall, field_of


@dataclass(slots=True)
class Turn:
    """One sampled assistant turn inside a conversation."""

    call: LLMCall
    choice: ChoiceRecord
    context_only: bool = False

    @property
    def trainable(self) -> bool:
        return (
            self.call.trainable
            and not self.context_only
            and self.call.untrainable_reason(self.choice) is None
        )


Item = dict[str, Any] | Turn


@dataclass(slots=True)
class Conversation:
    items: list[Item] = field(default_factory=list)
    keys: list[Hashable] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    @property
    def trainable_turns(self) -> int:
        return sum(1 for item in self.items if isinstance(item, Turn) and item.trainable)

    def branch(self) -> Conversation:
        items: list[Item] = [
            Turn(i.call, i.choice, context_only=True) if isinstance(i, Turn) else i
            for i in self.items
        ]
        return Conversation(items, list(self.keys), self.tools)


def assemble(calls: Iterable[LLMCall]) -> list[Conversation]:
    conversations: list[Conversation] = []
    for call in sorted(calls, key=lambda c: c.seq):
        if not call.choices:
            continue
        keys = [message_key(m) for m in call.messages]
        base = _longest_prefix(conversations, keys)
        prefix = base.branch() if base is not None else Conversation()
        for i, choice in enumerate(call.choices):
            if i == 0 and base is not None:
                conversation = base
            else:
                conversation = prefix.branch()
                conversations.append(conversation)
            start = len(conversation.keys)
            conversation.items.extend(call.messages[start:])
            conversation.keys.extend(keys[start:])
            conversation.items.append(Turn(call, choice))
            conversation.keys.append(message_key(choice.message))
            conversation.tools = call.tools
    return conversations


def _longest_prefix(conversations: list[Conversation], keys: list[Hashable]) -> Conversation | None:
    best: Conversation | None = None
    for conversation in conversations:
        n = len(conversation.keys)
        if (
            n <= len(keys)
            and (best is None or n > len(best.keys))
            and keys[:n] == conversation.keys
        ):
            best = conversation
    return best


def message_key(message: dict[str, Any]) -> Hashable:
    """What identifies a message when comparing conversations.

    Lenient where frameworks differ without changing meaning: missing vs null vs empty content,
    text parts vs a string, surrounding whitespace, tool-call ids, JSON argument formatting.
    """
    calls = tuple(
        (
            field_of(field_of(tc, "function"), "name"),
            _arguments(field_of(field_of(tc, "function"), "arguments")),
        )
        for tc in message.get("tool_calls") or ()
    )
    return (message.get("role"), _text(message.get("content")), calls)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    parts = [
        part.get("text", "") if part.get("type") == "text" else json.dumps(part, sort_keys=True)
        for part in content
        if isinstance(part, dict)
    ]
    return "".join(parts).strip()


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return str(arguments)
    return json.dumps(arguments, sort_keys=True)
