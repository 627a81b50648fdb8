"""Continuing a run: only with the settings it started with, one Trainer at a time, and with
what a crash left half done put right.

A run's grouping depends on its seed, dataset, ``group_size``, ``groups_per_step`` and
curriculum: the journal records a rollout by its place in the step's batch, so resuming with
any of them changed would file runs under the wrong examples. They are saved in ``state.json``
when the run starts (:func:`run_settings`), and ``resume=True`` with different ones is a
:class:`ResumeError` naming each difference. Each journaled rollout's example is checked
against its place too, which also covers run folders saved without settings.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ResumeError, RunLockedError
from .._journal import Journal, Slot, append_line, differences, read_lines
from ..capture._trajectory import Trajectory

if TYPE_CHECKING:
    from ._trainer import Trainer


def run_settings(trainer: Trainer[Any]) -> dict[str, Any]:
    """What decides which runs a step groups under which example (saved with the run)."""
    schedule, config = trainer._schedule, trainer.config
    ids = "\n".join(
        schedule.example_id(example, i, "train") for i, example in enumerate(schedule.dataset)
    )
    curriculum = schedule.curriculum.state() if schedule.curriculum else {}
    progress = ("percentile", "last_expansion_epoch")  # where it is, not how it was set
    return {
        "seed": config.seed,
        "group_size": config.group_size,
        "groups_per_step": config.groups_per_step,
        "dataset": {
            "examples": len(schedule.dataset),
            "ids_sha256": hashlib.sha256(ids.encode()).hexdigest()[:16],
        },
        "curriculum": {k: v for k, v in curriculum.items() if k not in progress} or None,
        **(
            {"policies": [p.describe() for p in trainer._policies]}
            if trainer._policies is not None
            else {}
        ),
    }


def open_run(journal: Journal, settings: dict[str, Any], resume: bool) -> dict[str, Any]:
    """The saved state of the run in ``journal``'s folder (``{}`` for a new run), after
    checking that this Trainer may work there: no other holds it, a run there is continued
    only with ``resume=True`` and the same settings."""
    with journal.lock:  # another process working here is an error now, not at the first step
        state = journal.load_state()
        if state and not resume:
            raise ConfigurationError(
                f"{journal.output_dir} already holds a run ({state.get('completed_steps', 0)} "
                "steps): pass resume=True to continue it, or choose another output_dir"
            )
        saved = state.get("settings")
        if saved is not None and (changed := differences(saved, settings)):
            raise ResumeError(
                f"resume=True, but the run in {journal.output_dir} started with other settings, "
                "and resuming would group its runs under the wrong examples: "
                + "; ".join(changed)
                + ". Resume with the run's settings, or start a new run in another output_dir"
            )
        _recover_metrics(journal, state.get("completed_steps", 0))
    journal.settings = settings
    return state


@contextlib.contextmanager
def working(trainer: Trainer[Any]) -> Iterator[None]:
    """Hold the run folder's lock while a step, validation or ``train()`` runs; the run's
    state is saved (with its settings) when it starts, and re-read each time the lock is
    taken: another Trainer may have advanced the run in between."""
    journal = trainer._journal
    with journal.lock:
        state = journal.load_state()
        done = state.get("completed_steps", 0)
        if done != trainer.completed_steps:
            raise RunLockedError(
                f"another Trainer advanced the run in {journal.output_dir} to {done} steps "
                f"since this one read it ({trainer.completed_steps}): build a new "
                "Trainer(..., resume=True) to continue from there"
            )
        if not state:
            journal.save_state({"completed_steps": 0})
        yield


def check_journaled(
    journal: Journal, step: int, finished: Mapping[Slot, Trajectory], slots: Mapping[Slot, str]
) -> None:
    """Each journaled rollout of ``step`` ran the example its place in the batch holds now
    (``slots``: place -> example id)."""
    for slot, run in finished.items():
        expected = slots.get(slot)
        if run.example_id != expected:
            raise ResumeError(
                f"{journal.rollouts_path(step)} holds a run of {run.example_id!r} at place "
                f"{list(slot)} of step {step}, where this Trainer's batch has "
                f"{'nothing' if expected is None else repr(expected)}: the seed, dataset, "
                "group_size or groups_per_step changed since the run started. Resume with its "
                "settings, or start a new run in another output_dir"
            )


def _recover_metrics(journal: Journal, completed_steps: int) -> None:
    """Put back the metrics line of the last completed step if the run stopped between
    recording the step and writing its line (``shipped.json`` keeps the metrics)."""
    if not completed_steps:
        return
    last = completed_steps - 1
    path = journal.output_dir / "metrics.jsonl"
    if any(record.get("step") == last for _, record in read_lines(path)):
        return
    summary = journal.shipped_summary(last) or {}
    if isinstance(summary.get("metrics"), dict):
        append_line(path, summary["metrics"])
