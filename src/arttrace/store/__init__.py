"""The run store: a run folder's steps, validations, groups and runs as typed rows.

``open_run(path)`` reads a Trainer's ``output_dir``, an ``arttrace gateway --out`` folder, a
saved trajectory (``Trajectory.save``) or a folder of them, through an SQLite index
(``.arttrace-index.sqlite`` in the folder, WAL) that grows with the journal: each refresh
reads only the lines appended since, so the viewer follows a run in progress. Text search
is SQLite's FTS5 (``LIKE`` where the build lacks it). Nothing here loads ART, and every name
loads on first use (``arttrace runs`` registers its parser without loading the store).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._index import SCHEMA_VERSION, fts5_available
    from ._rows import GroupRow, Kind, RunSummary, StepRow, TrajectoryRow, ValidationRow
    from ._store import ORDERS, RunStore, open_run

_HOMES = {
    "SCHEMA_VERSION": "._index",
    "fts5_available": "._index",
    "GroupRow": "._rows",
    "Kind": "._rows",
    "RunSummary": "._rows",
    "StepRow": "._rows",
    "TrajectoryRow": "._rows",
    "ValidationRow": "._rows",
    "ORDERS": "._store",
    "RunStore": "._store",
    "open_run": "._store",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'arttrace.store' has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
