"""The run store: a run folder's steps, validations, groups and runs as typed rows.

``open_run(path)`` reads a Trainer's ``output_dir``, an ``arttrace gateway --out`` folder, a
saved trajectory (``Trajectory.save``) or a folder of them, through an SQLite index
(``.arttrace-index.sqlite`` in the folder, WAL) that grows with the journal: each refresh
reads only the lines appended since, so the viewer follows a run in progress. Text search
is SQLite's FTS5 (``LIKE`` where the build lacks it). Nothing here loads ART, and every name
loads on first use (``arttrace runs`` registers its parser without loading the store).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy

if TYPE_CHECKING:
    from ._rows import GroupRow, Kind, RunSummary, StepRow, TrajectoryRow, ValidationRow
    from ._store import Filters, RunStore, open_run

__all__ = [
    "Filters",
    "GroupRow",
    "Kind",
    "RunStore",
    "RunSummary",
    "StepRow",
    "TrajectoryRow",
    "ValidationRow",
    "open_run",
]

__getattr__, __dir__ = lazy(
    __name__,
    {name: "._rows" for name in __all__ if name not in ("Filters", "RunStore", "open_run")}
    | {"Filters": "._store", "RunStore": "._store", "open_run": "._store"},
)
