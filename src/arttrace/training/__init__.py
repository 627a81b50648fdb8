"""Training: run an agent ``group_size`` times per example, group the runs, ship them to ART.

Imported on first use of one of its names (``arttrace.Trainer`` and friends): it loads ART.
"""

from .._errors import TrainingError
from ._curriculum import Curriculum
from ._dry_run import DryRunBackend
from ._trainer import StepResult, Trainer

__all__ = ["Curriculum", "DryRunBackend", "StepResult", "Trainer", "TrainingError"]
