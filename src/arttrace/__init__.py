"""arttrace: capture what an existing LLM agent does, and train its model with OpenPipe ART.

import arttrace as at

at.instrument()                          # patch the OpenAI SDK (or at.wrap_openai(client))

@at.trainable                            # the LLM calls made inside are the policy's turns
async def solve(question: str) -> str: ...

with at.trajectory("q-17") as t:         # one run of one example
    t.reward = score(await solve("..."))
t.to_art()                               # an art.Trajectory, trainable turns as Choices
"""

from ._warnings import UntrainableTurnWarning
from .capture import Settings
from .curriculum import Curriculum
from .decorators import trainable
from .dry_run import DryRunBackend
from .openai_shim import instrument, is_instrumented, uninstrument, wrap_openai
from .records import ChoiceRecord, LLMCall
from .trainer import StepResult, Trainer, TrainingError
from .trajectory import Trajectory, current_trajectory, trajectory

__version__ = "0.1.0"

__all__ = [
    "ChoiceRecord",
    "Curriculum",
    "DryRunBackend",
    "LLMCall",
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
