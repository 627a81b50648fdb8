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

from ._errors import ArttraceError
from ._instrument import instrument, is_instrumented, uninstrument, wrap_openai
from .capture._calls import Settings
from .capture._records import ChoiceRecord, LLMCall
from .capture._trainable import trainable
from .capture._trajectory import Trajectory, current_trajectory, trajectory
from .capture._warnings import NothingToTrainWarning, UntrainableTurnWarning

if TYPE_CHECKING:
    from .gateway import Gateway
    from .training import (
        CPUBackend,
        Curriculum,
        DryRunBackend,
        StepResult,
        Trainer,
        TrainingError,
    )

_TRAINING = frozenset(
    {"CPUBackend", "Curriculum", "DryRunBackend", "StepResult", "Trainer", "TrainingError"}
)


def __getattr__(name: str) -> Any:
    """The training names load ART, and ``Gateway`` starlette and uvicorn, so they are
    imported on first use."""
    if name in _TRAINING:
        from . import training

        return getattr(training, name)
    if name == "Gateway":
        from .gateway import Gateway

        return Gateway
    raise AttributeError(f"module 'arttrace' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "ArttraceError",
    "CPUBackend",
    "ChoiceRecord",
    "Curriculum",
    "DryRunBackend",
    "Gateway",
    "LLMCall",
    "NothingToTrainWarning",
    "Settings",
    "StepResult",
    "Trainer",
    "TrainingError",
    "Trajectory",
    "UntrainableTurnWarning",
    "current_trajectory",
    "instrument",
    "is_instrumented",
    "trainable",
    "trajectory",
    "uninstrument",
    "wrap_openai",
]
