"""The run store: a run folder's steps, validations, groups and runs as typed rows.

``open_run(path)`` reads a Trainer's ``output_dir``, an ``arttrace gateway --out`` folder, a
saved trajectory (``Trajectory.save``) or a folder of them, through an SQLite index
(``.arttrace-index.sqlite`` in the folder, WAL) that grows with the journal: each refresh
reads only the lines appended since, so the viewer follows a run in progress. Text search
is SQLite's FTS5 (``LIKE`` where the build lacks it). Nothing here loads ART.
"""

from ._index import SCHEMA_VERSION, fts5_available
from ._rows import GroupRow, Kind, RunSummary, StepRow, TrajectoryRow, ValidationRow
from ._store import ORDERS, RunStore, open_run

__all__ = [
    "ORDERS",
    "SCHEMA_VERSION",
    "GroupRow",
    "Kind",
    "RunStore",
    "RunSummary",
    "StepRow",
    "TrajectoryRow",
    "ValidationRow",
    "fts5_available",
    "open_run",
]
