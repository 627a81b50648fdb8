"""Training: run an agent ``group_size`` times per example, group the runs, ship them to ART.

Imported on first use of one of its names (``arttrace.Trainer`` and friends): it loads ART.
"""

from typing import TYPE_CHECKING, Any

from .._errors import TrainingError
from ._curriculum import Curriculum
from ._dry_run import DryRunBackend
from ._trainer import StepResult, Trainer

if TYPE_CHECKING:
    from ._cpu_backend import CPUBackend

__all__ = ["CPUBackend", "Curriculum", "DryRunBackend", "StepResult", "Trainer", "TrainingError"]


def __getattr__(name: str) -> Any:
    """``CPUBackend`` loads torch and transformers, so it is imported on first use."""
    if name == "CPUBackend":
        from ._cpu_backend import CPUBackend

        return CPUBackend
    raise AttributeError(f"module 'arttrace.training' has no attribute {name!r}")
