"""What the pages get: the store's rows as JSON, and a run as ART will train on it.

A run is shown from the conversations :meth:`arttrace.Trajectory.to_art` is built from (the
main conversation is ``messages_and_choices``, the others ``additional_histories``; a
trainable turn becomes an OpenAI ``Choice`` carrying its token ids and logprobs, any other
turn a plain message), without loading ART itself, which takes half a minute to import.

Every answer is bounded: a message's text and a turn's tokens are cut at a limit, with the
size of what was left out, and the rest is asked for item by item (:func:`item_view`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..capture._conversations import Conversation, Turn
from ..capture._records import LLMCall
from ..capture._trajectory import Trajectory
from ..capture._warnings import fix_for
from ..store import StepRow, ValidationRow

MAX_TEXT = 20_000
"""Characters of one message's text (or a tool call's arguments) sent with the run."""
MAX_TOKENS = 2_000
"""Sampled tokens of one turn sent with the run; the rest through the item's own answer."""
MAX_ITEMS = 2_000
"""Messages and turns of one conversation sent with the run."""
MAX_STEPS = 20_000
"""Steps sent with the overview (the first ones; a run with more says it was cut)."""
_STEP_COLUMNS = (
    "step",
    "epoch",
    "reward_mean",
    "reward_std",
    "groups_total",
    "groups_kept",
    "groups_dropped",
    "trainable_tokens",
    "loss",
    "rollout_seconds",
    "train_seconds",
    "off_policy_steps_mean",
)
_WHY_DROPPED = ("groups_without_trainable_tokens", "groups_excluded_by_curriculum")
"""The Trainer's counts of groups with learning signal that did not ship, and why."""
_POLICY_COLUMNS = (
    "step",
    "reward_mean",
    "reward_std",
    "groups_total",
    "groups_kept",
    "trainable_tokens",
    "loss",
)
"""A policy's own figures in a step of several (``<policy>/reward_mean`` ...)."""
_VALIDATION_COLUMNS = ("step", "reward_mean", "reward_std", "examples", "exceptions")
TextOf = Callable[[list[int]], list[str | None]]
"""A tokenizer's text of each token id (``None``: an id it does not have)."""
NOT_A_POLICY_TURN = "not a policy turn: made outside every @trainable function (context)"
BRANCH_PREFIX = (
    "context: a turn of the shared prefix this branch (n > 1) repeats; it trains in the "
    "conversation it was sampled in"
)


# -- rows -----------------------------------------------------------------------------------


def row(value: Any) -> dict[str, Any]:
    """A store row (a frozen dataclass) as a JSON object."""
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def overview(
    steps: Sequence[StepRow],
    validations: Sequence[ValidationRow],
    metric: str | None,
    policies: Sequence[str] = (),
) -> dict[str, Any]:
    """The run's steps and validations as columns (one list per figure, a step per index)
    for the charts; the names of its other numeric metrics, and ``metric``'s column (default:
    ``train/loss``, else the first ``train/`` one). ``policies``: the run's; those with figures
    of their own (``<policy>/reward_mean``: a Trainer of several) get their columns too."""
    shown = steps[:MAX_STEPS]
    columns: dict[str, list[Any]] = {  # the store's typed fields: finite numbers or None
        name: [getattr(s, name) for s in shown] for name in _STEP_COLUMNS
    }
    for name in _WHY_DROPPED:
        columns[name] = [_number(s.metrics.get(name)) for s in shown]
    names: set[str] = set()
    for s in shown:
        names.update(k for k in s.metrics.keys() - names if _number(s.metrics[k]) is not None)
    names.discard("step")
    ordered = sorted(names, key=lambda n: (not n.startswith("train/"), n))
    if metric not in names:
        metric = "train/loss" if "train/loss" in names else ordered[0] if ordered else None
    validation = {
        name: [getattr(v, name) for v in validations[:MAX_STEPS]] for name in _VALIDATION_COLUMNS
    }
    shown_validations = validations[:MAX_STEPS]
    own = [
        p
        for p in policies
        if any(f"{p}/reward_mean" in s.metrics for s in shown)
        or any(f"{p}/reward_mean" in v.metrics for v in shown_validations)
    ]
    by_policy = {
        p: {
            "steps": {
                name: [getattr(s.of_policy(p), name) for s in shown] for name in _POLICY_COLUMNS
            },
            "validation": {
                name: [getattr(v.of_policy(p), name) for v in shown_validations]
                for name in ("step", "reward_mean", "reward_std")
            },
        }
        for p in own
    }
    return {
        "steps": columns,
        "policies": list(policies),
        "by_policy": by_policy,
        "metric_names": ordered,
        "metric": None
        if metric is None
        else {"name": metric, "values": [_number(s.metrics.get(metric)) for s in shown]},
        "validation": validation,
        "steps_total": len(steps),
        "cut": len(steps) > len(shown),
    }


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


# -- a run ----------------------------------------------------------------------------------


def run_view(
    trajectory: Trajectory,
    text_of_ids: TextOf | None = None,
    trained: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The run as ART will train on it, with what the journal says about it; the text of
    tokens journaled as ids only from ``text_of_ids`` (the folder's tokenizer), when given.
    ``trained``: in a run of several policies, each declared one and whether it trains (a
    turn of a frozen policy, or of none of them, is context); ``None``: every policy turn
    trains."""
    conversations = trajectory.conversations()
    in_a_turn = {id(item.call) for c in conversations for item in c.items if isinstance(item, Turn)}
    calls = trajectory.calls
    shown = [_conversation(c, k, text_of_ids, trained) for k, c in enumerate(conversations)]
    return {
        "example_id": trajectory.example_id,
        "reward": _number(trajectory.reward),
        "policy_rewards": _plain(trajectory.policy_rewards),
        "metrics": _plain(trajectory.metrics),
        "metadata": _plain(trajectory.metadata),
        "exception": trajectory.exception,
        "started_at": trajectory.started_at,
        "ended_at": trajectory.ended_at,
        "calls": len(calls),
        "trainable_turns": sum(c["trainable_turns"] for c in shown),
        "policies": list(dict.fromkeys(c.policy for c in calls if c.trainable and c.policy)),
        "conversations": shown,
        "calls_without_turn": [_call(c) for c in calls if id(c) not in in_a_turn][:100],
    }


def example(trajectory: Trajectory) -> list[dict[str, str]]:
    """The messages the run's main conversation starts with (its system and user prompt,
    up to the first sampled turn): the example, as the agent put it to the model."""
    conversations = trajectory.conversations()
    out: list[dict[str, str]] = []
    for item in conversations[0].items if conversations else ():
        if isinstance(item, Turn):
            break
        role = str(item.get("role"))
        if role in ("system", "developer", "user"):
            out.append({"role": role, "text": _cut(text_of(item.get("content")), 4_000)[0]})
    return out


def text_of(content: Any) -> str:
    """A message's content as text (its text parts joined; other parts named)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else f"[{part.get('type', 'part') if isinstance(part, dict) else 'part'}]"
            for part in content
        )
    return ""


def item_view(
    trajectory: Trajectory,
    conversation: int,
    item: int,
    offset: int,
    limit: int,
    text_of_ids: TextOf | None = None,
    trained: Mapping[str, bool] | None = None,
) -> dict[str, Any] | None:
    """One message or turn of the run whole (text uncut), its tokens from ``offset``."""
    conversations = trajectory.conversations()
    if not 0 <= conversation < len(conversations):
        return None
    items = conversations[conversation].items
    if not 0 <= item < len(items):
        return None
    found = items[item]
    if isinstance(found, Turn):
        return _turn(found, text_of_ids, offset=offset, limit=limit, max_text=None, trained=trained)
    return {"kind": "message", "message": _message(found, None)}


def _conversation(
    conversation: Conversation,
    k: int,
    text_of_ids: TextOf | None,
    trained: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    items = conversation.items[:MAX_ITEMS]
    return {
        "index": k,
        "art": "messages_and_choices" if k == 0 else f"additional_histories[{k - 1}]",
        "tools": conversation.tools,
        "trainable_turns": sum(
            isinstance(i, Turn) and _trains(i, trained) for i in conversation.items
        ),
        "items": [
            _turn(i, text_of_ids, trained=trained)
            if isinstance(i, Turn)
            else {"kind": "message", "message": _message(i)}
            for i in items
        ],
        "items_total": len(conversation.items),
    }


def _trains(turn: Turn, trained: Mapping[str, bool] | None) -> bool:
    """Whether ART trains on ``turn``: trainable, and (a run of several policies) a turn of a
    policy that trains."""
    return turn.trainable and (trained is None or trained.get(turn.call.policy or "", False))


def why_context(turn: Turn, trained: Mapping[str, bool] | None = None) -> str | None:
    """Why ``turn`` is context and not trained on, or ``None`` when ART trains on it;
    ``trained``: a run of several policies' declared ones, and whether each trains."""
    if not turn.call.trainable:
        return NOT_A_POLICY_TURN
    policy = turn.call.policy
    if trained is not None and not trained.get(policy or "", False):
        if policy is None:
            return (
                f"no policy of the run claims it (its model {turn.call.model!r} is none of "
                "theirs, and its @trainable named no policy)"
            )
        if policy in trained:
            return f"a turn of policy {policy!r}, which is frozen (served, not trained)"
        return f"a turn of policy {policy!r}, which is none of the Trainer's: it trains nothing"
    if turn.context_only:
        return BRANCH_PREFIX
    return turn.call.untrainable_reason(turn.choice)


def _turn(
    turn: Turn,
    text_of_ids: TextOf | None = None,
    *,
    offset: int = 0,
    limit: int = MAX_TOKENS,
    max_text: int | None = MAX_TEXT,
    trained: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    call, choice = turn.call, turn.choice
    why = why_context(turn, trained)
    trains = _trains(turn, trained)
    cause = call.untrainable_reason(choice) if call.trainable else None
    ids = choice.token_ids
    logprobs = choice.logprobs
    total = len(ids) if ids is not None else len(logprobs) if logprobs is not None else 0
    end = min(total, offset + max(0, limit))
    shown = None if ids is None else ids[offset:end].tolist()
    text: list[str | None] | None = None
    text_from = None
    if choice.tokens is not None:  # the server's own text (it sent no ids)
        text, text_from = list[str | None](choice.tokens[offset:end]), "server"
    elif shown is not None and text_of_ids is not None:
        text, text_from = text_of_ids(shown), "tokenizer"
    return {
        "kind": "turn",
        "trainable": trains,
        "art": "Choice" if trains else "message",
        "policy": call.policy,
        "why": why,
        "cause": cause,
        "fix": fix_for(cause) if cause else "",
        "message": _message(choice.message, max_text),
        "finish_reason": choice.finish_reason,
        "source": call.source,
        "framework": call.framework,
        "agent": call.agent,
        "framework_step": call.step,
        "model": call.model,
        "response_model": call.response_model,
        "streamed": call.streamed,
        "partial": call.partial,
        "error": call.error,
        "capture_error": call.capture_error,
        "prompt_tokens": None if call.prompt_token_ids is None else len(call.prompt_token_ids),
        "started_at": call.started_at,
        "ended_at": call.ended_at,
        "tokens": {
            "ids": shown,
            "logprobs": None if logprobs is None else logprobs[offset:end].tolist(),
            "text": text,
            "text_from": text_from,
            "offset": offset,
            "total": total,
        },
    }


def _call(call: LLMCall) -> dict[str, Any]:
    """A call that gave no turn (it failed, or its answer was not read)."""
    return {
        "model": call.model,
        "source": call.source,
        "framework": call.framework,
        "agent": call.agent,
        "trainable": call.trainable,
        "error": call.error,
        "capture_error": call.capture_error,
        "partial": call.partial,
        "started_at": call.started_at,
        "ended_at": call.ended_at,
    }


def _message(message: dict[str, Any], max_text: int | None = MAX_TEXT) -> dict[str, Any]:
    """The message as sent, each text cut at ``max_text`` characters (``cut``: how many were
    left out)."""
    out: dict[str, Any] = {}
    cut = 0
    for key, value in message.items():
        if key == "content":
            value, left = _content(value, max_text)
            cut += left
        elif key == "tool_calls" and isinstance(value, list):
            value, left = _tool_calls(value, max_text)
            cut += left
        elif isinstance(value, str) and max_text is not None and len(value) > max_text:
            cut += len(value) - max_text
            value = value[:max_text]
        out[key] = _plain(value)
    if cut:
        out["_cut"] = cut
    return out


def _content(content: Any, max_text: int | None) -> tuple[Any, int]:
    if isinstance(content, str):
        return _cut(content, max_text)
    if isinstance(content, list):
        parts, cut = [], 0
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text, left = _cut(part["text"], max_text)
                parts.append({**part, "text": text})
                cut += left
            else:
                parts.append(part)
        return parts, cut
    return content, 0


def _tool_calls(calls: Iterable[Any], max_text: int | None) -> tuple[list[Any], int]:
    out, cut = [], 0
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            arguments, left = _cut(function["arguments"], max_text)
            call = {**call, "function": {**function, "arguments": arguments}}
            cut += left
        out.append(call)
    return out, cut


def _cut(text: str, max_text: int | None) -> tuple[str, int]:
    if max_text is None or len(text) <= max_text:
        return text, 0
    return text[:max_text], len(text) - max_text
