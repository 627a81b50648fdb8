"""Training: run an agent ``group_size`` times per example, group the runs, ship them to ART.

Every name loads on first use. The Trainer starts importing ART in a background thread when it
is built and waits for it only when a step's groups are built, so rollouts start at once;
``CPUBackend`` loads torch and transformers; the journal, which the gateway writes, needs
neither.
"""

from typing import TYPE_CHECKING

from .._errors import TrainingError
from .._lazy import lazy

if TYPE_CHECKING:
    from ._cpu_backend import CPUBackend
    from ._curriculum import Curriculum
    from ._dry_run import DryRunBackend
    from ._group import Group, GroupRewardFn, GroupRewards, GroupRun
    from ._policy import Policy
    from ._trainer import StepResult, Trainer

__all__ = [
    "CPUBackend",
    "Curriculum",
    "DryRunBackend",
    "Group",
    "GroupRewardFn",
    "GroupRewards",
    "GroupRun",
    "Policy",
    "StepResult",
    "Trainer",
    "TrainingError",
]

__getattr__, __dir__ = lazy(
    __name__,
    {"CPUBackend": "._cpu_backend", "Curriculum": "._curriculum", "DryRunBackend": "._dry_run"}
    | {name: "._group" for name in ("Group", "GroupRewardFn", "GroupRewards", "GroupRun")}
    | {"Policy": "._policy", "StepResult": "._trainer", "Trainer": "._trainer"},
)
