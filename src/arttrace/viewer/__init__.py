"""``arttrace view``: a local, read-only web app over run folders (a Trainer's output_dir, a
gateway's ``--out``, saved trajectories), read through the run store (``arttrace.store``).

The pages are static files shipped in this package (``static/``: JavaScript modules, CSS and
the charting library uPlot, no build step and no network); they ask the JSON API in
:mod:`arttrace.viewer._app`. ``Viewer`` loads starlette and uvicorn (the view extra) on first
use.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy

if TYPE_CHECKING:
    from ._app import Viewer

__all__ = ["Viewer"]

__getattr__, __dir__ = lazy(__name__, {"Viewer": "._app"})
