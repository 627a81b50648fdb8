"""Assembly: the calls of one trajectory become conversations.

A call whose messages extend an earlier conversation (that conversation's messages and sampled
turns, in order) continues it; a call that extends none starts another one. With ``n > 1`` the
first choice continues the conversation and each other choice branches off it; a branch repeats
the shared prefix as context only, so no sampled turn is trained twice.

A call that extends none may still be the same agent carrying on after it changed an earlier
message (a timestamp in the system prompt, an edited user message or tool result, a trimmed
history, reasoning stripped from its own turn): its new conversation *continues* the earlier
one (:class:`Continuation`). The rule, which a sub-agent (its own system prompt and task) or a
fresh attempt at the task does not meet:

1. the call sends back the earlier conversation's latest sampled turn (leniently: a
   ``<think>`` block and surrounding whitespace aside): only the agent that got an answer
   carries it on; or it repeats that conversation's messages before the turn and puts an
   assistant message in the turn's place (the agent rewrote its own turn, as ReAct agents
   re-render their action); and
2. its first message is the earlier conversation's first message, or an edit of it: the same
   role, with at least half of the text in common at its start and end (a timestamp, a
   counter, a note appended).

Of several such conversations, the one whose turn comes latest in the call's messages wins,
then the one sampled last. Token continuity (``capture._continuity``) counts the step from
the earlier conversation into its continuation as a turn boundary (a break, cause ``other``,
when the prompt no longer extends the earlier one, as it almost never does); the run's main
conversation is the agent's longest-running one (:func:`main_first`), and a reader who
wants each conversation once reads :meth:`Conversation.timeline` of :func:`latest`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._records import ChoiceRecord, LLMCall, field_of

Key = tuple[Any, str, tuple[tuple[Any, str], ...]]
"""A message as :func:`message_key` identifies it: role, text, tool calls."""
Edit = Literal["system", "user", "assistant", "tool", "trimmed"]
"""What changed first when a conversation continues an earlier one: a message of that role
was edited (or inserted), or ``trimmed``: earlier messages were removed."""
SIMILAR = 0.5
"""How much of an edited first message's text must be kept at its start and end (rule 2)."""


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


@dataclass(frozen=True, slots=True, eq=False)
class Continuation:
    """How a conversation carries on an earlier one whose messages the agent changed."""

    of: Conversation
    """The earlier conversation."""
    turn: Turn
    """Its latest sampled turn, which the first call sent back."""
    resumed_at: int
    """This conversation's items from here on are new (after that turn)."""
    edit: Edit
    """What changed first."""
    message: int
    """The index of the first changed message, in the earlier conversation's items."""


@dataclass(slots=True, eq=False)
class Conversation:
    items: list[Item] = field(default_factory=list)
    keys: list[Key] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    continues: Continuation | None = None

    @property
    def trainable_turns(self) -> int:
        return sum(1 for item in self.items if isinstance(item, Turn) and item.trainable)

    def branch(self) -> Conversation:
        items: list[Item] = [
            Turn(i.call, i.choice, context_only=True) if isinstance(i, Turn) else i
            for i in self.items
        ]
        return Conversation(items, list(self.keys), self.tools)

    def timeline(self) -> list[Item]:
        """Its items with those of the conversations it continues, each message once: the
        earliest version of the history (up to the turn sent back), then what each
        continuation added. A reader (a judge) sees the whole conversation, not one copy of
        the history per edit."""
        chain = [self]
        while (carried_on := chain[-1].continues) is not None:
            chain.append(carried_on.of)
        items = list(chain[-1].items)
        for conversation in reversed(chain[:-1]):
            carried_on = conversation.continues
            assert carried_on is not None
            cut = next(i for i in range(len(items) - 1, -1, -1) if items[i] is carried_on.turn)
            items = [*items[: cut + 1], *conversation.items[carried_on.resumed_at :]]
        return items


def assemble(calls: Iterable[LLMCall]) -> list[Conversation]:
    conversations: list[Conversation] = []
    for call in sorted(calls, key=lambda c: c.seq):
        if not call.choices:
            continue
        keys = [message_key(m) for m in call.messages]
        base = _longest_prefix(conversations, keys)
        continued = None if base is not None else _continued(conversations, keys)
        prefix = base.branch() if base is not None else Conversation()
        for i, choice in enumerate(call.choices):
            if i == 0 and base is not None:
                conversation = base
            else:
                conversation = prefix.branch()
                if i == 0:
                    conversation.continues = continued
                conversations.append(conversation)
            start = len(conversation.keys)
            conversation.items.extend(call.messages[start:])
            conversation.keys.extend(keys[start:])
            conversation.items.append(Turn(call, choice))
            conversation.keys.append(message_key(choice.message))
            conversation.tools = call.tools
    return conversations


def main_first(conversations: Sequence[Conversation]) -> list[Conversation]:
    """``conversations`` (as :func:`assemble` orders them) with the main one first, the
    others in their order. The main one is the agent's longest-running conversation: the most
    policy turns, those of the conversations it carries on after an edit included; of equals,
    the one whose last policy turn came later (a planner called first is not the main one, nor
    a summary written at the end of a longer conversation, nor an early fragment of a
    conversation the agent edited as it went)."""
    counts: dict[int, int] = {}
    best, main = (-1, -1), 0
    for i, conversation in enumerate(conversations):
        turns = [item for item in conversation.items if isinstance(item, Turn) and _policy(item)]
        n = len(turns)
        carried_on = conversation.continues
        if carried_on is not None:  # the turns it carries on, up to the one it sent back
            items = carried_on.of.items
            cut = next(k for k in range(len(items) - 1, -1, -1) if items[k] is carried_on.turn)
            n += counts.get(id(carried_on.of), 0) - sum(map(_policy, items[cut + 1 :]))
        counts[id(conversation)] = n
        score = (n, max((turn.call.seq for turn in turns), default=-1))
        if score > best:
            best, main = score, i
    out = list(conversations)
    if out:
        out.insert(0, out.pop(main))
    return out


def _policy(item: Item) -> bool:
    return isinstance(item, Turn) and item.call.trainable and not item.context_only


def latest(conversations: Sequence[Conversation]) -> list[Conversation]:
    """The conversations no other one carries on from their last turn (in their order): with
    their :meth:`~Conversation.timeline`, every message of the run once."""
    carried = {id(c.continues.turn) for c in conversations if c.continues is not None}
    return [c for c in conversations if id(c.items[-1]) not in carried]


def _longest_prefix(conversations: list[Conversation], keys: list[Key]) -> Conversation | None:
    best: Conversation | None = None
    for conversation in conversations:
        n = len(conversation.keys)
        if (
            n <= len(keys)
            and (best is None or n > len(best.keys))
            and keys[n - 1] == conversation.keys[-1]  # cheap first: most conversations differ
            and keys[:n] == conversation.keys
        ):
            best = conversation
    return best


def _continued(conversations: list[Conversation], keys: list[Key]) -> Continuation | None:
    """The earlier conversation this call (its messages' keys) carries on after changing its
    messages (the module's rule), and what changed; ``None`` for a conversation of its own.
    Keys only: a call's messages are not read again."""
    if not keys:
        return None
    where = {_loose(k): i for i, k in enumerate(keys)}  # the last place of each
    found: list[tuple[int, int, int, Conversation, Turn]] = []
    for n, conversation in enumerate(conversations):
        turn = conversation.items[-1]
        if not isinstance(turn, Turn) or turn.context_only:
            continue
        at = where.get(_loose(conversation.keys[-1]))
        if at is None:
            at = _rewritten(conversation, keys)
        if at is not None:
            found.append((at, turn.call.seq, -n, conversation, turn))
    found.sort(key=lambda f: f[:3], reverse=True)  # the best first: rule 2 is checked once
    for at, _, _, conversation, turn in found:
        if _same_start(conversation.keys[0], keys[0]):
            edit, index = _edit(conversation, keys, at)
            return Continuation(conversation, turn, at + 1, edit, index)
    return None


def _rewritten(conversation: Conversation, keys: list[Key]) -> int | None:
    """Where the call puts an assistant message in place of ``conversation``'s latest turn,
    after all of that conversation's earlier messages as they were; else ``None``."""
    n = len(conversation.keys)
    if n < 2 or len(keys) < n or keys[n - 1][0] != "assistant":
        return None
    if keys[n - 2] != conversation.keys[-2] or keys[: n - 1] != conversation.keys[:-1]:
        return None
    return n - 1


def _same_start(first: Key, key: Key) -> bool:
    """Rule 2: the message of ``key`` is the one of ``first`` or an edit of it keeping most of
    its text."""
    if first == key:
        return True
    if first[0] != key[0]:
        return False
    a, b = first[1], key[1]
    longest = max(len(a), len(b))
    if not longest:
        return True
    front = _common(a, b)
    back = _common(a[front:][::-1], b[front:][::-1])
    return front + back >= SIMILAR * longest


def _common(a: str, b: str) -> int:
    """Length of the common prefix of two strings (bisection: each test compares in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _edit(conversation: Conversation, keys: list[Key], at: int) -> tuple[Edit, int]:
    """What the call changed in ``conversation``'s history before its latest turn (which sits
    at ``keys[at]``), and where: the first message that differs, ``trimmed`` when the call's
    history is the earlier one with messages left out, the first one added when it is the
    earlier one with messages put in."""
    old, new = conversation.keys[:-1], keys[:at]
    front = 0
    while front < min(len(old), len(new)) and old[front] == new[front]:
        front += 1
    if front == len(old) == len(new):  # only the turn itself differs (reasoning stripped)
        return "assistant", len(old)
    if len(new) < len(old) and _subsequence(new, old):
        return "trimmed", front
    if front == len(old) or (len(new) > len(old) and _subsequence(old, new)):
        return _kind(new[front][0]), front
    return _kind(old[front][0]), front


def _kind(role: Any) -> Edit:
    if role in ("system", "developer"):
        return "system"
    if role == "assistant":
        return "assistant"
    if role in ("tool", "function"):
        return "tool"
    return "user"


def _subsequence(short: Sequence[Key], long: Sequence[Key]) -> bool:
    rest = iter(long)
    return all(any(k == x for x in rest) for k in short)


def message_key(message: dict[str, Any]) -> Key:
    """What identifies a message when comparing conversations: its role, text and tool calls.

    Lenient where frameworks differ without changing meaning: missing vs null vs empty content,
    text parts vs a string, surrounding whitespace, tool-call ids, JSON argument formatting.
    """
    return (message.get("role"), _text(message.get("content")), _calls(message))


def _loose(key: Key) -> Key:
    """A :func:`message_key` with a ``<think>`` block left out of the text: an agent that
    strips the reasoning from its own turn still sends that turn back."""
    role, text, calls = key
    if "</think>" not in text:
        return key
    return (role, text.rsplit("</think>", 1)[1].strip(), calls)


def _calls(message: dict[str, Any]) -> tuple[tuple[Any, str], ...]:
    return tuple(
        (
            field_of(field_of(tc, "function"), "name"),
            _arguments(field_of(field_of(tc, "function"), "arguments")),
        )
        for tc in message.get("tool_calls") or ()
    )


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
