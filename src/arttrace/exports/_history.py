"""A run's conversations as ART trains on them, read straight off its records (no ``art``
import, no per-token objects): the messages ``to_art()`` gives, in the form ART's
``Trajectory.messages()`` renders them, and the token sequences ART's tokenizer assembles from
its trainable turns. ``tests/exports/test_exports.py`` holds both equal to ART's own functions."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..capture._continuity import art_walk
from ..capture._conversations import Conversation, Turn
from ..capture._records import COMPLETE
from ..capture._redact import redact
from ..capture._trajectory import Trajectory


def histories(trajectory: Trajectory, policy: str | None = None) -> list[Conversation]:
    """The run's conversations, ART's order: ``messages_and_choices`` first, then each of
    ``additional_histories``; with ``policy``, as ``to_art(policy=...)`` gives that policy's
    (only its turns are policy turns, every other one context)."""
    return trajectory.conversations(policy)


def messages(
    conversation: Conversation, end: int | None = None, *, weighted: bool = False
) -> list[dict[str, Any]]:
    """The conversation's messages (its first ``end`` items) as ``Trajectory.messages()``
    renders ``to_art()``'s: a trainable turn (an ART ``Choice``) as ``role``, ``content`` and
    its ``tool_calls``; any other message as recorded, its null content as ``""``. Keys whose
    value is null are left out (absent and null mean the same in the OpenAI format). Not yet
    redacted: :func:`redacted_json` redacts the text written. ``weighted``: an assistant
    message that is not a :func:`policy_turn` (another policy's, or context) carries
    ``"weight": 0``, the OpenAI fine-tuning format's mark for a message not learned."""
    out = []
    for item in conversation.items[:end]:
        if isinstance(item, Turn) and item.trainable:
            recorded = item.choice.message
            message: dict[str, Any] = {"role": "assistant", "content": recorded.get("content")}
            if recorded.get("tool_calls"):
                message["tool_calls"] = recorded["tool_calls"]
        else:
            message = dict(item.choice.message if isinstance(item, Turn) else item)
        if message.get("content") is None:
            message["content"] = ""
        if weighted and message.get("role") == "assistant" and not policy_turn(item):
            message["weight"] = 0
        out.append({k: v for k, v in message.items() if v is not None})
    return out


def redacted_json(value: Any) -> str:
    """``value`` as JSON text, text shaped like a key (and every secret this process has seen)
    redacted, as the journal's error texts are: one pass over the whole text, which a
    replacement (``[redacted]``, no quote or backslash) leaves valid JSON."""
    return redact(orjson.dumps(value).decode())


def policy_turn(item: object) -> bool:
    """A turn the policy sampled whole: a call made inside ``@trainable`` (or through a
    gateway run), not a branch's repeated prefix, its reply complete. Its token ids and logprobs
    are not needed: SFT learns the text."""
    if not isinstance(item, Turn) or not item.call.trainable or item.context_only:
        return False
    call = item.call
    whole = not (call.capture_error or call.partial or call.error)
    return whole and item.choice.finish_reason in COMPLETE


def last_policy_turn(conversation: Conversation) -> int | None:
    """The index of the conversation's last :func:`policy_turn`, ``None`` if it has none."""
    return max((i for i, item in enumerate(conversation.items) if policy_turn(item)), default=None)


@dataclass(slots=True)
class Sequences:
    """The token sequences ART trains on for one run, end to end (``sequence_lengths`` cut
    them apart): ids, each token's sampled logprob (NaN for context), and the mask (True on the
    sampled tokens of trainable turns). ``offsets[k]`` is where trainable turn ``k``'s sampled
    tokens start (its prompt is everything before, back to its sequence's start)."""

    token_ids: array[int] = field(default_factory=lambda: array("q"))
    logprobs: array[float] = field(default_factory=lambda: array("d"))
    mask: bytearray = field(default_factory=bytearray)
    sequence_lengths: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


_NAN = array("d", [float("nan")])


def sequences(conversations: list[Conversation]) -> Sequences:
    """As ART's ``assemble_vllm_training_sequences`` builds them from ``to_art()``'s histories
    (:func:`~arttrace.capture._continuity.art_walk`): each trainable turn's prompt extends the
    sequence so far (only its new suffix is added, as context) or, when it does not, starts a
    new sequence; its sampled tokens follow, masked in."""
    out = Sequences()
    start = 0  # where the current sequence starts in the flat arrays
    for _, turn, new_sequence in art_walk(conversations):
        prompt, record = turn.call.prompt_token_ids, turn.choice
        assert prompt is not None and record.token_ids is not None and record.logprobs is not None
        if new_sequence and len(out.token_ids) > start:
            out.sequence_lengths.append(len(out.token_ids) - start)
            start = len(out.token_ids)
        suffix = prompt[len(out.token_ids) - start :]
        _extend(out.token_ids, suffix)
        out.logprobs.extend(_NAN * len(suffix))
        out.mask.extend(bytes(len(suffix)))
        out.offsets.append(len(out.token_ids))
        _extend(out.token_ids, record.token_ids)
        _extend(out.logprobs, record.logprobs)
        out.mask.extend(b"\x01" * len(record.token_ids))
    if len(out.token_ids) > start:
        out.sequence_lengths.append(len(out.token_ids) - start)
    return out


def _extend(into: array[Any], values: array[Any]) -> None:
    """``into`` extended by ``values`` whatever their item size: a record keeps token ids in 4
    bytes and logprobs in float32 when that is exact (``capture._records.compact_ids``)."""
    into.extend(values if values.typecode == into.typecode else values.tolist())
