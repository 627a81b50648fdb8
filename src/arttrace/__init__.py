"""arttrace: capture what an existing LLM agent does, and train its model with OpenPipe ART.

import arttrace as at

at.instrument()                          # patch the OpenAI SDK (or at.wrap_openai(client))

@at.trainable                            # the LLM calls made inside are the policy's turns
async def solve(question: str) -> str: ...

with at.trajectory("q-17") as t:         # one run of one example
    t.reward = score(await solve("..."))
t.to_art()                               # an art.Trajectory, trainable turns as Choices
"""

from typing import TYPE_CHECKING, Any

from ._errors import (
    ArttraceError,
    ConfigurationError,
    JournalError,
    ResumeError,
    RolloutTimeoutError,
    RunLockedError,
    TrainingError,
    UsageError,
)
from ._instrument import instrument, is_instrumented, uninstrument, wrap_openai
from .capture._calls import Settings
from .capture._records import ChoiceRecord, LLMCall
from .capture._threads import carry
from .capture._trainable import trainable
from .capture._trajectory import Trajectory, current_trajectory, trajectory
from .capture._warnings import (
    NothingToTrainWarning,
    RunOutlivedWarning,
    TokenContinuityWarning,
    UntrainableTurnWarning,
)
from .executors import Executor, InProcessExecutor

if TYPE_CHECKING:
    from .executors import RayExecutor
    from .gateway import Gateway
    from .store import open_run
    from .training import CPUBackend, Curriculum, DryRunBackend, StepResult, Trainer
    from .training._group import Group, GroupRewards, GroupRun

_TRAINING = frozenset({"CPUBackend", "Curriculum", "DryRunBackend", "StepResult", "Trainer"})


def __getattr__(name: str) -> Any:
    """The training names load ART, and ``Gateway`` starlette and uvicorn, so they are
    imported on first use."""
    if name in _TRAINING:
        from . import training

        return _public(getattr(training, name))
    if name in ("Group", "GroupRewards", "GroupRun"):
        from .training import _group

        return _public(getattr(_group, name))
    if name == "RayExecutor":
        from .executors import RayExecutor

        return _public(RayExecutor)
    if name == "open_run":
        from .store import open_run

        return _public(open_run)
    if name == "Gateway":
        from .gateway import Gateway

        return _public(Gateway)
    raise AttributeError(f"module 'arttrace' has no attribute {name!r}")


def _public(obj: Any) -> Any:
    """Show ``obj`` where users find it (``arttrace.Trainer``, not the private module), in
    reprs and tracebacks, as httpx and openai do."""
    if getattr(obj, "__module__", "").startswith("arttrace."):
        obj.__module__ = "arttrace"
    return obj


__version__ = "0.1.0"

__all__ = [
    "ArttraceError",
    "CPUBackend",
    "ChoiceRecord",
    "ConfigurationError",
    "Curriculum",
    "DryRunBackend",
    "Executor",
    "Gateway",
    "Group",
    "GroupRewards",
    "GroupRun",
    "InProcessExecutor",
    "JournalError",
    "LLMCall",
    "NothingToTrainWarning",
    "RayExecutor",
    "ResumeError",
    "RolloutTimeoutError",
    "RunLockedError",
    "RunOutlivedWarning",
    "Settings",
    "StepResult",
    "TokenContinuityWarning",
    "Trainer",
    "TrainingError",
    "Trajectory",
    "UntrainableTurnWarning",
    "UsageError",
    "carry",
    "current_trajectory",
    "instrument",
    "is_instrumented",
    "open_run",
    "trainable",
    "trajectory",
    "uninstrument",
    "wrap_openai",
]

for _name in __all__:
    if _name in globals():
        _public(globals()[_name])
