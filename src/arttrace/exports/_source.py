"""The runs an export reads, and which of them it keeps.

Runs come from the run store (``arttrace.store.open_run``: a Trainer's output_dir, a gateway's
folder, saved trajectories), step by step in slot order (position, then rollout), each read
whole from its line only when it is written: the selection needs only a step's index rows (a
group's runs are all in its step), so a run of 100,000 trajectories is never in memory at once.
The store never writes into the run's files: a line being appended is left for later.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._errors import ConfigurationError
from ..capture._trajectory import Trajectory

if TYPE_CHECKING:
    from ..store import TrajectoryRow

Split = Literal["train", "val", "all"]

RAISED = "raised an exception"
NO_REWARD = "had no reward"
BELOW = "below --min-reward"
NOT_BEST = "not the best run of their group"
OTHER_SPLIT = "in another split"
NO_POLICY_TURN = "had no policy turn"
NOT_THE_POLICY = "had no turn of the policy"
"""Why a run was not exported, as the summary counts them (``sft`` adds the last two, and
``parquet`` the last one, with ``policy``)."""
PAGE = 2000
"""Index rows read per query."""


@dataclass(frozen=True, slots=True)
class Run:
    """One run, light: the store's row of it (its step, slot, split, reward...), and its
    folder. ``load()`` reads the whole run from its line."""

    run_dir: Path
    row: TrajectoryRow
    load: Callable[[], Trajectory] = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        """What identifies the run in its folder (its line's file and offset)."""
        return f"{self.row.file}@{self.row.offset}"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which runs an export keeps.

    ``split``: ``"train"`` keeps the Trainer's training runs and the runs that record no split
    (a gateway's runs, saved trajectories: training data, as the Trainer resumes them);
    ``"val"`` the validation runs; ``"all"`` every run. ``best_per_group``: of each group (a
    step's runs of one example), the run with the highest reward (the lowest rollout number on
    a tie); with ``min_reward`` too, only if it reaches it. ``skip_raised``: a run that raised
    is never kept (SFT data); only a run that has a reward can be the best or reach a reward.
    ``policy``: the export of one policy of several, whose rewards (its own in the run's
    ``policy_rewards``, else the run's) choose the best and reach ``min_reward``.
    """

    split: Split = "all"
    min_reward: float | None = None
    best_per_group: bool = False
    skip_raised: bool = False
    policy: str | None = None

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "all"):
            raise ConfigurationError(f"split must be 'train', 'val' or 'all', got {self.split!r}")
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise ConfigurationError(f"min_reward must be a finite number, got {self.min_reward}")


def check_paths(paths: Iterable[str | os.PathLike[str]]) -> None:
    """A ConfigurationError for the first path that holds no runs (nothing is indexed)."""
    from ..store import RunStore

    for path in paths:
        RunStore(path).close()


def selected(
    paths: Iterable[str | os.PathLike[str]], selection: Selection, skipped: Counter[str]
) -> Iterator[Run]:
    """The runs of ``paths`` that ``selection`` keeps, in order; each one left out is counted
    in ``skipped`` under its reason. Every path is opened (and indexed) before the first run
    is read, so a bad one fails first."""
    from ..store import open_run

    stores: list[Any] = []
    try:
        for path in paths:
            stores.append(open_run(path))
        for store in stores:
            for step in _steps(store):
                yield from _keep(step, selection, skipped)
    finally:
        for store in stores:
            store.close()


def _steps(store: Any) -> Iterator[list[Run]]:
    """The store's runs, one list per step (a saved folder: one list)."""
    step: list[Run] = []
    offset = 0
    while rows := store.trajectories(order="step", limit=PAGE, offset=offset):
        offset += len(rows)
        for row in rows:
            if step and step[0].row.step != row.step:
                yield step
                step = []
            step.append(_run(store, row))
    if step:
        yield step


def _run(store: Any, row: TrajectoryRow) -> Run:
    def load() -> Trajectory:
        trajectory: Trajectory = store.trajectory(row.id)
        return trajectory

    return Run(store.path, row, load)


def _keep(runs: list[Run], selection: Selection, skipped: Counter[str]) -> Iterator[Run]:
    candidates: list[Run] = []
    for run in runs:
        row = run.row
        if selection.split != "all" and (row.split or "train") != selection.split:
            skipped[OTHER_SPLIT] += 1
        elif selection.skip_raised and row.exception_type is not None:
            skipped[RAISED] += 1
        elif (selection.best_per_group or selection.min_reward is not None) and (
            row.reward_for(selection.policy) is None
        ):
            skipped[NO_REWARD] += 1
        else:
            candidates.append(run)
    if selection.best_per_group:
        best: dict[tuple[Any, ...], Run] = {}
        for run in candidates:  # in slot order: the first of equal rewards stays
            kept = best.get(_group(run))
            if kept is None or _reward(run, selection) > _reward(kept, selection):
                best[_group(run)] = run
        skipped[NOT_BEST] += len(candidates) - len(best)
        chosen = {id(run) for run in best.values()}
        candidates = [run for run in candidates if id(run) in chosen]
    for run in candidates:
        if selection.min_reward is not None and _reward(run, selection) < selection.min_reward:
            skipped[BELOW] += 1
        else:
            yield run


def _group(run: Run) -> tuple[Any, ...]:
    """A group: one step's runs of one example (its position in the step's batch; saved
    trajectories, which have none, by example id). Runs the Trainer set aside are a group
    apart from the step's runs made again."""
    row = run.row
    where = row.position if row.position is not None else row.example_id
    return (run.run_dir, row.step, row.set_aside, where)


def _reward(run: Run, selection: Selection) -> float:
    reward = run.row.reward_for(selection.policy)
    assert reward is not None
    return reward
