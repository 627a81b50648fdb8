"""The training loop: run each example ``group_size`` times, group by example, ship to ART.

``await trainer.step()`` is one GRPO step; ``await trainer.train(...)`` runs steps with
validation at step 0, every ``validate_every`` steps and after the last one. Every finished
rollout is journaled before anything ships, so ``Trainer(..., resume=True)`` continues an
interrupted run without re-running or losing a rollout.

The Trainer orchestrates; each job is its own module: ``_config`` (validated settings),
``_schedule`` (batches, epochs, curriculum), ``_rollout`` (one run and its reward), ``_step``
(one step), ``_ship`` (``backend.train``), ``_report`` (metrics, progress bar, plot,
``model.log``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import art

from .._errors import ConfigurationError
from ..capture._trajectory import MetadataValue, Trajectory
from ._config import TrainerConfig
from ._curriculum import Curriculum
from ._journal import Journal, Slot
from ._report import Reporter, reward_stats
from ._resume import open_run, run_settings, working
from ._rollout import RewardFn, Rollout, run_rollout
from ._schedule import Schedule
from ._step import StepResult, run_rollouts, run_step

__all__ = ["StepResult", "Trainer"]


class Trainer[ExampleT]:
    """GRPO over an existing agent: ``rollout(example)`` is one run of the agent.

    ``rollout`` is an async function of one example. It returns the reward, or an output that
    ``reward_fn(example, output)`` scores, or sets ``arttrace.current_trajectory().reward``
    itself. Every keyword argument not listed here (``kl_penalty_coef``, ``loss_fn``, ...) is
    passed to ``backend.train`` unchanged, like ``learning_rate``.

    ``train_timeout``: seconds ``backend.train`` may take (default: no limit); past it the
    call is cancelled and the step fails with :class:`TrainingError`, its groups kept for
    ``resume=True``. ``min_reward_spread``: groups whose rewards spread (max - min) less than
    this, or not at all, are dropped: they teach nothing. ``max_exceptions``: rollouts that
    may raise in one step, as a count (int) or a fraction of the step's rollouts (float),
    before the step fails.

    In ``output_dir``: the journal (every finished rollout, see :mod:`arttrace.journal`),
    ``metrics.jsonl``, ``validation.jsonl`` and ``reward_plot.png``, redrawn after a step at
    most every 30 s and at the end of :meth:`train`.
    """

    def __init__(
        self,
        model: art.TrainableModel[Any],
        backend: art.Backend,
        rollout: Rollout[ExampleT],
        train_dataset: Sequence[ExampleT],
        *,
        val_dataset: Sequence[ExampleT] | None = None,
        reward_fn: RewardFn[ExampleT] | None = None,
        example_id: Callable[[ExampleT], str] | None = None,
        group_size: int = 8,
        groups_per_step: int = 8,
        max_concurrency: int = 32,
        learning_rate: float = 5e-6,
        min_reward_spread: float = 0.0,
        curriculum: Curriculum | None = None,
        max_exceptions: int | float = 0.25,
        output_dir: str | Path = "runs/train",
        seed: int = 0,
        resume: bool = False,
        train_retries: int = 3,
        retry_delay: float = 1.0,
        train_timeout: float | None = None,
        log_to_model: bool = True,
        progress: bool = True,
        **train_kwargs: Any,
    ) -> None:
        if not train_dataset:
            raise ConfigurationError(
                "train_dataset is empty: give the Trainer at least one example"
            )
        self.config = TrainerConfig(
            group_size=group_size,
            groups_per_step=groups_per_step,
            max_concurrency=max_concurrency,
            learning_rate=learning_rate,
            min_reward_spread=min_reward_spread,
            max_exceptions=max_exceptions,
            output_dir=Path(output_dir),
            seed=seed,
            train_retries=train_retries,
            retry_delay=retry_delay,
            train_timeout=train_timeout,
            log_to_model=log_to_model,
            progress=progress,
            train_kwargs=train_kwargs,
        )
        self.model, self.backend, self.rollout = model, backend, rollout
        self.reward_fn = reward_fn
        self.schedule = Schedule(
            list(train_dataset),
            groups_per_step=groups_per_step,
            seed=seed,
            example_id=example_id,
            curriculum=curriculum,
        )
        self.val_dataset: list[ExampleT] = list(val_dataset or [])
        self.output_dir = self.config.output_dir
        self.journal = Journal(self.output_dir)
        self.reporter = Reporter(
            self.output_dir, model, log_to_model=log_to_model, progress=progress
        )
        state = open_run(self.journal, run_settings(self), resume)
        self.completed_steps: int = state.get("completed_steps", 0)
        if curriculum is not None and "curriculum" in state:
            curriculum.restore(state["curriculum"])

    # -- the schedule ----------------------------------------------------------------------

    @property
    def train_dataset(self) -> Sequence[ExampleT]:
        return self.schedule.dataset

    @property
    def steps_per_epoch(self) -> int:
        return self.schedule.steps_per_epoch

    def batch(self, step: int) -> tuple[int, list[int]]:
        """``(epoch, dataset indices)`` of ``step``: each epoch a fresh seeded shuffle."""
        return self.schedule.batch(step)

    def example_id(self, example: ExampleT, index: int, split: str) -> str:
        return self.schedule.example_id(example, index, split)

    # -- steps -----------------------------------------------------------------------------

    async def step(self) -> StepResult:
        """Run one GRPO step and ship it; see the class docstring."""
        with working(self):
            result = await run_step(self)
            self.reporter.append("metrics.jsonl", result.metrics)
        await self.reporter.report(result.metrics, result.step, "train")
        return result

    async def validate(self) -> dict[str, float]:
        """Run every validation example once; record and return the reward statistics."""
        with working(self):
            return await self._validate()

    async def _validate(self) -> dict[str, float]:
        if not self.val_dataset:
            raise ConfigurationError("no val_dataset was given to the Trainer")
        step = self.completed_steps
        results: dict[Slot, Trajectory] = {}
        slots = {
            (i, 0): (self.example_id(example, i, "val"), example)
            for i, example in enumerate(self.val_dataset)
        }
        await run_rollouts(
            slots,
            lambda slot, example_id, example: self.run_one(example_id, example, "val", step, 0),
            max_concurrency=self.config.max_concurrency,
            bar=self.reporter.bar("val", step, len(slots), []),
            done=results,
        )
        rewards = [t.reward for t in results.values() if t.reward is not None]
        metrics = {
            "step": step,
            **reward_stats(rewards),
            "examples": len(slots),
            "exceptions": sum(t.exception is not None for t in results.values()),
        }
        self.reporter.append("validation.jsonl", metrics)
        await self.reporter.report(metrics, step, "val")
        return metrics

    async def train(
        self,
        *,
        num_steps: int | None = None,
        num_epochs: int | None = None,
        validate_every: int | None = None,
    ) -> list[StepResult]:
        """Run until ``num_steps`` steps (or ``num_epochs`` epochs) have completed in all,
        validating at the start, every ``validate_every`` steps and at the end.

        Returns each step's :class:`StepResult` without its ``groups`` (a long run would keep
        every trajectory in memory; they are in the journal)."""
        if num_steps is not None and num_epochs is None:
            total = num_steps
        elif num_epochs is not None and num_steps is None:
            total = num_epochs * self.steps_per_epoch
        else:
            raise ConfigurationError("give exactly one of num_steps or num_epochs")
        with working(self):  # one lock from the first step to the last
            validated = {int(v["step"]) for v in self.reporter.read("validation.jsonl")}
            results: list[StepResult] = []

            async def maybe_validate() -> None:
                if self.val_dataset and self.completed_steps not in validated:
                    await self.validate()
                    validated.add(self.completed_steps)

            if self.completed_steps == 0:
                await maybe_validate()
            while self.completed_steps < total:
                results.append(dataclasses.replace(await self.step(), groups=[]))
                if validate_every and self.completed_steps % validate_every == 0:
                    await maybe_validate()
            await maybe_validate()
        await self.reporter.finish()
        return results

    async def flush(self) -> None:
        """Wait for the last step's ``model.log`` and plot. :meth:`train` also redraws the
        plot at its end, if a step came after its last drawing."""
        await self.reporter.flush()

    async def run_one(
        self, example_id: str, example: ExampleT, split: str, step: int, rollout: int
    ) -> Trajectory:
        """One run of ``example`` in its own trajectory (see :func:`run_rollout`)."""
        metadata: dict[str, MetadataValue] = {"split": split, "step": step, "rollout": rollout}
        return await run_rollout(self.rollout, self.reward_fn, example_id, example, metadata)
