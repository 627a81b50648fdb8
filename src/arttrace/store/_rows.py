"""The store's typed rows: what a run folder holds, one frozen record per step, validation,
group and trajectory (the full run is read from its file on demand: ``RunStore.trajectory``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast

Kind = Literal["trainer", "gateway", "saved"]


def _number(metrics: dict[str, Any], key: str) -> float | None:
    """``metrics[key]`` as a float; ``None`` when absent, not a number, NaN or infinite (the
    Trainer writes NaN for a figure it has no data for, e.g. a mean over no reward)."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(metrics: dict[str, Any], key: str) -> int:
    value = _number(metrics, key)
    return 0 if value is None else int(value)


def _of_policy(metrics: dict[str, Any], policy: str) -> dict[str, Any]:
    """The line as one policy's: its ``<policy>/...`` figures without the prefix, with the
    line's own step and epoch (the Trainer writes them only when there are several)."""
    prefix = f"{policy}/"
    own = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
    return {**{k: metrics[k] for k in ("step", "epoch") if k in metrics}, **own}


def _from_metrics[R](cls: Callable[..., R], metrics: dict[str, Any], **keys: str) -> R:
    """A row of a metrics line: each field from the key of its name (or of ``keys``), an
    ``int`` field a count, the others a number or ``None``; ``metrics``, the whole line."""
    return cls(
        **{
            f.name: (_count if f.type == "int" else _number)(metrics, keys.get(f.name, f.name))
            for f in fields(cast("type[Any]", cls))
            if f.name != "metrics"
        },
        metrics=metrics,
    )


@dataclass(frozen=True, slots=True)
class StepRow:
    """One line of ``metrics.jsonl``: what a training step did."""

    step: int
    epoch: int
    reward_mean: float | None
    reward_std: float | None
    groups_total: int
    groups_kept: int
    """Groups shipped to the backend."""
    groups_dropped: int
    """Groups without learning signal: flat, spread below ``min_reward_spread``, or no run
    left to ship (all raised, or their group reward failed)."""
    trainable_tokens: int
    """Sampled tokens ART trained on in the shipped groups."""
    loss: float | None
    """``train/loss``, when the backend reports one."""
    rollout_seconds: float | None
    train_seconds: float | None
    policy_lag: float | None
    """``off_policy_steps_mean``: how many steps behind the step its runs' policies were."""
    metrics: dict[str, float]
    """The whole line (ART's and the backend's metrics included)."""

    @property
    def off_policy_steps_mean(self) -> float | None:
        return self.policy_lag

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> StepRow:
        return _from_metrics(cls, metrics, loss="train/loss", policy_lag="off_policy_steps_mean")

    def of_policy(self, policy: str) -> StepRow:
        """The step as one policy of several saw it: its ``<policy>/reward_mean``,
        ``<policy>/groups_kept``, ``<policy>/train/loss`` ... (``None`` and 0 where the line
        has no such figure: a run of one policy)."""
        return StepRow.from_metrics(_of_policy(self.metrics, policy))


@dataclass(frozen=True, slots=True)
class ValidationRow:
    """One line of ``validation.jsonl``. The validation runs themselves are not journaled by
    the Trainer (only these statistics are), so no :class:`TrajectoryRow` has ``split="val"``
    in a Trainer's folder."""

    step: int
    reward_mean: float | None
    reward_std: float | None
    examples: int
    exceptions: int
    metrics: dict[str, float]

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> ValidationRow:
        return _from_metrics(cls, metrics)

    def of_policy(self, policy: str) -> ValidationRow:
        """The validation of one policy of several (its ``<policy>/reward_mean`` ...)."""
        return ValidationRow.from_metrics(_of_policy(self.metrics, policy))


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One example's runs in one step, as the Trainer grouped them, and what became of them.

    ``rewards`` are the runs' rewards in rollout order, as journaled (``None``: no reward).
    ``reward_mean``, ``spread`` and ``advantages`` are over the runs the Trainer groups: those
    that did not raise and have a reward (``advantages`` holds ``None`` for the others); each
    advantage is ART's with its default ``scale_rewards``: ``(reward - mean) / (std + 1e-6)``,
    0 when the rewards do not vary. ``why_not`` (``None`` when ``shipped``) is one of:

    - ``"failed runs: ..."``: fewer than two runs were scored (the others raised or have no
      reward), so the group has no spread to learn from;
    - ``"flat: every run got the same reward"``: no learning signal (GRPO's advantages are 0);
    - ``"flat: reward spread S is below min_reward_spread"``: the step dropped the group
      although its rewards vary (``Trainer(min_reward_spread=...)``);
    - ``"no trainable token: <cause>"``: learning signal, but no policy turn ART can train on;
      the cause is the most common among its runs (``TrajectoryRow.causes``);
    - ``"excluded by the curriculum"``: the curriculum kept easier (or harder) groups this step;
    - ``"the step did not ship (...)"``: nothing above applies, but the step has not been
      trained (yet): its rollouts are running, ``backend.train`` failed or is under way, or
      the folder is a gateway's journal, which no Trainer has trained from.
    """

    step: int
    position: int
    """The example's place in the step's batch."""
    example_id: str
    runs: int
    rewards: tuple[float | None, ...]
    reward_mean: float | None
    spread: float
    advantages: tuple[float | None, ...]
    trainable_tokens: int
    """Sampled tokens ART trains on in the group's scored runs (the Trainer's own count from
    ``shipped.json`` once the step has shipped)."""
    exceptions: int
    shipped: bool
    why_not: str | None
    policy: str | None = None
    """The policy this group trains, in a run of several (a group per example and policy, with
    that policy's rewards); ``None`` in a run of one policy, or one that does not say."""


@dataclass(frozen=True, slots=True)
class TrajectoryRow:
    """One journaled run, as indexed: its figures, and where its line is (``file``, ``offset``,
    ``length``), for :meth:`RunStore.trajectory` to read it whole."""

    id: int
    """Stable: a journal line's id comes from its step and line number, so a rebuilt index
    gives every run the same id (a saved file's id is its place among the folder's files)."""
    step: int | None
    """The journal folder's step (``None`` for a saved trajectory)."""
    position: int | None
    rollout: int | None
    split: str | None
    """``"train"`` for the Trainer's runs; ``None`` when the run's metadata does not say."""
    example_id: str
    reward: float | None
    exception_type: str | None
    exception_message: str | None
    policy_step: int | None
    """The policy the run sampled from (the Trainer's steps completed when it started)."""
    calls: int
    trainable_turns: int
    completion_tokens: int
    trainable_tokens: int
    """Sampled tokens in trainable turns: what ART trains on in this run."""
    causes: tuple[str, ...]
    """Why turns (or the whole run) cannot be trained on: the capture's untrainable reasons
    of its policy turns, or the nothing-to-train cause of a run without any."""
    sources: tuple[str, ...]
    """The layers that recorded its calls (``openai``, ``http``, ``gateway``) and the
    frameworks that made them (``langchain``, ...)."""
    started_at: float | None
    ended_at: float | None
    node_id: str | None
    """Where it ran, on Ray (``RayExecutor``): the node's id, its address and the worker's
    process id, from the run's metadata; ``None`` for a run made in the Trainer's process."""
    node_address: str | None
    worker_pid: int | None
    file: Path
    offset: int
    length: int
    set_aside: bool = False
    """Its line is in ``rollouts-nothing-to-train.jsonl``: a step whose groups held no
    trainable token, whose runs the Trainer set aside to run it again on resume."""
    policies: tuple[str, ...] = ()
    """The policies its policy turns belong to (each call's ``policy``, as the Trainer
    journaled it), in the order first met; ``()`` when no call names one."""
    policy_turns: dict[str, int] = field(default_factory=dict)
    """Each of its policies' trainable turns."""
    policy_tokens: dict[str, int] = field(default_factory=dict)
    """Each of its policies' trainable tokens (what ART trains that policy on in this run)."""
    policy_rewards: dict[str, float] = field(default_factory=dict)
    """Its reward per policy, when it gave one (``Trajectory.policy_rewards``)."""

    def reward_for(self, policy: str | None) -> float | None:
        """The reward of ``policy``'s trajectory of this run: its own, else the run's."""
        if policy is None:
            return self.reward
        return self.policy_rewards.get(policy, self.reward)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run folder in one line (``arttrace runs``): its size, reward, shipping and causes."""

    path: Path
    kind: Kind
    steps: int
    """Steps recorded in ``metrics.jsonl`` (a gateway's journal: step folders with runs)."""
    runs: int
    reward_first: float | None
    """Mean reward of the first step (a saved folder: of all its runs)."""
    reward_last: float | None
    groups_shipped: int | None
    """``None`` where nothing ships (a gateway's journal, saved runs)."""
    groups_dropped: int | None
    trainable_tokens: int
    """Shipped by the Trainer (from ``metrics.jsonl``); elsewhere, in all indexed runs."""
    exceptions: int
    causes: dict[str, int]
    policies: tuple[str, ...] = ()
    """The run's policies (:meth:`RunStore.policies`)."""
