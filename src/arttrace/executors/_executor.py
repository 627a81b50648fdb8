"""The executor protocol, and the default executor: rollouts as tasks of this process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..capture._trajectory import MetadataValue, Trajectory
    from ._rollout import RolloutRunner


type Metadata = Callable[[], dict[str, MetadataValue]]
"""What :meth:`Executor.run` calls for a rollout's metadata, once the rollout starts."""


@runtime_checkable
class Executor(Protocol):
    """Where a :class:`~arttrace.Trainer` runs its rollouts.

    The Trainer decides which rollouts run, journals each finished one and ships the groups;
    an executor only runs them. It must return every rollout it was given, exactly once:
    a rollout that failed, for any reason (the agent raised, the reward was missing, the
    worker running it died), comes back with its cause on ``Trajectory.exception``, which
    the step counts under ``max_exceptions``.
    """

    def bind(self, runner: RolloutRunner[Any], examples: Sequence[Any], concurrency: int) -> None:
        """Called when the Trainer is built (and when its ``rollout`` is replaced): check
        that ``runner`` (the rollout and ``reward_fn``) and every one of ``examples`` can run
        here, raising :class:`~arttrace.ConfigurationError` naming what cannot, and get
        ready. ``concurrency`` is the Trainer's ``max_concurrency``."""
        ...

    async def run(self, example_id: str, example: Any, metadata: Metadata) -> Trajectory:
        """One rollout of ``example`` in a fresh trajectory opened with ``example_id`` and
        ``metadata()``, with its reward; the finished run, never raising for its failure.
        Waits while the executor's limit of rollouts in flight is reached, and only then
        calls ``metadata()`` (again for each try): it names the policy the run samples from,
        which a step trained in the meantime has changed."""
        ...

    def close(self) -> None:
        """Release what :meth:`bind` acquired (idempotent)."""
        ...


class InProcessExecutor:
    """Rollouts as asyncio tasks of the Trainer's process, at most ``max_concurrency``
    (the Trainer's, unless given) in flight; a sync rollout runs in a worker thread."""

    def __init__(self, max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency
        self._runner: RolloutRunner[Any] | None = None
        self._limit: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def bind(self, runner: RolloutRunner[Any], examples: Sequence[Any], concurrency: int) -> None:
        self._runner = runner
        if self.max_concurrency is None:
            self.max_concurrency = concurrency

    async def run(self, example_id: str, example: Any, metadata: Metadata) -> Trajectory:
        if self._runner is None:
            raise RuntimeError("InProcessExecutor.run before bind: pass it to a Trainer")
        async with self._semaphore():
            return await self._runner.run(example_id, example, metadata())

    def _semaphore(self) -> asyncio.Semaphore:
        """The limit, one per event loop (each ``asyncio.run`` has its own)."""
        loop = asyncio.get_running_loop()
        if self._limit is None or self._limit[0] is not loop:
            self._limit = loop, asyncio.Semaphore(self.max_concurrency or 1)
        return self._limit[1]

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
