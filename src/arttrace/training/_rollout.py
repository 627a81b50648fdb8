"""One run of the agent on one example, inside its own trajectory, and its reward."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from .._errors import ConfigurationError
from ..capture._trajectory import MetadataValue, Trajectory, check_reward, trajectory

type Rollout[ExampleT] = Callable[[ExampleT], Awaitable[Any]]
"""One run of the agent: an async function of one example."""
type RewardFn[ExampleT] = Callable[[ExampleT, Any], float | Awaitable[float]]
"""Scores a rollout's output: ``reward_fn(example, output)``, sync or async."""


async def run_rollout[ExampleT](
    rollout: Rollout[ExampleT],
    reward_fn: RewardFn[ExampleT] | None,
    example_id: str,
    example: ExampleT,
    metadata: dict[str, MetadataValue],
) -> Trajectory:
    """Run ``rollout(example)`` in a new trajectory and set its reward. An exception (the
    rollout's, or a missing or bad reward) is kept on ``Trajectory.exception``, not raised."""
    t = trajectory(example_id, metadata=metadata)
    try:
        async with t:
            output = await rollout(example)
            if reward_fn is not None:
                reward = reward_fn(example, output)
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
