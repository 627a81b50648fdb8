"""Reading a run folder: which files it has, their new whole lines, and one run's figures.

Never loads a whole journal: lines are read one at a time from a byte offset, and a line
without its newline (a writer mid-``write``, or a crash's torn line) is left for later.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError, JournalError
from .._journal import damaged, read_json
from ..capture._layers import LOWER_LAYERS
from ..capture._records import LLMCall, model_claimed
from ..capture._trajectory import Trajectory
from ._rows import Kind

STEP_DIR = re.compile(r"step-(\d+)")
ROLLOUTS = "rollouts.jsonl"
SET_ASIDE = "rollouts-nothing-to-train.jsonl"
"""Where the Trainer moves a step's runs when none of its groups holds a trainable token."""
GROUP_REWARDS = "group_rewards.jsonl"
"""A step's group rewards (``Trainer(group_reward=...)``): the rewards its runs trained on."""
SKIPPED_ROLES = frozenset({"system", "developer"})
"""Messages left out of the text index: the same prompt in every run, rarely what is sought."""


@dataclass(frozen=True, slots=True)
class Source:
    """One file the index follows."""

    path: str
    """Relative to the run folder (a saved file given alone: its name)."""
    kind: str
    """``rollouts``, ``group_rewards``, ``metrics``, ``validation`` or ``saved``."""
    step: int | None = None
    set_aside: bool = False


def detect(path: Path) -> Kind:
    """What ``path`` holds, or a :class:`ConfigurationError` saying what a run folder is."""
    if path.is_file():
        if path.suffix == ".json":
            return "saved"
        raise ConfigurationError(
            f"{path} is a file but not a saved trajectory (Trajectory.save writes .json): give "
            "a Trainer's output_dir, an `arttrace gateway --out` folder, a saved trajectory "
            ".json or a folder of them"
        )
    if not path.is_dir():
        raise ConfigurationError(
            f"{path} does not exist: give a Trainer's output_dir, an `arttrace gateway --out` "
            "folder, a saved trajectory .json or a folder of them"
        )
    if (path / "state.json").is_file():
        return "trainer"  # a Trainer writes it before its first rollout
    workers = sorted(p for p in path.glob("worker-*") if p.is_dir())
    if workers and not (path / "journal").is_dir():
        raise ConfigurationError(
            f"{path} is the folder of an `arttrace gateway --workers` gateway, whose workers "
            "each journal in a folder of their own: give those, "
            + " ".join(str(w) for w in workers)
        )
    if (path / "journal").is_dir() or (path / ".lock").is_file():
        return "gateway"  # its journal (or its lock, before the first run is closed)
    if any(name.endswith(".json") and not name.startswith(".") for name in _names(path)):
        return "saved"
    raise ConfigurationError(
        f"{path} is not a run folder: it has no journal/ folder, state.json or saved "
        "trajectory .json file. Give a Trainer's output_dir, an `arttrace gateway --out` "
        "folder, a saved trajectory .json (Trajectory.save) or a folder of them"
    )


def _names(path: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(path) if entry.is_file())
    except OSError:
        return []


def sources(root: Path, kind: Kind, single_file: str | None) -> list[Source]:
    """The files to index, in indexing order (a run's metrics first, then step by step);
    ``single_file``: the name of a saved trajectory given alone."""
    if single_file is not None:
        return [Source(single_file, "saved")]
    if kind == "saved":
        return [
            Source(name, "saved")
            for name in _names(root)
            if name.endswith(".json") and not name.startswith(".")
        ]
    found = [Source("metrics.jsonl", "metrics"), Source("validation.jsonl", "validation")]
    try:
        steps = sorted(
            (int(m.group(1)), entry.name)
            for entry in os.scandir(root / "journal")
            if (m := STEP_DIR.fullmatch(entry.name)) and entry.is_dir()
        )
    except FileNotFoundError:
        steps = []
    for step, name in steps:
        for file, set_aside in ((ROLLOUTS, False), (SET_ASIDE, True)):
            found.append(Source(f"journal/{name}/{file}", "rollouts", step, set_aside))
        found.append(Source(f"journal/{name}/{GROUP_REWARDS}", "group_rewards", step))
    return found


def whole_lines(
    path: Path, offset: int, first_line: int, max_lines: int, max_bytes: int
) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, offset, line)`` of each whole line from ``offset`` (at most
    ``max_lines`` / about ``max_bytes``); stops before a line without its newline."""
    with open(path, "rb") as file:
        file.seek(offset)
        number, read = first_line, 0
        while number - first_line < max_lines and read < max_bytes:
            line = file.readline()
            if not line.endswith(b"\n"):
                return  # the end, or a line still being written (or torn by a crash)
            number += 1
            yield number, offset, line
            offset += len(line)
            read += len(line)


def rollout(path: Path, number: int, record: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """``(position, rollout, trajectory dict)`` of a journal line."""
    try:
        position, k = record["slot"]
        trajectory = record["trajectory"]
        if not isinstance(trajectory, dict):
            raise TypeError("its trajectory is not an object")
        return int(position), int(k), trajectory
    except (KeyError, TypeError, ValueError) as error:
        raise damaged(path, number, f"not a rollout ({error!r})") from None


def saved(path: Path, data: bytes) -> dict[str, Any]:
    """The trajectory dict of a saved file; a :class:`JournalError` when it is none."""
    try:
        record = json.loads(data)
    except ValueError as error:
        raise JournalError(
            f"{path} is not JSON ({error}): it is being written, or it is not a saved "
            "trajectory (Trajectory.save)"
        ) from None
    if not isinstance(record, dict) or "example_id" not in record or "calls" not in record:
        raise JournalError(
            f"{path} is JSON but not a saved trajectory (Trajectory.save writes an object "
            "with example_id and calls)"
        )
    return record


@dataclass(slots=True)
class Figures:
    """One run's indexed figures, and its text for search."""

    split: str | None
    example_id: str
    reward: float | None
    exception_type: str | None
    exception_message: str | None
    policy_step: int | None
    calls: int
    trainable_turns: int
    completion_tokens: int
    trainable_tokens: int
    causes: tuple[str, ...]
    sources: tuple[str, ...]
    started_at: float | None
    ended_at: float | None
    node_id: str | None
    node_address: str | None
    worker_pid: int | None
    text: str
    policies: tuple[str, ...] = ()
    """The policies its policy turns belong to (``LLMCall.policy``), in the order first met."""
    per_policy: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each policy's trainable turns and trainable tokens in the run."""
    policy_rewards: dict[str, float] = field(default_factory=dict)
    """The run's reward per policy, when it gave one (``Trajectory.policy_rewards``)."""


type Claims = Sequence[tuple[str, Sequence[str]]]
"""The declared policies of a run of several: each name and the names its turns go by."""


def declared(root: Path) -> list[dict[str, Any]]:
    """``state.json``'s ``settings.policies`` in ``root`` (a Trainer's folder of several
    policies; ``[]`` elsewhere, or while the file is being replaced)."""
    try:
        state = read_json(root / "state.json")
    except JournalError:
        return []
    settings = state.get("settings") if isinstance(state, dict) else None
    policies = settings.get("policies") if isinstance(settings, dict) else None
    return [p for p in policies if isinstance(p, dict)] if isinstance(policies, list) else []


def claims(policies: list[dict[str, Any]]) -> Claims:
    """What each declared policy claims: its name and its model's (``training._policy``)."""
    return [
        (p["name"], sorted({p["name"], p.get("model")} - {None}))
        for p in policies
        if isinstance(p.get("name"), str)
    ]


def resolve(data: dict[str, Any], claimed: Claims) -> dict[str, Any]:
    """``data`` (a journaled run) with each policy turn's policy as the Trainer assigns it:
    a turn journaled without one (by a gateway, before a Trainer resumed its journal) gets
    the first declared policy that claims its model."""
    if not claimed:
        return data
    for call in data.get("calls") or ():
        model = call.get("model")
        if call.get("trainable") and call.get("policy") is None and isinstance(model, str):
            call["policy"] = next((n for n, names in claimed if model_claimed(names, model)), None)
    return data


def figures(data: dict[str, Any], claimed: Claims = ()) -> Figures:
    """What the index keeps of one run, computed as the Trainer computes it: the trajectory is
    read back as :meth:`Trajectory.from_dict` reads a journal line, its calls merged as
    ``Trajectory.calls`` merges them. Each call's choices are turns of exactly one
    conversation (``_conversations.assemble`` copies a turn into a branch as context only), so
    the trainable turns are its trainable calls' choices ART accepts, and the trainable tokens
    their sampled ids (what ``arttrace.capture._art.trainable_tokens`` counts)."""
    t = Trajectory.from_dict(resolve(data, claimed))
    calls = t.calls
    turns = tokens = completion = 0
    causes: Counter[str] = Counter()
    per_policy: dict[str, tuple[int, int]] = {}
    for call in calls:
        completion += call.completion_tokens
        if call.trainable and call.policy is not None:
            per_policy.setdefault(call.policy, (0, 0))
        for choice in call.choices:
            if not call.trainable:
                continue
            reason = call.untrainable_reason(choice)
            if reason is None:
                sampled = len(choice.token_ids or ())
                turns += 1
                tokens += sampled
                if call.policy is not None:
                    own_turns, own_tokens = per_policy[call.policy]
                    per_policy[call.policy] = (own_turns + 1, own_tokens + sampled)
            else:
                causes[reason] += 1
    if not calls:
        causes["no LLM call was seen"] += 1
    elif not any(c.trainable for c in calls):
        gateway = all(c.source == "gateway" for c in calls)
        causes[
            "its gateway calls recorded no policy turn"
            if gateway
            else "its LLM calls ran outside every @trainable function"
        ] += 1
    metadata = t.metadata
    split = metadata.get("split")
    policy = metadata.get("policy_step")
    exception = t.exception if isinstance(t.exception, dict) else None
    layers = {c.source for c in calls} | {c.framework for c in calls if c.framework}
    return Figures(
        split=split if isinstance(split, str) else None,
        example_id=t.example_id,
        reward=t.reward,
        exception_type=None if exception is None else str(exception.get("type") or "Exception"),
        exception_message=None if exception is None else str(exception.get("message") or ""),
        policy_step=_int(policy),
        calls=len(calls),
        trainable_turns=turns,
        completion_tokens=completion,
        trainable_tokens=tokens,
        causes=tuple(sorted(causes)),
        sources=tuple(sorted(layers, key=lambda s: (s not in LOWER_LAYERS, s))),
        started_at=_time(t.started_at),
        ended_at=_time(t.ended_at),
        node_id=_str(metadata.get("node_id")),
        node_address=_str(metadata.get("node_address")),
        worker_pid=_int(metadata.get("worker_pid")),
        text=_text(call_messages(calls)),
        policies=tuple(per_policy),
        per_policy=per_policy,
        policy_rewards=t.policy_rewards,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def call_messages(calls: list[LLMCall]) -> Iterator[dict[str, Any]]:
    for call in calls:
        yield from call.messages
        for choice in call.choices:
            yield choice.message


def _text(messages: Iterator[Any]) -> str:
    """The messages' text, each piece once (every call repeats the conversation so far):
    contents, tool call names and arguments, reasoning; system prompts left out."""
    seen: set[str] = set()
    pieces: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and value and value not in seen:
            seen.add(value)
            pieces.append(value)

    for message in messages:
        if not isinstance(message, dict) or message.get("role") in SKIPPED_ROLES:
            continue
        _content(message.get("content"), add)
        for key in ("reasoning", "reasoning_content", "refusal"):
            add(message.get(key))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                add(function.get("name"))
                arguments = function.get("arguments")
                add(arguments if isinstance(arguments, str) else _json(arguments))
    return "\n".join(pieces)


def _content(content: Any, add: Callable[[Any], None]) -> None:
    if isinstance(content, str):
        add(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                add(part.get("text"))
                add(part.get("refusal"))


def _json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None
