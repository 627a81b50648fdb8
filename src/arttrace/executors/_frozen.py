"""A finished trajectory in the compact binary form a Ray worker sends back to the Trainer.

``Trajectory.to_dict()`` is the journal's JSON form: every token id and logprob a number in a
list, ~7 and ~10-20 characters each once written. A rollout's tokens dominate its size, so the
frozen form keeps them as packed arrays (token ids in 4 bytes, logprobs in float32 when that
is exact, else as captured: ``capture._records.compact_ids`` / ``compact_logprobs``, as the
record itself keeps them), all in one pickle (protocol 5) of the trajectory's dict.
:func:`thaw` gives back a ``Trajectory`` whose ``to_dict()`` equals the worker's.
"""

from __future__ import annotations

import dataclasses
import pickle
from array import array
from typing import Any

from ..capture._records import ChoiceRecord, LLMCall, compact_ids, compact_logprobs
from ..capture._trajectory import Trajectory

FORMAT = 1
"""Bumped when the frozen form changes: a driver and workers that disagree cannot talk."""

_CALL_FIELDS = tuple(f.name for f in dataclasses.fields(LLMCall) if f.name != "seq")
_CHOICE_FIELDS = tuple(f.name for f in dataclasses.fields(ChoiceRecord))


def freeze(t: Trajectory) -> bytes:
    """``t`` as bytes: the fields of ``to_dict()``, token ids and logprobs packed."""
    data = {
        "example_id": t.example_id,
        "reward": t.reward,
        **({"policy_rewards": t.policy_rewards} if t.policy_rewards else {}),
        "metrics": t.metrics,
        "metadata": t.metadata,
        "exception": t.exception,
        "started_at": t.started_at,
        "ended_at": t.ended_at,
        "calls": [_call(c) for c in t.calls],
    }
    return pickle.dumps((FORMAT, data), protocol=5)


def thaw(blob: bytes) -> Trajectory:
    """The trajectory :func:`freeze` froze."""
    version, data = pickle.loads(blob)
    if version != FORMAT:
        raise ValueError(
            f"a Ray worker sent a trajectory in frozen format {version}, this process reads "
            f"{FORMAT}: install the same arttrace version on the driver and every node"
        )
    return Trajectory.from_dict(data)


def _call(call: LLMCall) -> dict[str, Any]:
    out = {name: getattr(call, name) for name in _CALL_FIELDS}
    out["prompt_token_ids"] = _ids(call.prompt_token_ids)
    out["choices"] = [_choice(choice) for choice in call.choices]
    return out


def _choice(choice: ChoiceRecord) -> dict[str, Any]:
    out = {name: getattr(choice, name) for name in _CHOICE_FIELDS}
    out["token_ids"] = _ids(choice.token_ids)
    if choice.logprobs is not None:
        out["logprobs"] = compact_logprobs(choice.logprobs)
    return out


def _ids(ids: array[int] | None) -> array[int] | None:
    """Token ids in 4 bytes each when they fit (a record made elsewhere may hold 8)."""
    return None if ids is None else compact_ids(ids)
