"""Pipelined training: the rollouts of the next ``max_steps_off_policy`` steps run while a
step ships, so neither the trainer nor the rollouts wait for the other.

Step ``t``'s rollouts start once ``t - k`` steps have trained (``k = max_steps_off_policy``):
every run samples from a policy at most ``k`` steps behind the step that ships it, and each
run records that policy as ``policy_step`` in its metadata. Steps ship in order, one at a
time, from their journaled runs, so exactly-once journaling and shipping are the synchronous
Trainer's. With ``k = 0`` this is the synchronous loop: rollouts, then training.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ._step import Collected, StepResult, collect, finish

if TYPE_CHECKING:
    from ._trainer import Trainer


class Pipeline:
    """The steps of one :meth:`Trainer.train` call, up to (not including) step ``last``."""

    def __init__(self, trainer: Trainer[Any], last: int) -> None:
        self.trainer, self.last = trainer, last
        self._collecting: dict[int, asyncio.Task[Collected]] = {}
        self._idle_since: float | None = None
        """When the last rollout in flight ended, waiting for a step to train."""
        self._rollouts_waited = 0.0

    async def step(self) -> StepResult:
        """Ship the next step, starting the rollouts of the ones the policy now allows."""
        step = self.trainer.completed_steps
        self._start_ready()
        waiting = time.perf_counter()
        collected = await self._collecting.pop(step)
        trainer_waited = time.perf_counter() - waiting
        result = await finish(
            self.trainer,
            collected,
            lambda: {
                "trainer_wait_seconds": trainer_waited,
                "rollout_wait_seconds": self._take_rollouts_waited(),
            },
        )
        self._start_ready()  # before validation or the caller's code between steps
        return result

    async def aclose(self) -> None:
        """Cancel the rollouts still in flight: they are not journaled, and ``resume=True``
        runs them again."""
        tasks = list(self._collecting.values())
        self._collecting.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_ready(self) -> None:
        ahead = self.trainer.completed_steps + self.trainer.config.max_steps_off_policy
        for step in range(self.trainer.completed_steps, min(ahead + 1, self.last)):
            if step not in self._collecting:
                if self._idle_since is not None:
                    self._rollouts_waited += time.perf_counter() - self._idle_since
                    self._idle_since = None
                task = asyncio.ensure_future(collect(self.trainer, step))
                task.add_done_callback(self._collected)
                self._collecting[step] = task

    def _collected(self, _: asyncio.Task[Collected]) -> None:
        if all(task.done() for task in self._collecting.values()):
            self._idle_since = time.perf_counter()

    def _take_rollouts_waited(self) -> float:
        """Time no rollout ran since the last step shipped (this step's training included),
        because the policy the next rollouts sample from was not trained yet."""
        waited, self._rollouts_waited = self._rollouts_waited, 0.0
        if self._idle_since is not None:
            now = time.perf_counter()
            waited, self._idle_since = waited + now - self._idle_since, now
        return waited
