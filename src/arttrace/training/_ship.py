"""Shipping a step's groups to the backend: ``backend.train``, with retries."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import art

from .._errors import TrainingError
from ._config import TrainerConfig

_log = logging.getLogger("arttrace")


async def ship(
    backend: art.Backend,
    model: art.TrainableModel[Any],
    step: int,
    groups: list[art.TrajectoryGroup],
    config: TrainerConfig,
    journal_root: Path,
) -> art.TrainResult:
    """``backend.train(model, groups, learning_rate=..., **train_kwargs)``, retried
    ``config.train_retries`` times with exponential backoff; a :class:`TrainingError` after."""
    for attempt in range(config.train_retries + 1):
        try:
            return await backend.train(
                model, groups, learning_rate=config.learning_rate, **config.train_kwargs
            )
        except Exception as error:
            if getattr(model, "_backend", None) is None:
                raise TrainingError(
                    f"step {step}: the backend refused to train ({error!r}) and the model "
                    "was never registered: call `await model.register(backend)` before "
                    "training, then run again with resume=True (the rollouts are kept)"
                ) from error
            if attempt == config.train_retries:
                raise TrainingError(
                    f"step {step}: the backend failed {attempt + 1} times ({error!r}); "
                    f"the step's rollouts are in {journal_root}: run again with "
                    "resume=True to ship them without re-running them"
                ) from error
            delay = config.retry_delay * 2**attempt
            _log.warning(
                "step %d: backend.train failed (%r); retrying in %.1fs", step, error, delay
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
