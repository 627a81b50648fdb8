"""Group rewards: a function over one example's runs gives each run its reward.

``Trainer(group_reward=fn)`` calls ``fn(group)`` for each group of a step as soon as that
group's last run has finished, inside the step's rollouts (so judging overlaps the other
groups' rollouts and, in pipelined training, the previous step's training). ``fn`` returns
one reward per run of ``group.runs`` (or a :class:`GroupRewards` with metrics); each run's own
reward is kept in its metrics as ``independent_reward``, as ART's RULER does.

Rules, in one place:

- **Which runs are judged**: the runs that finished with a reward. A run that raised stays
  failed and is not shown to the judge; a group with fewer than two finished runs is not
  judged (it has no spread to learn from) and keeps its own rewards.
- **Journaled**: each judged group is one line of ``journal/step-NNNNN/group_rewards.jsonl``
  (rewards, the judge's metrics and explanations, and the runs it judged by their start
  time). ``resume=True`` reads it back and never calls the judge again for that group; a
  group whose runs were run again (a step set aside) is judged again.
- **Failures are never silent**: a judge that raises, or returns the wrong number of
  rewards or a value that is not a finite real number, fails the group. Its runs count as
  raised under ``max_exceptions``, with the cause (naming the example and the fix) on each
  run's ``exception``, and a log line says so. The failure is journaled for reading, but a
  resumed run judges that group again (the judge may have been fixed or come back).
- **Not captured**: the function runs outside every trajectory, with capture off (the OpenAI
  shim and the HTTP layer let its calls pass), so a judge's LLM calls never enter a run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from .._journal import Slot, append_line, read_lines
from ..capture import _context
from ..capture._conversations import Turn
from ..capture._trajectory import (
    Trajectory,
    check_policy_rewards,
    check_reward,
    current_trajectory,
)
from ..executors._rollout import Reward

if TYPE_CHECKING:
    from .._journal import Journal

__all__ = ["Group", "GroupRewardFn", "GroupRewards", "GroupRun", "own_reward"]

_log = logging.getLogger("arttrace")


@dataclass(frozen=True, slots=True)
class GroupRun:
    """One finished run of a group, as the group reward function sees it."""

    rollout: int
    """The run's number in its group (``0 .. group_size - 1``); runs that raised are absent,
    so this is not always its index in :attr:`Group.runs`."""
    trajectory: Trajectory
    """What the run did: its calls, conversations (``trajectory.conversations()``: the main
    one, the agent's longest-running, first; then sub-agents and other histories),
    metadata."""
    reward: float
    """The run's own reward (from ``reward_fn``, the rollout's return value, or
    ``current_trajectory().reward``; 0.0 when it gave none); kept as ``independent_reward``."""

    @property
    def output(self) -> str | None:
        """The run's final answer: the text of the last turn of its main conversation, the
        agent's longest-running one (``None`` without one; not a planner's plan called first,
        nor an early turn of a conversation the agent edited as it went). The rollout's return
        value itself is not kept: it is neither journaled nor sent back by a Ray worker."""
        conversations = self.trajectory.conversations()
        for item in reversed(conversations[0].items if conversations else []):
            if isinstance(item, Turn):
                content = item.choice.message.get("content")
                return content if isinstance(content, str) else None
        return None


@dataclass(frozen=True, slots=True)
class Group[ExampleT]:
    """One example's finished runs of one step: what a group reward function scores."""

    example_id: str
    example: ExampleT
    step: int
    runs: tuple[GroupRun, ...]
    """The runs that finished with a reward, in rollout order: return one reward per run, in
    this order."""


@dataclass(frozen=True, slots=True)
class GroupRewards:
    """What a group reward function may return instead of a plain list of rewards."""

    rewards: Sequence[Reward]
    """One reward per run of :attr:`Group.runs`, in their order; with several policies, each
    may be one reward per policy (``{"planner": 1.0, "executor": 0.0}``)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Summed over the step's groups into the step's metrics (a judge's tokens and time)."""
    explanations: Sequence[str] | None = None
    """One per run, kept in the journal (``group_rewards.jsonl``) for reading."""


type GroupRewardFn[ExampleT] = Callable[
    [Group[ExampleT]],
    Sequence[Reward] | GroupRewards | Awaitable[Sequence[Reward] | GroupRewards],
]
"""``group_reward(group)``, sync or async: one reward per run of ``group.runs``."""

FIX = (
    "return one finite real number per run of group.runs, in their order (a list, or "
    "arttrace.GroupRewards(rewards=[...]))"
)


def check_group_reward(group_reward: object) -> None:
    """Refuse at construction what cannot be a group reward function."""
    if group_reward is not None and not callable(group_reward):
        raise ConfigurationError(
            "group_reward must be a function of one group (arttrace.Group) returning one "
            f"reward per run, such as arttrace.rewards.ruler(...); got "
            f"{type(group_reward).__name__} {group_reward!r:.80}"
        )


def own_reward(example: Any, output: Any) -> float:
    """The run's own reward when the Trainer has a ``group_reward`` and no ``reward_fn``:
    the reward the rollout set or returned, as without a group reward, else ``0.0`` (as
    ART's default reward): with a judge the rollout need not score itself, and may return
    its answer. Runs in the run's trajectory (the Trainer's ``reward_fn`` slot)."""
    if isinstance(output, Mapping):  # one reward per policy
        current_trajectory().policy_rewards = output
    was_set = current_trajectory().reward
    try:
        returned = None if output is None or isinstance(output, Mapping) else check_reward(output)
    except ConfigurationError:
        returned = None  # an answer, not a reward
    if was_set is not None and returned is not None and not math.isclose(was_set, returned):
        raise ConfigurationError(
            f"the rollout set current_trajectory().reward = {was_set!r} and returned "
            f"{returned!r}: give its own reward one way"
        )
    return was_set if was_set is not None else returned if returned is not None else 0.0


def uncaptured[R](function: Callable[[], R]) -> R:
    """``function()`` outside every run, with capture off: no trajectory, no ``@trainable``
    scope, and the mark every capture layer checks to let a call pass (``capturing``)."""
    _context.current_trajectory_var.set(None)
    _context.trainable_scopes.set(())
    _context.capturing.set(True)
    return function()


async def call_group_reward(fn: GroupRewardFn[Any], group: Group[Any]) -> Any:
    """``fn(group)`` in its own context with capture off: an async function in this task
    (a copy of the caller's context), a sync one in a worker thread (the event loop keeps the
    rollouts going)."""
    call: Any = getattr(fn, "__call__", None)  # noqa: B004  (a callable object's method)
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call):
        result = await asyncio.get_running_loop().create_task(_async_uncaptured(fn, group))
    else:
        result = await asyncio.to_thread(uncaptured, lambda: fn(group))
        if inspect.isawaitable(result):  # a lambda returning a coroutine
            result = await asyncio.get_running_loop().create_task(_await_uncaptured(result))
    return result


async def _async_uncaptured(fn: GroupRewardFn[Any], group: Group[Any]) -> Any:
    result: Any = uncaptured(lambda: fn(group))
    return await result


async def _await_uncaptured(awaitable: Awaitable[Any]) -> Any:
    return await uncaptured(lambda: awaitable)


def check_result(result: object, group: Group[Any]) -> GroupRewards:
    """The group reward's answer as :class:`GroupRewards`, or a ``ConfigurationError`` naming
    the example, what was wrong and how to fix it."""
    where = f"group_reward for example {group.example_id!r} (step {group.step})"
    answer = result if isinstance(result, GroupRewards) else GroupRewards(result)  # type: ignore[arg-type]
    if not _listlike(answer.rewards):
        raise ConfigurationError(
            f"{where} returned {type(answer.rewards).__name__} {answer.rewards!r:.80}: {FIX}"
        )
    answer = GroupRewards(list(answer.rewards), answer.metrics, answer.explanations)
    if len(answer.rewards) != len(group.runs):
        raise ConfigurationError(
            f"{where} returned {len(answer.rewards)} rewards for the group's "
            f"{len(group.runs)} runs: {FIX}"
        )
    rewards: list[Reward] = []
    for run, value in zip(group.runs, answer.rewards, strict=True):
        try:
            rewards.append(
                check_policy_rewards(value) if isinstance(value, Mapping) else check_reward(value)
            )
        except ConfigurationError as error:
            raise ConfigurationError(
                f"{where}: the reward of run {run.rollout} is not a reward ({error}): {FIX}"
            ) from None
    metrics = {}
    for name, value in answer.metrics.items():
        if (
            not isinstance(name, str)
            or isinstance(value, bool)
            or not isinstance(value, int | float)
        ):
            raise ConfigurationError(
                f"{where} returned the metric {name!r} = {value!r:.80}: a metric is a name "
                "(str) and a number (int or float)"
            )
        metrics[name] = float(value)
    explanations = None
    if answer.explanations is not None:
        explanations = [str(e) for e in answer.explanations]
        if len(explanations) != len(group.runs):
            raise ConfigurationError(
                f"{where} returned {len(explanations)} explanations for the group's "
                f"{len(group.runs)} runs: give one per run, or none"
            )
    return GroupRewards(rewards, metrics, explanations)


def _listlike(value: object) -> bool:
    """A list, tuple, numpy array, ...: not a string, a mapping or a lone number."""
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def apply(runs: Sequence[Trajectory], rewards: Sequence[Reward]) -> None:
    """Give each run its group reward (or one per policy), keeping its own as
    ``independent_reward`` (and each policy's as ``independent_reward/<policy>``, which
    becomes that policy's trajectory's ``independent_reward``)."""
    for t, reward in zip(runs, rewards, strict=True):
        own = t.reward
        if own is not None and "independent_reward" not in t.metrics:
            t.metrics["independent_reward"] = own
            for policy, value in t.policy_rewards.items():
                t.metrics[f"independent_reward/{policy}"] = value
        if isinstance(reward, Mapping):
            t.policy_rewards = reward
        else:
            t.policy_rewards = {}
            t.reward = reward


def _judgeable(t: Trajectory) -> bool:
    return t.exception is None and t.reward is not None


def _fingerprint(runs: Mapping[int, Trajectory]) -> list[list[Any]]:
    """The judged runs, by rollout number and start time: a run run again (a step set
    aside and run anew) starts at another time, so its old judgment does not apply."""
    return [[k, t.started_at] for k, t in sorted(runs.items())]


class GroupJudging[ExampleT]:
    """The group rewards of one step's collect: each group judged once all its runs are in,
    its judgment journaled; the journaled ones applied without calling the judge."""

    def __init__(
        self,
        fn: GroupRewardFn[ExampleT],
        journal: Journal,
        step: int,
        group_size: int,
        examples: Mapping[int, tuple[str, ExampleT]],
        finished: Mapping[Slot, Trajectory],
    ) -> None:
        self.fn, self.journal, self.step, self.group_size = fn, journal, step, group_size
        self.examples = examples
        """Position in the batch -> (example id, example)."""
        self.path = journal.step_dir(step) / "group_rewards.jsonl"
        self._runs: dict[int, dict[int, Trajectory]] = {pos: {} for pos in examples}
        self._tasks: list[asyncio.Task[None]] = []
        self.metrics: dict[str, float] = {
            "groups_judged": 0.0,
            "groups_judge_failed": 0.0,
            "group_reward_seconds": 0.0,
        }
        self._journaled = self._read()
        for (pos, k), t in finished.items():
            self._add(pos, k, t)

    def _read(self) -> dict[int, dict[str, Any]]:
        """The last journaled judgment of each group (a later line replaces an earlier)."""
        out: dict[int, dict[str, Any]] = {}
        for _, record in read_lines(self.path):
            group = record.get("group")
            if isinstance(group, int) and "rewards" in record:
                out[group] = record
        return out

    def done(self, slot: Slot, t: Trajectory) -> Trajectory:
        """A run of the step has finished and is journaled (``t`` as the journal holds it):
        judge its group if it was the group's last."""
        self._add(*slot, t)
        return t

    def _add(self, pos: int, k: int, t: Trajectory) -> None:
        runs = self._runs[pos]
        runs[k] = t
        if len(runs) < self.group_size:
            return
        judged = {k: t for k, t in runs.items() if _judgeable(t)}
        if len(judged) < 2:
            return  # nothing to compare: the group keeps its own rewards (it has no spread)
        record = self._journaled.get(pos)
        if record is not None and record.get("runs") == _fingerprint(judged):
            apply([judged[k] for k in sorted(judged)], record["rewards"])
            self._count(record.get("metrics") or {}, record.get("seconds", 0.0))
            return
        self._tasks.append(asyncio.ensure_future(self._judge(pos, judged)))

    def _count(self, metrics: Mapping[str, float], seconds: float, failed: bool = False) -> None:
        self.metrics["groups_judge_failed" if failed else "groups_judged"] += 1
        self.metrics["group_reward_seconds"] += seconds
        for name, value in metrics.items():
            self.metrics[name] = self.metrics.get(name, 0.0) + value

    async def _judge(self, pos: int, judged: dict[int, Trajectory]) -> None:
        example_id, example = self.examples[pos]
        runs = [judged[k] for k in sorted(judged)]
        group = Group(
            example_id,
            example,
            self.step,
            tuple(GroupRun(k, t, t.reward or 0.0) for k, t in sorted(judged.items())),
        )
        started = time.perf_counter()
        try:
            answer = check_result(await call_group_reward(self.fn, group), group)
        except Exception as error:
            self._failed(pos, example_id, runs, error, time.perf_counter() - started)
            return
        seconds = time.perf_counter() - started
        append_line(
            self.path,
            {
                "group": pos,
                "example_id": example_id,
                "runs": _fingerprint(judged),
                "rewards": answer.rewards,
                "metrics": dict(answer.metrics),
                "explanations": answer.explanations,
                "seconds": seconds,
            },
        )
        apply(runs, answer.rewards)
        self._count(answer.metrics, seconds)

    def _failed(
        self,
        pos: int,
        example_id: str,
        runs: list[Trajectory],
        error: Exception,
        seconds: float,
    ) -> None:
        """The group's runs fail with the cause; journaled for reading (not for resume)."""
        message = str(error)
        if not message.startswith("group_reward"):
            message = (
                f"group_reward for example {example_id!r} (step {self.step}) raised "
                f"{type(error).__qualname__}: {message}. Fix the judge (its server, its "
                "model, its answer), then resume=True judges the group again"
            )
        cause = {
            "type": type(error).__qualname__,
            "message": message,
            "traceback": "".join(traceback.format_exception(error)),
        }
        for t in runs:
            t.exception = dict(cause)
        spent = getattr(error, "metrics", None)
        self._count(spent if isinstance(spent, Mapping) else {}, seconds, failed=True)
        append_line(
            self.path,
            {"group": pos, "example_id": example_id, "error": cause, "seconds": seconds},
        )
        _log.warning(
            "arttrace: step %d: %s; its %d runs count as raised under max_exceptions",
            self.step,
            message,
            len(runs),
        )

    async def wait(self) -> dict[str, float]:
        """Every group judged (or failed): the step's group-reward metrics."""
        while self._tasks:
            tasks, self._tasks = self._tasks, []
            await asyncio.gather(*tasks)
        return self.metrics

    async def cancel(self) -> None:
        """Stop the judgments in flight (they are not journaled: a resume judges again)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def independent_stats(runs: Collection[Trajectory]) -> dict[str, float]:
    """The mean of the judged runs' own rewards (NaN when none was judged)."""
    own = [
        float(r)
        for t in runs
        if t.exception is None and isinstance(r := t.metrics.get("independent_reward"), int | float)
    ]
    return {"independent_reward_mean": math.fsum(own) / len(own) if own else math.nan}
