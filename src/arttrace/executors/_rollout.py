"""One run of the agent on one example, inside its own trajectory, and its reward.

The reward of a run, in this order:

1. with ``reward_fn``: ``reward_fn(example, output)`` (sync or async), ``output`` being what the
   rollout returned;
2. else, when the rollout returned a real number (``float``, ``int``, ``numpy.float32``,
   ``Decimal``, ``Fraction``, ...; not ``bool``): that number;
3. else what the rollout set with ``arttrace.current_trajectory().reward = ...``; whatever else
   it returned (its answer, say) is then ignored.

Where several policies train at once, each of these may instead be one reward per policy: a
mapping ``{policy name: reward}`` (``current_trajectory().policy_rewards = ...``). It is kept
on the run (``Trajectory.policy_rewards``); the run's own reward is the mean.

A reward that is not a finite real number, no reward at all, or two sources that disagree
(the rollout set ``0.0`` and returned ``1.0``, or set one and ``reward_fn`` gave another) fail
the run with a :class:`~arttrace.ConfigurationError` that says what to do.

A run that takes longer than ``timeout`` (the Trainer's ``rollout_timeout``; its reward
included) is stopped where it runs (in this process, or on a Ray worker) and fails with a
:class:`~arttrace.RolloutTimeoutError`. Its trajectory is closed as any failed run's: the calls
it recorded are kept, a call still waiting is kept as partial.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._errors import ConfigurationError, RolloutTimeoutError
from ..capture._trajectory import MetadataValue, Trajectory, check_reward, hosting_trajectory

type Rollout[ExampleT] = Callable[[ExampleT], Awaitable[Any]] | Callable[[ExampleT], Any]
"""One run of the agent on one example: an async function, or a sync one (run in a thread)."""
type Reward = float | Mapping[str, float]
"""A run's reward, or one per policy (``{"planner": 1.0, "executor": 0.0}``)."""
type RewardFn[ExampleT] = Callable[[ExampleT, Any], Reward | Awaitable[Reward]]
"""Scores a rollout's output: ``reward_fn(example, output)``, sync or async."""

_FIX = (
    "return the reward (a finite real number), set arttrace.current_trajectory().reward, "
    "or pass reward_fn=... to the Trainer to score what the rollout returns"
)


def check_rollout(rollout: object) -> None:
    """Refuse at construction what cannot be a rollout (a generator, a non-callable)."""
    if not callable(rollout):
        raise ConfigurationError(
            f"rollout must be a function of one example, got {type(rollout).__name__} "
            f"{rollout!r:.80}"
        )
    call = getattr(rollout, "__call__", None)  # noqa: B004  (a callable object's method)
    if any(
        inspect.isasyncgenfunction(f) or inspect.isgeneratorfunction(f) for f in (rollout, call)
    ):
        raise ConfigurationError(
            f"rollout {getattr(rollout, '__name__', rollout)!r} is a generator function: "
            "a rollout runs the agent once and returns (not yields) its reward or output"
        )


def is_async(rollout: object) -> bool:
    return inspect.iscoroutinefunction(rollout) or inspect.iscoroutinefunction(
        getattr(rollout, "__call__", None)  # noqa: B004
    )


class RolloutRunner[ExampleT]:
    """Runs ``rollout`` for one example in a fresh trajectory and gives the run its reward.

    A sync ``rollout`` runs in a worker thread (at most ``max_concurrency`` at a time) in a
    copy of the run's context, so ``current_trajectory()`` and a sync OpenAI client's calls
    belong to the run, and the event loop keeps the other runs going. ``timeout``: seconds a
    run may take (``None``: no limit)."""

    def __init__(
        self,
        rollout: Rollout[ExampleT],
        reward_fn: RewardFn[ExampleT] | None,
        max_concurrency: int,
        timeout: float | None = None,
    ) -> None:
        check_rollout(rollout)
        if reward_fn is not None and not callable(reward_fn):
            raise ConfigurationError(
                "reward_fn must be a function of (example, output) returning the reward, got "
                f"{type(reward_fn).__name__} {reward_fn!r:.80}"
            )
        self.rollout, self.reward_fn, self.timeout = rollout, reward_fn, timeout
        self._async = is_async(rollout)
        self._max_threads = max_concurrency
        self._threads: ThreadPoolExecutor | None = None

    async def run(
        self, example_id: str, example: ExampleT, metadata: dict[str, MetadataValue]
    ) -> Trajectory:
        """The finished run. An exception (the rollout's, or a missing or bad reward) is kept
        on ``Trajectory.exception``, not raised."""
        t = hosting_trajectory(example_id, metadata=metadata)
        try:
            async with t:
                limit = asyncio.timeout(self.timeout)
                try:
                    async with limit:
                        output = await self._call(example)
                        t.reward = await self._reward(t, example, output)
                except Exception as error:
                    if not limit.expired():
                        raise  # the rollout's own
                    # its traceback (the chained cause) shows where the run was waiting
                    raise RolloutTimeoutError(self._timed_out(t)) from error
                if limit.expired():  # it swallowed the cancellation, but ran past the limit
                    raise RolloutTimeoutError(self._timed_out(t))
        except Exception:
            pass  # kept on t.exception; the group records it
        return t

    def _timed_out(self, t: Trajectory) -> str:
        """Why the run was stopped, what it keeps, and what to do."""
        done, waiting = len(t.call_log.records), t.call_log.in_flight
        kept = [f"{done} LLM call{'s' if done > 1 else ''} it made"] if done else []
        if waiting:
            kept.append(f"{waiting} still waiting for an answer, marked partial")
        message = (
            f"the run took longer than rollout_timeout={self.timeout:g} s and was stopped; "
            + (f"kept with the run: {' and '.join(kept)}" if kept else "it made no LLM call")
            + ". If a call hangs, give the agent's LLM client a timeout of its own "
            "(openai.AsyncOpenAI(timeout=...)); if runs need longer, raise "
            "Trainer(rollout_timeout=...)"
        )
        if not self._async:
            message += (
                ". A sync rollout's thread cannot be stopped: it runs on in the background, "
                "and what it does from now on is not recorded"
            )
        return message

    def close(self) -> None:
        """Let the worker threads go once their rollouts end (a new call starts new ones)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    async def _call(self, example: ExampleT) -> Any:
        if self._async:
            return await self.rollout(example)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self._max_threads, "arttrace-rollout")
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        output = await loop.run_in_executor(self._threads, context.run, self.rollout, example)
        return await output if inspect.isawaitable(output) else output  # a lambda: coroutine

    async def _reward(self, t: Trajectory, example: ExampleT, output: Any) -> float:
        """The run's reward, in the order of this module's docstring. A mapping of policy
        names to rewards (from ``reward_fn`` or returned) sets ``t.policy_rewards``, and the
        run's reward is their mean."""
        was_set = t.reward
        if self.reward_fn is not None:
            value = self.reward_fn(example, output)
            value = await value if inspect.isawaitable(value) else value
            try:
                reward, source = _checked(t, value), "reward_fn gave"
            except ConfigurationError as error:
                raise ConfigurationError(f"reward_fn: {error}") from None
        elif output is not None:
            try:
                reward, source = _checked(t, output), "the rollout returned"
            except ConfigurationError as error:
                if was_set is not None and not isinstance(output, Mapping):
                    return was_set  # it returned its answer and set the reward itself
                raise ConfigurationError(
                    f"the rollout returned {type(output).__name__} {output!r:.80}, which is "
                    f"not a reward ({error}), and set no reward: {_FIX}"
                ) from None
        elif was_set is None:
            raise ConfigurationError(f"the rollout returned None and set no reward: {_FIX}")
        else:
            return was_set
        if was_set is not None and not math.isclose(was_set, reward, rel_tol=1e-6):
            raise ConfigurationError(
                f"the rollout set current_trajectory().reward = {was_set!r} but {source} "
                f"{reward!r}: give the reward one way (to score a returned output, pass "
                "reward_fn and do not set the reward in the rollout)"
            )
        return reward


def _checked(t: Trajectory, value: Any) -> float:
    """A reward, or a mapping of policy rewards (kept on ``t``; their mean is returned)."""
    if isinstance(value, Mapping):
        t.policy_rewards = value
        assert t.reward is not None
        return t.reward
    return check_reward(value)
