"""Training: run an agent ``group_size`` times per example, group the runs, ship them to ART.

Every name loads on first use. The Trainer starts importing ART in a background thread when it
is built and waits for it only when a step's groups are built, so rollouts start at once;
``CPUBackend`` loads torch and transformers; the journal, which the gateway writes, needs
neither.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .._errors import TrainingError

if TYPE_CHECKING:
    from ._cpu_backend import CPUBackend
    from ._curriculum import Curriculum
    from ._dry_run import DryRunBackend
    from ._trainer import StepResult, Trainer

_HOMES = {
    "CPUBackend": "._cpu_backend",
    "Curriculum": "._curriculum",
    "DryRunBackend": "._dry_run",
    "StepResult": "._trainer",
    "Trainer": "._trainer",
}

__all__ = ["CPUBackend", "Curriculum", "DryRunBackend", "StepResult", "Trainer", "TrainingError"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'arttrace.training' has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
