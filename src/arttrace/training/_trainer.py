"""The training loop: run each example ``group_size`` times, group by example, ship to ART.

``await trainer.step()`` is one GRPO step; ``await trainer.train(...)`` runs steps with
validation at step 0, every ``validate_every`` steps and after the last one. Every finished
rollout is journaled before anything ships, so ``Trainer(..., resume=True)`` continues an
interrupted run without re-running or losing a rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import art
from art.trajectories import PydanticException
from tqdm.auto import tqdm

from .._art import trainable_tokens
from .._errors import ConfigurationError, TrainingError
from ..capture._trajectory import Trajectory, check_reward, trajectory
from ._curriculum import Curriculum
from ._journal import Journal, Slot
from ._plot import reward_plot

_log = logging.getLogger("arttrace")
_PLOT_INTERVAL = 30.0
"""Seconds between two redraws of the reward plot (~0.15 s of CPU each) after steps."""
Rollout = Callable[[Any], Awaitable[Any]]
RewardFn = Callable[[Any, Any], float | Awaitable[float]]


@dataclass
class StepResult:
    step: int
    """The step number (0-based): how many steps had completed before this one."""
    epoch: int
    metrics: dict[str, float]
    groups: list[art.TrajectoryGroup] = field(repr=False)
    """The groups shipped to the backend (empty when no group had learning signal, and in
    the results of :meth:`Trainer.train`)."""
    train_result: Any = None


class Trainer:
    """GRPO over an existing agent: ``rollout(example)`` is one run of the agent.

    ``rollout`` is an async function of one example. It returns the reward, or an output that
    ``reward_fn(example, output)`` scores, or sets ``arttrace.current_trajectory().reward``
    itself. Every keyword argument not listed here (``kl_penalty_coef``, ``loss_fn``, ...) is
    passed to ``backend.train`` unchanged, like ``learning_rate``.

    ``min_reward_spread``: groups whose rewards spread (max - min) less than this, or not at
    all, are dropped: they teach nothing. ``max_exceptions``: rollouts that may raise in one
    step, as a count (int) or a fraction of the step's rollouts (float), before the step fails.

    In ``output_dir``: the journal (every finished rollout, see :mod:`arttrace.journal`),
    ``metrics.jsonl``, ``validation.jsonl`` and ``reward_plot.png``, redrawn after a step at
    most every 30 s and at the end of :meth:`train`.
    """

    def __init__(
        self,
        model: art.TrainableModel[Any],
        backend: Any,
        rollout: Rollout,
        train_dataset: Sequence[Any],
        *,
        val_dataset: Sequence[Any] | None = None,
        reward_fn: RewardFn | None = None,
        example_id: Callable[[Any], str] | None = None,
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
        log_to_model: bool = True,
        progress: bool = True,
        **train_kwargs: Any,
    ) -> None:
        if not train_dataset:
            raise ConfigurationError(
                "train_dataset is empty: give the Trainer at least one example"
            )
        for name, value in (
            ("group_size", group_size),
            ("groups_per_step", groups_per_step),
            ("max_concurrency", max_concurrency),
        ):
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        if group_size < 2:
            _log.warning("group_size=1: a group of one run has no reward spread to learn from")
        self.model, self.backend, self.rollout = model, backend, rollout
        self.train_dataset, self.val_dataset = list(train_dataset), list(val_dataset or [])
        self.reward_fn, self._example_id = reward_fn, example_id
        self.group_size, self.groups_per_step = group_size, groups_per_step
        self.learning_rate, self.train_kwargs = learning_rate, train_kwargs
        self.min_reward_spread, self.curriculum = min_reward_spread, curriculum
        self.max_exceptions, self.seed = max_exceptions, seed
        self.train_retries, self.retry_delay = train_retries, retry_delay
        self.log_to_model, self.progress = log_to_model, progress
        self.output_dir = Path(output_dir)
        self.journal = Journal(self.output_dir)
        self.max_concurrency = max_concurrency
        self._model_log_failed = False
        self._reporting: asyncio.Future[None] | None = None
        self._plotted_at, self._plot_stale = -math.inf, False
        state = self.journal.load_state()
        if state and not resume:
            raise ConfigurationError(
                f"{self.output_dir} already holds a run ({state['completed_steps']} steps): "
                "pass resume=True to continue it, or choose another output_dir"
            )
        self.completed_steps: int = state.get("completed_steps", 0)
        if curriculum is not None and "curriculum" in state:
            curriculum.restore(state["curriculum"])

    # -- the schedule ----------------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_dataset) / self.groups_per_step)

    def batch(self, step: int) -> tuple[int, list[int]]:
        """``(epoch, dataset indices)`` of ``step``: each epoch a fresh seeded shuffle."""
        epoch, position = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.train_dataset)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        start = position * self.groups_per_step
        return epoch, order[start : start + self.groups_per_step]

    def example_id(self, example: Any, index: int, split: str) -> str:
        if self._example_id is not None:
            return str(self._example_id(example))
        if isinstance(example, Mapping) and "id" in example:
            return str(example["id"])
        return f"{split}-{index}"

    # -- one step --------------------------------------------------------------------------

    async def step(self) -> StepResult:
        """Run one GRPO step and ship it; see the class docstring."""
        step = self.completed_steps
        epoch, indices = self.batch(step)
        if self.curriculum is not None:
            self.curriculum.advance(epoch)
        started = time.perf_counter()
        finished = self.journal.finished(step)
        slots = {
            (pos, k): (self.example_id(self.train_dataset[i], i, "train"), self.train_dataset[i])
            for pos, i in enumerate(indices)
            for k in range(self.group_size)
        }
        try:
            await self._run(
                {s: v for s, v in slots.items() if s not in finished},
                split="train",
                step=step,
                done=finished,
                on_done=lambda slot, t: self.journal.record(step, slot, t),  # before shipping
            )
        finally:
            self.journal.close()
        rollout_seconds = time.perf_counter() - started

        with _gc_paused():
            groups, failures = self._groups(indices, finished)
        failed = sum(failures)
        allowed = (
            self.max_exceptions
            if isinstance(self.max_exceptions, int)
            else math.floor(self.max_exceptions * len(slots))
        )
        if failed > allowed:
            raise TrainingError(
                f"step {step}: {failed} of {len(slots)} rollouts raised (max_exceptions="
                f"{self.max_exceptions!r}); see the groups' exceptions in {self.journal.root}"
            )
        with_signal = [g for g in groups if _spread(g) > 0 and _spread(g) >= self.min_reward_spread]
        dropped = len(groups) - len(with_signal)
        shipped, excluded = (
            self.curriculum.select(with_signal) if self.curriculum else (with_signal, [])
        )

        train_started = time.perf_counter()
        train_result = None
        if shipped and not self.journal.shipped(step):
            train_result = await self._ship(step, shipped)
        train_seconds = time.perf_counter() - train_started

        rewards = [t.reward for g in groups for t in g.trajectories]
        metrics: dict[str, float] = {
            "step": step,
            "epoch": epoch,
            **_reward_stats(rewards),
            "groups": len(groups),
            "groups_kept": len(shipped),
            "groups_dropped": dropped,
            "groups_excluded_by_curriculum": len(excluded),
            "trajectories": len(rewards),
            "exceptions": failed,
            "trainable_tokens": sum(trainable_tokens(t) for g in shipped for t in g.trajectories),
            "rollout_seconds": rollout_seconds,
            "train_seconds": train_seconds,
        }
        if self.curriculum is not None:
            metrics["curriculum_percentile"] = self.curriculum.percentile
        if train_result is not None:
            metrics.update({f"train/{k}": float(v) for k, v in train_result.metrics.items()})
        self.journal.mark_shipped(step, {"groups": len(shipped), "metrics": metrics})
        self.completed_steps = step + 1
        self.journal.save_state(
            {
                "completed_steps": self.completed_steps,
                **({"curriculum": self.curriculum.state()} if self.curriculum else {}),
            }
        )
        self._append("metrics.jsonl", metrics)
        await self._report(metrics, step, "train")
        return StepResult(step, epoch, metrics, shipped, train_result)

    async def validate(self) -> dict[str, float]:
        """Run every validation example once; record and return the reward statistics."""
        if not self.val_dataset:
            raise ConfigurationError("no val_dataset was given to the Trainer")
        results: dict[Slot, Trajectory] = {}
        slots = {
            (i, 0): (self.example_id(example, i, "val"), example)
            for i, example in enumerate(self.val_dataset)
        }
        await self._run(slots, split="val", step=self.completed_steps, done=results)
        rewards = [t.reward for t in results.values() if t.reward is not None]
        metrics = {
            "step": self.completed_steps,
            **_reward_stats(rewards),
            "examples": len(slots),
            "exceptions": sum(t.exception is not None for t in results.values()),
        }
        self._append("validation.jsonl", metrics)
        await self._report(metrics, self.completed_steps, "val")
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
        if (num_steps is None) == (num_epochs is None):
            raise ConfigurationError("give exactly one of num_steps or num_epochs")
        total = num_steps if num_steps is not None else num_epochs * self.steps_per_epoch  # type: ignore[operator]
        validated = {int(v["step"]) for v in self._read("validation.jsonl")}
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
        await self.flush()
        if self._plot_stale:
            self._plot_stale = False
            await self._plot()
        return results

    # -- internals -------------------------------------------------------------------------

    async def _run(
        self,
        slots: dict[Slot, tuple[str, Any]],
        *,
        split: str,
        step: int,
        done: dict[Slot, Trajectory],
        on_done: Callable[[Slot, Trajectory], None] | None = None,
    ) -> None:
        """Run the rollouts of ``slots`` concurrently (bounded), filling ``done``."""
        bar = tqdm(
            total=len(slots) + len(done),
            initial=len(done),
            desc=f"{split} step {step}",
            unit="run",
            disable=not self.progress,
            leave=False,
        )
        rewards = [t.reward for t in done.values() if t.reward is not None]
        total, count = sum(rewards), len(rewards)

        semaphore = asyncio.Semaphore(self.max_concurrency)  # bound to this event loop

        async def one(slot: Slot, example_id: str, example: Any) -> None:
            nonlocal total, count
            async with semaphore:
                t = await self._rollout(example_id, example, split, step, slot[1])
            if on_done is not None:
                on_done(slot, t)
            done[slot] = t
            if t.reward is not None:
                total, count = total + t.reward, count + 1
            if bar.update():  # it redrew (at most every 0.1 s): show the mean from now on
                bar.set_postfix(reward=f"{total / max(count, 1):.3f}", refresh=False)

        tasks = [asyncio.ensure_future(one(s, *v)) for s, v in slots.items()]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            bar.close()

    async def _rollout(
        self, example_id: str, example: Any, split: str, step: int, rollout: int
    ) -> Trajectory:
        t = trajectory(example_id, metadata={"split": split, "step": step, "rollout": rollout})
        try:
            async with t:
                output = await self.rollout(example)
                if self.reward_fn is not None:
                    reward = self.reward_fn(example, output)
                    t.reward = await reward if inspect.isawaitable(reward) else reward
                elif output is not None:
                    t.reward = check_reward(output)
                elif t.reward is None:
                    raise ConfigurationError(
                        "the rollout returned None and set no reward: return the reward, set "
                        "arttrace.current_trajectory().reward, or pass reward_fn to the Trainer"
                    )
        except Exception:
            pass  # kept on t.exception; the group records it
        return t

    def _groups(
        self, indices: list[int], done: dict[Slot, Trajectory]
    ) -> tuple[list[art.TrajectoryGroup], list[int]]:
        """One group per example. Runs are converted to ART here, once all have finished:
        an ART trajectory is ~600 small objects, and holding a step's worth of them through
        the rollouts made every full garbage collection in between walk them all."""
        groups, failures = [], []
        for pos, index in enumerate(indices):
            slots = [(pos, k) for k in range(self.group_size)]
            ok = [
                done[s].to_art()
                for s in slots
                if done[s].exception is None and done[s].reward is not None
            ]
            exceptions = [PydanticException(**error) for s in slots if (error := done[s].exception)]
            example_id = self.example_id(self.train_dataset[index], index, "train")
            groups.append(
                art.TrajectoryGroup(
                    ok,
                    exceptions=exceptions,
                    metadata={"example_id": example_id},
                )
            )
            failures.append(len(exceptions))
        return groups, failures

    async def _ship(self, step: int, groups: list[art.TrajectoryGroup]) -> Any:
        for attempt in range(self.train_retries + 1):
            try:
                return await self.backend.train(
                    self.model, groups, learning_rate=self.learning_rate, **self.train_kwargs
                )
            except Exception as error:
                if getattr(self.model, "_backend", None) is None:
                    raise TrainingError(
                        f"step {step}: the backend refused to train ({error!r}) and the model "
                        "was never registered: call `await model.register(backend)` before "
                        "training, then run again with resume=True (the rollouts are kept)"
                    ) from error
                if attempt == self.train_retries:
                    raise TrainingError(
                        f"step {step}: the backend failed {attempt + 1} times ({error!r}); "
                        f"the step's rollouts are in {self.journal.root}: run again with "
                        "resume=True to ship them without re-running them"
                    ) from error
                delay = self.retry_delay * 2**attempt
                _log.warning(
                    "step %d: backend.train failed (%r); retrying in %.1fs", step, error, delay
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _append(self, name: str, record: dict[str, Any]) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.output_dir / name).open("a") as f:
            f.write(json.dumps(record) + "\n")

    def _read(self, name: str) -> list[dict[str, Any]]:
        path = self.output_dir / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    async def _report(self, metrics: dict[str, float], step: int, split: str) -> None:
        """Send the metrics to ``model.log`` (ART's history and, with ``WANDB_API_KEY`` set,
        W&B) and redraw the reward plot if the last drawing is ``_PLOT_INTERVAL`` old, in the
        background (see :meth:`flush`). The trajectories themselves are in the journal."""
        await self.flush()
        now = time.monotonic()
        plot = now - self._plotted_at >= _PLOT_INTERVAL
        self._plot_stale = not plot
        if plot:
            self._plotted_at = now
        self._reporting = asyncio.ensure_future(self._write_report(metrics, step, split, plot))

    async def flush(self) -> None:
        """Wait for the last step's ``model.log`` and plot. :meth:`train` also redraws the
        plot at its end, if a step came after its last drawing."""
        if self._reporting is not None:
            reporting, self._reporting = self._reporting, None
            if reporting.get_loop() is asyncio.get_running_loop():
                await reporting
            else:  # the event loop it ran on has closed (asyncio.run per step) and cancelled it
                self._plot_stale = True

    async def _plot(self) -> None:
        path = self.output_dir / "reward_plot.png"
        records = (self._read("metrics.jsonl"), self._read("validation.jsonl"))
        try:
            await asyncio.to_thread(reward_plot, path, *records)
        except Exception as error:  # a plot must not stop training
            _log.warning("could not draw %s: %r", path, error)

    async def _write_report(
        self, metrics: dict[str, float], step: int, split: str, plot: bool
    ) -> None:
        if plot:
            await self._plot()
        if not self.log_to_model or self._model_log_failed:
            return
        try:
            await self.model.log(split=split, metrics=metrics, step=step)
        except Exception as error:  # logging must not stop training
            self._model_log_failed = True
            _log.warning(
                "model.log failed (%r); metrics stay in %s. Pass log_to_model=False to skip it.",
                error,
                self.output_dir / "metrics.jsonl",
            )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection inside: building many long-lived objects in one burst otherwise
    triggers a full collection every time they grow by a quarter, each walking all of them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _spread(group: art.TrajectoryGroup) -> float:
    rewards = [t.reward for t in group.trajectories]
    return max(rewards) - min(rewards) if len(rewards) > 1 else 0.0


def _reward_stats(rewards: list[float]) -> dict[str, float]:
    if not rewards:
        return {
            "reward_mean": math.nan,
            "reward_min": math.nan,
            "reward_max": math.nan,
            "reward_std": math.nan,
        }
    mean = sum(rewards) / len(rewards)
    return {
        "reward_mean": mean,
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)),
    }
