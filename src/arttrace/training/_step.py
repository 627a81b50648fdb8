"""One GRPO step: run the batch's rollouts, journal them, group them by example, drop the
groups that teach nothing, ship the rest, record the step."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import TrainingError
from .._journal import Journal, Slot, WhyNot, advantages
from ..capture._continuity import step_continuity, warn_continuity
from ..capture._trajectory import Trajectory
from ..capture._warnings import NothingToTrainWarning, warn_every_time
from ._group import GroupJudging, independent_stats
from ._policy import Policy
from ._report import Progress, reward_stats, untrainable_cause
from ._resume import check_journaled
from ._ship import ship

if TYPE_CHECKING:
    import art  # imported in the background while the rollouts run (_art_import)

    from ._trainer import Trainer


@dataclass
class StepResult:
    step: int
    """The step number (0-based): how many steps had completed before this one."""
    epoch: int
    metrics: dict[str, float]
    groups: list[art.TrajectoryGroup] = field(repr=False)
    """The groups shipped to the backend (empty when no group had learning signal, and in
    the results of :meth:`Trainer.train`)."""
    train_result: art.TrainResult | None = None
    trainable_tokens: dict[str, int] = field(default_factory=dict)
    """Sampled tokens ART trains on in each group with learning signal, by example id (0: the
    group did not ship; see :class:`~arttrace.NothingToTrainWarning`); with several policies,
    by ``<policy>/<example id>``."""
    policy_groups: dict[str, list[art.TrajectoryGroup]] = field(default_factory=dict, repr=False)
    """With several policies: the groups shipped to each, by policy name."""
    train_results: dict[str, art.TrainResult | None] = field(default_factory=dict)
    """With several policies: each policy's ``backend.train`` result (``None``: it shipped
    nothing this step, or had already trained these groups)."""


@dataclass
class Collected:
    """A step's rollouts, all finished and journaled (:func:`collect`), ready to ship."""

    step: int
    epoch: int
    indices: list[int]
    runs: dict[Slot, Trajectory]
    seconds: float
    """Time from the first rollout's start to the last one's end (and its group's judgment,
    with a ``group_reward``)."""
    judged: dict[str, float] = field(default_factory=dict)
    """The group rewards' metrics (:class:`~._group.GroupJudging`), for the step's."""


async def run_step[ExampleT](trainer: Trainer[ExampleT]) -> StepResult:
    """Run step ``trainer.completed_steps`` and ship it; see the Trainer's docstring."""
    return await finish(trainer, await collect(trainer, trainer.completed_steps))


async def collect[ExampleT](trainer: Trainer[ExampleT], step: int) -> Collected:
    """Run the rollouts of ``step`` that the journal does not hold yet, journaling each as it
    finishes, and read back the ones it does."""
    config, schedule, journal = trainer.config, trainer._schedule, trainer._journal
    epoch, indices = schedule.batch(step)
    started = time.perf_counter()
    # runs read back are assigned too: the journal may hold runs this Trainer did not record
    # (a gateway's, opened over HTTP), whose turns name no policy yet
    finished = {slot: trainer._assign(t) for slot, t in journal.finished(step).items()}
    slots = {
        (pos, k): (schedule.example_id(schedule.dataset[i], i, "train"), schedule.dataset[i])
        for pos, i in enumerate(indices)
        for k in range(config.group_size)
    }
    check_journaled(journal, step, finished, {slot: v[0] for slot, v in slots.items()})
    judging = (
        None
        if trainer._group_reward is None
        else GroupJudging(
            trainer._group_reward,
            journal,
            step,
            config.group_size,
            {pos: slots[(pos, 0)] for pos in range(len(indices))},
            finished,
        )
    )

    def on_done(slot: Slot, t: Trajectory) -> Trajectory:
        t = journal.record(step, slot, trainer._assign(t))  # what ships is on disk
        return t if judging is None else judging.done(slot, t)  # its group judged when full

    try:
        await run_rollouts(
            {s: v for s, v in slots.items() if s not in finished},
            lambda slot, example_id, example: trainer._run_one(
                example_id, example, "train", step, slot[1]
            ),
            bar=trainer._reporter.bar(
                "train", step, len(slots) - len(finished), [t.reward for t in finished.values()]
            ),
            done=finished,
            on_done=on_done,
        )
        judged = {} if judging is None else await judging.wait()
    finally:
        if judging is not None:
            await judging.cancel()
        journal.close(step)
    if judging is not None:
        judged.update(independent_stats(finished.values()))
    return Collected(step, epoch, indices, finished, time.perf_counter() - started, judged)


async def finish[ExampleT](
    trainer: Trainer[ExampleT],
    collected: Collected,
    waits: Callable[[], dict[str, float]] | None = None,
) -> StepResult:
    """Group the step's runs, drop what teaches nothing, ship the rest, record the step.
    ``waits``: the pipeline's, read once the step has trained, added to its metrics. With
    several policies, each gets its own groups, shipped to its own model."""
    config, schedule, journal = trainer.config, trainer._schedule, trainer._journal
    step, epoch, indices, finished = (
        collected.step,
        collected.epoch,
        collected.indices,
        collected.runs,
    )
    assert step == trainer.completed_steps, "steps ship in order"
    await trainer._models.get()  # ART has loaded (in the background) and the model is built
    from ..capture._art import trainable_tokens

    schedule.start_epoch(epoch)
    limit = config.max_steps_off_policy
    parts = [_Part(policy) for policy in _trained(trainer)]
    for part in parts:
        key, now = part.clock(trainer, step)
        part.stale = stale_runs(finished, now, limit, key)
        if part.stale:
            _stale(step, part, finished, limit, journal, now)
    with _gc_paused():
        for part in parts:
            part.groups, part.failures = build_groups(
                trainer, indices, finished, part.stale, part.policy
            )
    failed = sum(parts[0].failures)
    if failed > config.allowed_exceptions(len(finished)):
        raise TrainingError(
            f"step {step}: {failed} of {len(finished)} rollouts raised (max_exceptions="
            f"{config.max_exceptions!r}); {most_common_cause(finished.values())}. Every "
            f"exception and its traceback is in {journal.rollouts_path(step)}"
            + (
                f" (a group reward's, in {journal.step_dir(step) / 'group_rewards.jsonl'})"
                if collected.judged.get("groups_judge_failed")
                else ""
            )
        )
    for part in parts:
        groups = part.groups
        part.signal = [
            pos
            for pos, g in enumerate(groups)
            if _spread(g) > 0 and _spread(g) >= config.min_reward_spread
        ]
        part.tokens = {
            pos: sum(trainable_tokens(t) for t in groups[pos].trajectories) for pos in part.signal
        }
        part.empty = [pos for pos in part.signal if part.tokens[pos] == 0]
    left = any(len(part.empty) < len(part.signal) for part in parts)
    for part in parts:
        if part.empty:
            _nothing_to_train(step, part, finished, journal, config.group_size, fatal=not left)
        part.shipped, part.excluded = schedule.select(
            [part.groups[pos] for pos in part.signal if part.tokens[pos]]
        )

    train_started = time.perf_counter()
    if not journal.shipped(step):
        await _ship_all(trainer, step, parts)
    train_seconds = time.perf_counter() - train_started

    several = trainer._policies is not None
    shipped = [g for part in parts for g in part.shipped]
    stale = set.intersection(*(part.stale for part in parts))  # left out of every group
    rewards = [t.reward for slot, t in finished.items() if _grouped(t, slot, stale)]
    metrics: dict[str, float] = {
        "step": step,
        "epoch": epoch,
        **reward_stats([r for r in rewards if r is not None]),
        **_sums(parts),
        "trajectories_scored": len(rewards),
        "exceptions": failed,
        "rollout_seconds": collected.seconds,
        "train_seconds": train_seconds,
        **off_policy((t for slot, t in finished.items() if slot not in stale), step),
        "runs_stale_dropped": len(stale),
        **collected.judged,
        **(waits() if waits else _synchronous_waits(collected.seconds, train_seconds)),
        **step_continuity(shipped),
    }
    for part in parts if several else []:
        own = [t.reward for g in part.groups for t in g.trajectories]
        key, now = part.clock(trainer, step)
        lags = off_policy((t for s, t in finished.items() if s not in part.stale), now, key)
        figures = reward_stats(own) | _sums([part]) | lags
        metrics |= {part.name(k): v for k, v in figures.items()}
        metrics[part.name("runs_stale_dropped")] = len(part.stale)
    warn_continuity(step, metrics, trainer.config.continuity_warn_rate)
    if schedule.curriculum is not None:
        metrics["curriculum_percentile"] = schedule.curriculum.percentile
    for part in parts:
        metrics |= part.train_metrics
    per_group = {
        part.name(str(part.groups[pos].metadata["example_id"])): part.tokens[pos]
        for part in parts
        for pos in part.signal
    }
    ranked = parts[0].shipped + parts[0].excluded if schedule.curriculum is not None else []
    journal.mark_shipped(
        step,
        {
            "groups": len(shipped),
            "metrics": metrics,
            "trainable_tokens": per_group,
            "decisions": [
                {**d, **({"policy": part.policy.key} if part.policy else {})}
                for part in parts
                for d in decisions(
                    part.groups, finished, part.stale, part.tokens, part.shipped, ranked
                )
            ],
        },
    )
    trainer.completed_steps = step + 1
    for part in parts:
        if part.policy and part.shipped:  # it trained (now, or before a resume)
            trainer._policy_steps[part.policy.key] += 1
    journal.save_state(
        {
            "completed_steps": trainer.completed_steps,
            **({"curriculum": schedule.curriculum.state()} if schedule.curriculum else {}),
            **({"policy_steps": trainer._policy_steps} if several else {}),
        }
    )
    return StepResult(
        step,
        epoch,
        metrics,
        shipped,
        parts[0].train_result if not several else None,
        per_group,
        {part.policy.key: part.shipped for part in parts if part.policy},
        {part.policy.key: part.train_result for part in parts if part.policy},
    )


@dataclass
class _Part:
    """One policy's share of a step (``policy`` ``None``: the one model's)."""

    policy: Policy | None
    groups: list[art.TrajectoryGroup] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    stale: set[Slot] = field(default_factory=set)
    """The runs left out of its groups: sampled from it more than ``max_steps_off_policy``
    of its trainings ago."""
    signal: list[int] = field(default_factory=list)
    """The positions of the groups with learning signal."""
    tokens: dict[int, int] = field(default_factory=dict)
    """Trainable tokens of each group with learning signal, by position."""
    empty: list[int] = field(default_factory=list)
    shipped: list[art.TrajectoryGroup] = field(default_factory=list)
    excluded: list[art.TrajectoryGroup] = field(default_factory=list)
    train_result: art.TrainResult | None = None
    train_metrics: dict[str, float] = field(default_factory=dict)

    def shipped_tokens(self) -> int:
        """The trainable tokens of its shipped groups (counted once, in ``tokens``)."""
        kept = {id(g) for g in self.shipped}
        return sum(n for pos, n in self.tokens.items() if id(self.groups[pos]) in kept)

    def name(self, metric: str) -> str:
        """``metric`` as this policy's (``planner/train/loss``; unchanged for one model)."""
        return f"{self.policy.key}/{metric}" if self.policy else metric

    def clock(self, trainer: Trainer[Any], step: int) -> tuple[str, int]:
        """The metadata key a run records the policy it sampled from under, and how many
        times the policy has trained: ``("policy_step", step)`` for one model; a policy of
        several counts its own trainings (a step it had nothing to ship left it as it was)."""
        if self.policy is None:
            return "policy_step", step
        return policy_step_key(self.policy.key), trainer._policy_steps[self.policy.key]


def _trained(trainer: Trainer[Any]) -> list[Policy | None]:
    """The policies the step ships (``[None]``: the Trainer's one model)."""
    if trainer._policies is None:
        return [None]
    return [p for p in trainer._policies if not p.frozen]


def _sums(parts: list[_Part]) -> dict[str, float]:
    """What happened to the groups of ``parts``, summed (tokens: the counts ``finish`` made
    of each group with learning signal, of which the shipped groups are some)."""
    return {
        "groups_total": sum(len(p.groups) for p in parts),
        "groups_kept": sum(len(p.shipped) for p in parts),
        "groups_dropped": sum(len(p.groups) - len(p.signal) for p in parts),
        "groups_excluded_by_curriculum": sum(len(p.excluded) for p in parts),
        "trainable_tokens": sum(p.shipped_tokens() for p in parts),
        "trainable_tokens_group_min": min(
            (n for p in parts for n in p.tokens.values()), default=math.nan
        ),
        "groups_without_trainable_tokens": sum(len(p.empty) for p in parts),
    }


async def _ship_all(trainer: Trainer[Any], step: int, parts: list[_Part]) -> None:
    """Ship each part's groups to its model, exactly once per policy: policies on different
    backends concurrently, those sharing one in turn. A policy that trained is recorded at
    once (``trained-<policy>.json``), so a step stopped or failed between two policies'
    training ships only the missing ones when resumed."""
    journal, config = trainer._journal, trainer.config
    by_backend: dict[int, list[_Part]] = {}
    for part in parts:
        if part.shipped:
            backend = (part.policy and part.policy.backend) or trainer.backend
            by_backend.setdefault(id(backend), []).append(part)

    async def one(part: _Part) -> None:
        if part.policy is None:
            part.train_result = await ship(
                trainer.backend, trainer.model, step, part.shipped, config, journal
            )
            if part.train_result is not None:
                part.train_metrics = trainer._reporter.train_metrics(
                    step, part.train_result.metrics
                )
            return
        key = part.policy.key
        done = journal.trained(step, key)
        if done is not None:
            part.train_metrics = done
            return
        backend = part.policy.backend or trainer.backend
        part.train_result = await ship(
            backend, part.policy.model, step, part.shipped, config, journal, policy=key
        )
        if part.train_result is not None:
            metrics = trainer._reporter.train_metrics(step, part.train_result.metrics)
            part.train_metrics = {f"{key}/{k}": v for k, v in metrics.items()}
        journal.mark_trained(step, key, part.train_metrics)

    async def in_turn(parts: list[_Part]) -> None:
        for part in parts:
            await one(part)

    results = await asyncio.gather(
        *(in_turn(parts) for parts in by_backend.values()), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _nothing_to_train(
    step: int,
    part: _Part,
    runs: dict[Slot, Trajectory],
    journal: Journal,
    group_size: int,
    *,
    fatal: bool,
) -> None:
    """Never silent: groups with learning signal but no trainable token are not shipped, with
    one warning for the step (and policy) naming the cause and its fix. When no group of any
    policy is left (``fatal``), the step fails: every step would do the same until the
    capture is fixed, and each costs its rollouts. Its rollouts are set aside (kept for
    reading), so that ``resume=True`` runs the step again once the cause is fixed instead of
    reading back runs with nothing to train."""
    cause = untrainable_cause(
        (runs[(pos, k)] for pos in part.empty for k in range(group_size)),
        None if part.policy is None else part.policy.key,
    )
    whose = "" if part.policy is None else f"policy {part.policy.key!r}: "
    what = f"{whose}{len(part.empty)} of the {len(part.signal)} groups with learning signal"
    if not fatal:
        warn_every_time(
            f"arttrace: step {step}: {what} hold no trainable token (no policy turn ART can "
            f"train on) and are not shipped; {cause}",
            NothingToTrainWarning,
        )
        return
    path = journal.rollouts_path(step)
    kept = path.with_name("rollouts-nothing-to-train.jsonl")
    if path.exists():
        path.replace(kept)
    raise TrainingError(
        f"step {step}: {what} hold no trainable token, so the step would train on nothing; "
        f"{cause} The step's runs are kept in {kept}; fix the cause, then run again with "
        "resume=True to run the step again"
    )


async def run_rollouts[ExampleT](
    slots: dict[Slot, tuple[str, ExampleT]],
    run: Callable[[Slot, str, ExampleT], Awaitable[Trajectory]],
    *,
    bar: Progress,
    done: dict[Slot, Trajectory],
    on_done: Callable[[Slot, Trajectory], Trajectory] | None = None,
) -> None:
    """Run the rollouts of ``slots`` concurrently (the executor bounds how many are in
    flight), filling ``done`` (with what ``on_done`` returns for each finished run, if
    given: the run as journaled). Cancelled, it cancels the runs in flight, then re-raises."""

    async def one(slot: Slot, example_id: str, example: ExampleT) -> None:
        t = await run(slot, example_id, example)
        done[slot] = t if on_done is None else on_done(slot, t)
        bar.update(t.reward)

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


def build_groups(
    trainer: Trainer[Any],
    indices: list[int],
    done: dict[Slot, Trajectory],
    left_out: Collection[Slot] = (),
    policy: Policy | None = None,
) -> tuple[list[art.TrajectoryGroup], list[int]]:
    """One group per example (of ``policy``'s trajectories, when the Trainer has several),
    and the number of its runs that raised. Runs are converted to ART here, once all have
    finished: an ART trajectory is ~600 small objects, and holding a step's worth of them
    through the rollouts made every full garbage collection in between walk them all."""
    import art  # loaded: finish() waited for it
    from art.trajectories import PydanticException

    schedule, group_size = trainer._schedule, trainer.config.group_size
    groups, failures = [], []
    for pos, index in enumerate(indices):
        slots = [(pos, k) for k in range(group_size)]
        ok = [_to_art(trainer, done[s], policy) for s in slots if _grouped(done[s], s, left_out)]
        exceptions = [PydanticException(**error) for s in slots if (error := done[s].exception)]
        example_id = schedule.example_id(schedule.dataset[index], index, "train")
        groups.append(
            art.TrajectoryGroup(ok, exceptions=exceptions, metadata={"example_id": example_id})
        )
        failures.append(len(exceptions))
    return groups, failures


def _to_art(trainer: Trainer[Any], run: Trajectory, policy: Policy | None) -> art.Trajectory:
    """``run`` as ART trains it: as ``policy`` sees it (its own turns trainable, its own
    reward and ``independent_reward``), or whole for the Trainer's one model."""
    if policy is None:
        return run.to_art(trainer._continuity_tokenizer)
    key = policy.key
    converted = run.to_art(trainer._tokenizers[key], policy=key)
    converted.reward = run.reward_for(key) or 0.0
    own = converted.metrics.pop(f"independent_reward/{key}", None)
    for name in [m for m in converted.metrics if m.startswith("independent_reward/")]:
        del converted.metrics[name]
    if own is not None:
        converted.metrics["independent_reward"] = own
    return converted


def _grouped(run: Trajectory, slot: Slot, left_out: Collection[Slot]) -> bool:
    """Whether ``run`` joins its group: it did not raise, has a reward and is not left out."""
    return run.exception is None and run.reward is not None and slot not in left_out


def decisions(
    groups: list[art.TrajectoryGroup],
    runs: dict[Slot, Trajectory],
    left_out: Collection[Slot],
    tokens: dict[int, int],
    shipped: list[art.TrajectoryGroup],
    ranked: list[art.TrajectoryGroup],
) -> list[dict[str, Any]]:
    """What was decided for each group, by position, for the step's record (``_journal``):
    why it did not ship (``None``: it did), its runs' advantages, its rank in ``ranked`` (the
    curriculum's order). ``tokens``: the trainable tokens of each group with learning signal."""
    kept, rank = {id(g) for g in shipped}, {id(g): r for r, g in enumerate(ranked)}
    size = len(runs) // len(groups) if groups else 0
    out = []
    for pos, group in enumerate(groups):
        scored = len(group.trajectories)
        why: WhyNot | None = None
        if pos not in tokens:  # no learning signal
            flat: WhyNot = "flat" if not _spread(group) else "below_min_spread"
            why = "failed" if scored < min(2, size) else flat
        elif not tokens[pos]:
            why = "no_trainable_token"
        elif id(group) not in kept:
            why = "curriculum"
        found = iter(advantages([t.reward for t in group.trajectories]))
        out.append(
            {
                "example_id": str(group.metadata["example_id"]),
                "why_not": why,
                "advantages": [
                    next(found) if _grouped(runs[(pos, k)], (pos, k), left_out) else None
                    for k in range(size)
                ],
                "rank": rank.get(id(group)),
            }
        )
    return out


def _synchronous_waits(rollout_seconds: float, train_seconds: float) -> dict[str, float]:
    """A step run alone: the trainer waited for all of its rollouts, then they for it."""
    return {"trainer_wait_seconds": rollout_seconds, "rollout_wait_seconds": train_seconds}


def policy_step_key(policy: str) -> str:
    """Where a run records how many times ``policy`` (one of several) had trained when it
    started (the metadata ``policy_step`` is the Trainer's steps)."""
    return f"policy_step/{policy}"


def off_policy(runs: Iterable[Trajectory], now: int, key: str = "policy_step") -> dict[str, float]:
    """How many trainings behind ``now`` the policies the runs sampled from are, by their
    metadata ``key`` (runs journaled without it, by an arttrace before it, are left out)."""
    lags = [now - p for t in runs if isinstance(p := t.metadata.get(key), int)]
    return {
        "off_policy_steps_mean": math.fsum(lags) / len(lags) if lags else math.nan,
        "off_policy_steps_max": max(lags, default=math.nan),
    }


def stale_runs(
    runs: dict[Slot, Trajectory], now: int, limit: int, key: str = "policy_step"
) -> set[Slot]:
    """The runs that sampled from a policy more than ``limit`` trainings behind ``now``."""
    return {
        slot
        for slot, t in runs.items()
        if isinstance(p := t.metadata.get(key), int) and now - p > limit
    }


def _stale(
    step: int, part: _Part, runs: dict[Slot, Trajectory], limit: int, journal: Journal, now: int
) -> None:
    """The one rule for runs older than ``max_steps_off_policy``: left out of their group
    (kept in the journal), said once per step (and policy). The Trainer never starts such a
    run; it is met when a run is resumed with a smaller ``max_steps_off_policy`` than it ran
    with."""
    key = "policy_step" if part.policy is None else policy_step_key(part.policy.key)
    oldest = max(now - p for slot in part.stale if isinstance(p := runs[slot].metadata[key], int))
    whose = "" if part.policy is None else f"policy {part.policy.key!r}: "
    stale = part.stale
    warn_every_time(
        f"arttrace: step {step}: {whose}{len(stale)} runs sampled from a policy more than "
        f"max_steps_off_policy={limit} steps old are left out of their groups, and the step "
        f"ships without them (they stay in {journal.rollouts_path(step)}). To train on runs "
        f"that old, resume with max_steps_off_policy={oldest} or more before a step ships",
        NothingToTrainWarning,
    )


def most_common_cause(runs: Iterable[Trajectory]) -> str:
    """The exception most runs raised, as ``most common cause (3 of 4): Type: message``."""
    causes = Counter((e["type"], e["message"]) for t in runs if (e := t.exception) is not None)
    if not causes:
        return "no run raised"
    ((kind, message), count), total = causes.most_common(1)[0], causes.total()
    message = message if len(message) <= 500 else message[:500] + "..."
    return f"most common cause ({count} of {total}): {kind}: {message}"


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
