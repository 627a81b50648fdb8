"""The viewer's one door to the run store (``arttrace.store``)."""

from __future__ import annotations

from pathlib import Path

from ..store import GroupRow, RunStore, StepRow, TrajectoryRow, ValidationRow, open_run

__all__ = ["GroupRow", "RunStore", "StepRow", "TrajectoryRow", "ValidationRow", "open_store"]


def open_store(path: Path) -> RunStore:
    """The folder's store, indexed up to what its files hold now (the first time: all of it)."""
    return open_run(path)
