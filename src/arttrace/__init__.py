"""arttrace: capture what an existing LLM agent does, and train its model with OpenPipe ART.

import arttrace as at

at.instrument()                          # patch the OpenAI SDK (or at.wrap_openai(client))

@at.trainable                            # the LLM calls made inside are the policy's turns
async def solve(question: str) -> str: ...

with at.trajectory("q-17") as t:         # one run of one example
    t.reward = score(await solve("..."))
t.to_art()                               # an art.Trajectory, trainable turns as Choices
"""

from typing import TYPE_CHECKING, Any, TypeAliasType

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
from ._lazy import lazy
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
    from .capture._continuity import RunContinuity, run_continuity
    from .executors import RayExecutor
    from .gateway import Gateway
    from .store import open_run
    from .training import (
        CPUBackend,
        Curriculum,
        DryRunBackend,
        Group,
        GroupRewardFn,
        GroupRewards,
        GroupRun,
        Policy,
        StepResult,
        Trainer,
    )


def _public(obj: Any) -> Any:
    """Show ``obj`` where users find it (``arttrace.Trainer``, not the private module), in
    reprs and tracebacks, as httpx and openai do (a type alias keeps its own)."""
    module = getattr(obj, "__module__", "")
    if module.startswith("arttrace.") and not isinstance(obj, TypeAliasType):
        obj.__module__ = "arttrace"
    return obj


# The training names load ART, ``Gateway`` starlette and uvicorn, ``RayExecutor`` Ray: each
# name is imported on first use.
_training = ("CPUBackend", "Curriculum", "DryRunBackend", "Policy", "StepResult", "Trainer")
_groups = ("Group", "GroupRewardFn", "GroupRewards", "GroupRun")
__getattr__, __dir__ = lazy(
    __name__,
    {name: ".training" for name in _training + _groups}
    | {"RunContinuity": ".capture._continuity", "run_continuity": ".capture._continuity"}
    | {"RayExecutor": ".executors", "open_run": ".store", "Gateway": ".gateway"},
    shown=_public,
)

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
    "GroupRewardFn",
    "GroupRewards",
    "GroupRun",
    "InProcessExecutor",
    "JournalError",
    "LLMCall",
    "NothingToTrainWarning",
    "Policy",
    "RayExecutor",
    "ResumeError",
    "RolloutTimeoutError",
    "RunContinuity",
    "RunLockedError",
    "RunOutlivedWarning",
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
    "run_continuity",
    "trainable",
    "trajectory",
    "uninstrument",
    "wrap_openai",
]

for _name in __all__:
    if _name in globals():
        _public(globals()[_name])
