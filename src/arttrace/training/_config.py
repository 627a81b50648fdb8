"""The Trainer's settings, validated once when the Trainer is built."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError

_log = logging.getLogger("arttrace")


@dataclass(frozen=True)
class TrainerConfig:
    """Every setting of a :class:`~arttrace.Trainer` that is not a collaborator (model,
    backend, rollout, datasets); see the Trainer's docstring for what each one does."""

    group_size: int = 8
    groups_per_step: int = 8
    max_concurrency: int = 32
    learning_rate: float = 5e-6
    min_reward_spread: float = 0.0
    max_exceptions: int | float = 0.25
    output_dir: Path = Path("runs/train")
    seed: int = 0
    train_retries: int = 3
    retry_delay: float = 1.0
    train_timeout: float | None = None
    log_to_model: bool = True
    progress: bool = True
    train_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_step", "max_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        if self.train_timeout is not None and not self.train_timeout > 0:
            raise ConfigurationError(
                f"train_timeout must be a positive number of seconds or None (no limit), "
                f"got {self.train_timeout!r}"
            )
        if self.group_size < 2:
            _log.warning("group_size=1: a group of one run has no reward spread to learn from")

    def allowed_exceptions(self, runs: int) -> int:
        """How many of a step's ``runs`` may raise before the step fails."""
        if isinstance(self.max_exceptions, int):
            return self.max_exceptions
        return math.floor(self.max_exceptions * runs)
