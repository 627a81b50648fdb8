"""``arttrace view``: a local, read-only web app over run folders (a Trainer's output_dir, a
gateway's ``--out``, saved trajectories), read through the run store (``arttrace.store``).

The pages are static files shipped in this package (``static/``: JavaScript modules, CSS and
the charting library uPlot, no build step and no network); they ask the JSON API in
:mod:`arttrace.viewer._app`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import Viewer

__all__ = ["Viewer"]


def __getattr__(name: str) -> Any:
    """``Viewer`` loads starlette and uvicorn (the view extra) on first use."""
    if name == "Viewer":
        from ._app import Viewer

        return Viewer
    raise AttributeError(f"module 'arttrace.viewer' has no attribute {name!r}")
