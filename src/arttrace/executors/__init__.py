"""Where a Trainer's rollouts run: in this process (the default) or on a Ray cluster.

``RayExecutor`` loads Ray, so it is imported on first use.
"""

from typing import TYPE_CHECKING, Any

from ._executor import Executor, InProcessExecutor

if TYPE_CHECKING:
    from ._ray import RayExecutor

__all__ = ["Executor", "InProcessExecutor", "RayExecutor"]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from ._ray import RayExecutor

        return RayExecutor
    raise AttributeError(f"module 'arttrace.executors' has no attribute {name!r}")
