"""The runs an export reads, and which of them it keeps.

Runs come step by step, each step's in slot order (position, then rollout), and each run is
parsed whole only when it is written: the selection needs only a step's light rows (a group's
runs are all in its step), so a run of 100,000 trajectories is never in memory at once.

Reading never writes: a last line without its newline (a run being appended right now, or torn
by a crash) is left alone, unlike the Trainer's own reader, which cuts a torn line off.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from .._errors import ConfigurationError, JournalError
from ..capture._trajectory import Trajectory

Split = Literal["train", "val", "all"]

RAISED = "raised an exception"
NO_REWARD = "had no reward"
BELOW = "below --min-reward"
NOT_BEST = "not the best run of their group"
OTHER_SPLIT = "in another split"
NO_POLICY_TURN = "had no policy turn"
"""Why a run was not exported, as the summary counts them (``sft`` adds the last one)."""


@dataclass(frozen=True, slots=True)
class Run:
    """One run, light: what the selection and the table's plain columns need. ``load()``
    reads the whole run from its line."""

    run_dir: Path
    step: int | None
    position: int | None
    rollout: int | None
    split: str | None
    example_id: str
    reward: float | None
    policy_step: int | None
    exception_type: str | None
    exception_message: str | None
    file: Path
    offset: int
    length: int
    saved: bool = False
    """Read from a saved trajectory's ``.json`` file (the whole file), not a journal line."""

    def load(self) -> Trajectory:
        with open(self.file, "rb") as file:
            file.seek(self.offset)
            data = file.read(self.length) if self.length >= 0 else file.read()
        record = _loads(data, self.file)
        return Trajectory.from_dict(record if self.saved else record["trajectory"])


@dataclass(frozen=True, slots=True)
class Selection:
    """Which runs an export keeps.

    ``split``: ``"train"`` keeps the Trainer's training runs and the runs that record no split
    (a gateway's runs, saved trajectories: training data, as the Trainer resumes them);
    ``"val"`` the validation runs; ``"all"`` every run. ``best_per_group``: of each group (a
    step's runs of one example), the run with the highest reward (the lowest rollout number on
    a tie); with ``min_reward`` too, only if it reaches it. ``skip_raised``: a run that raised
    is never kept (SFT data); only a run that has a reward can be the best or reach a reward.
    """

    split: Split = "all"
    min_reward: float | None = None
    best_per_group: bool = False
    skip_raised: bool = False

    def __post_init__(self) -> None:
        if self.split not in ("train", "val", "all"):
            raise ConfigurationError(f"split must be 'train', 'val' or 'all', got {self.split!r}")
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise ConfigurationError(f"min_reward must be a finite number, got {self.min_reward}")


def selected(
    paths: Iterable[str | os.PathLike[str]], selection: Selection, skipped: Counter[str]
) -> Iterator[Run]:
    """The runs of ``paths`` that ``selection`` keeps, in order; each one left out is counted
    in ``skipped`` under its reason. Every path is checked before the first run is read."""
    sources = [_source(Path(p)) for p in paths]
    for read in sources:
        for step in read():
            yield from _keep(step, selection, skipped)


def check_paths(paths: Iterable[str | os.PathLike[str]]) -> None:
    """A ConfigurationError for the first path that holds no runs."""
    for path in paths:
        _source(Path(path))


def _keep(runs: list[Run], selection: Selection, skipped: Counter[str]) -> Iterator[Run]:
    candidates: list[Run] = []
    for run in runs:
        if selection.split != "all" and (run.split or "train") != selection.split:
            skipped[OTHER_SPLIT] += 1
        elif selection.skip_raised and run.exception_type is not None:
            skipped[RAISED] += 1
        elif (selection.best_per_group or selection.min_reward is not None) and (
            run.reward is None
        ):
            skipped[NO_REWARD] += 1
        else:
            candidates.append(run)
    if selection.best_per_group:
        best: dict[tuple[Any, ...], Run] = {}
        for run in candidates:  # in slot order: the first of equal rewards stays
            key = _group(run)
            kept = best.get(key)
            if kept is None or _reward(run) > _reward(kept):
                best[key] = run
        skipped[NOT_BEST] += len(candidates) - len(best)
        chosen = set(map(id, best.values()))
        candidates = [run for run in candidates if id(run) in chosen]
    for run in candidates:
        if selection.min_reward is not None and _reward(run) < selection.min_reward:
            skipped[BELOW] += 1
        else:
            yield run


def _group(run: Run) -> tuple[Any, ...]:
    """A group: one step's runs of one example (its position in the step's batch; saved
    trajectories, which have none, by example id)."""
    where = run.position if run.position is not None else run.example_id
    return (run.run_dir, run.step, where)


def _reward(run: Run) -> float:
    assert run.reward is not None
    return run.reward


# -- reading -------------------------------------------------------------------------------


def _source(path: Path) -> Callable[[], Iterator[list[Run]]]:
    """A reader of ``path``'s runs, one list per step; a path that holds none is a
    ConfigurationError saying what it expected."""
    if path.is_dir() and (path / "journal").is_dir():
        return lambda: _journal_steps(path)
    if path.is_file() and path.suffix == ".json":
        return lambda: iter([[_saved(path, path)]])
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if any(_looks_saved(f) for f in files):
            return lambda: iter([[r for f in files if (r := _saved_or_none(path, f))]])
    if not path.exists():
        raise ConfigurationError(f"{path} does not exist: give a run folder")
    raise ConfigurationError(
        f"{path} holds no runs: give a Trainer's output_dir or an `arttrace gateway --out` "
        "folder (both have a journal/ folder), a trajectory saved with t.save(...) (.json), or "
        "a folder of them"
    )


def _journal_steps(run_dir: Path) -> Iterator[list[Run]]:
    steps = []
    for step_dir in (run_dir / "journal").glob("step-*"):
        try:
            steps.append((int(step_dir.name.removeprefix("step-")), step_dir))
        except ValueError:
            continue
    for step, step_dir in sorted(steps):
        runs = list(_journal_runs(run_dir, step, step_dir / "rollouts.jsonl"))
        runs.sort(key=lambda r: (r.position or 0, r.rollout or 0))
        yield runs


def _journal_runs(run_dir: Path, step: int, path: Path) -> Iterator[Run]:
    try:
        file = open(path, "rb")  # noqa: SIM115  # closed below; a step may have no file yet
    except FileNotFoundError:
        return
    with file:
        offset = 0
        for number, line in enumerate(file, 1):
            if not line.endswith(b"\n"):
                break  # being written now, or torn by a crash: not a run yet
            if line.strip():
                record = _loads(line, path, number)
                try:
                    position, rollout = record["slot"]
                    data = record["trajectory"]
                    yield _run(run_dir, data, path, offset, len(line), step, position, rollout)
                except (KeyError, TypeError, ValueError) as error:
                    raise JournalError(
                        f"{path}, line {number}: not a rollout ({error!r}). The file was "
                        "edited or damaged on disk: repair or delete that line"
                    ) from None
            offset += len(line)


def _saved(run_dir: Path, path: Path) -> Run:
    data = _loads(path.read_bytes(), path)
    try:
        return _run(run_dir, data, path, 0, -1, None, None, None, saved=True)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigurationError(
            f"{path} is not a saved trajectory ({error!r}): t.save(path) writes one"
        ) from None


def _looks_saved(path: Path) -> bool:
    return _saved_or_none(path.parent, path) is not None


def _saved_or_none(run_dir: Path, path: Path) -> Run | None:
    """A folder's ``.json`` file as a run, ``None`` if it is some other JSON file."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or "example_id" not in data or "calls" not in data:
        return None
    return _saved(run_dir, path)


def _run(
    run_dir: Path,
    data: dict[str, Any],
    path: Path,
    offset: int,
    length: int,
    step: int | None,
    position: Any,
    rollout: Any,
    *,
    saved: bool = False,
) -> Run:
    metadata = data.get("metadata") or {}
    exception = data.get("exception") or None
    reward = data.get("reward")
    return Run(
        run_dir=run_dir,
        step=_int(metadata.get("step")) if step is None else step,
        position=_int(position),
        rollout=_int(metadata.get("rollout") if rollout is None else rollout),
        split=metadata.get("split") if isinstance(metadata.get("split"), str) else None,
        example_id=str(data["example_id"]),
        reward=None if reward is None else float(reward),
        policy_step=_int(metadata.get("policy_step")),
        exception_type=None if exception is None else str(exception.get("type")),
        exception_message=None if exception is None else str(exception.get("message") or ""),
        file=path,
        offset=offset,
        length=length,
        saved=saved,
    )


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _loads(data: bytes, path: Path, number: int | None = None) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    import json  # NaN and infinities (a metric), which only the standard library reads

    try:
        return json.loads(data)
    except ValueError as error:
        where = f"{path}, line {number}" if number is not None else str(path)
        raise JournalError(
            f"{where}: not JSON ({error}). The file was edited or damaged on disk: repair or "
            "delete that line, or restore the file from a copy"
        ) from None
