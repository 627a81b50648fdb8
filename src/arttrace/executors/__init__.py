"""Where a Trainer's rollouts run: in this process (the default) or on a Ray cluster.

``RayExecutor`` loads Ray, so it is imported on first use.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy
from ._executor import Executor, InProcessExecutor

if TYPE_CHECKING:
    from ._ray import RayExecutor

__all__ = ["Executor", "InProcessExecutor", "RayExecutor"]

__getattr__, __dir__ = lazy(__name__, {"RayExecutor": "._ray"})
