"""The rollout actors and their pool.

A :class:`RolloutActor` runs one rollout at a time in a worker process of any node, with the
pickled rollout and ``reward_fn`` loaded once. The driver's :class:`Pool` hands out its actors
once they have started, in the order rollouts asked (a retry first), and replaces the ones that
die; :func:`capacity` says how many the cluster's live nodes can hold at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ray
from ray import cloudpickle

from ..capture import _context
from ..capture._trajectory import Trajectory
from ._frozen import FORMAT, freeze
from ._ray_pickling import load_error, load_message
from ._rollout import RolloutRunner

if TYPE_CHECKING:
    from ..capture._trajectory import MetadataValue

_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes

DriverCapture = tuple[bool, bool] | None
"""The driver's ``arttrace.instrument()`` settings (``request_training_data``,
``export_tokens``), or ``None``: capture off."""


def driver_capture() -> DriverCapture:
    """This process's capture settings, as an actor is told them (see :data:`DriverCapture`)."""
    current = _context.shim_settings()
    return None if current is None else (current.request_training_data, current.export_tokens)


# -- the worker side -------------------------------------------------------------------------


SentRunner = tuple[bytes, bytes | None, int, float | None]
"""The rollout runner as the actors are sent it: the pickled rollout and ``reward_fn``, the
Trainer's ``max_concurrency`` (threads for a sync rollout) and ``rollout_timeout``."""


class RolloutActor:
    """One rollout at a time, in a worker process of any node, with the pickled rollout and
    ``reward_fn`` loaded once. A piece that cannot be loaded here is reported by
    :meth:`ready` (so :meth:`RayExecutor.bind` names it) and fails each rollout with that
    cause."""

    def __init__(self, sent: SentRunner) -> None:
        self.runner: RolloutRunner[Any] | None = None
        self.error: dict[str, Any] | None = None
        self.where = _where()
        self.load(sent)

    def load(self, sent: SentRunner) -> None:
        """Run this rollout from now on (a re-bound executor keeps its actors)."""
        rollout, reward_fn, max_concurrency, timeout = sent
        if self.runner is not None:
            self.runner.close()
        self.runner, self.error = None, None
        try:
            loaded = cloudpickle.loads(rollout)
        except Exception as error:
            self.error = load_error("the rollout", error)
            return
        try:
            score = None if reward_fn is None else cloudpickle.loads(reward_fn)
        except Exception as error:
            self.error = load_error("reward_fn", error)
            return
        self.runner = RolloutRunner(loaded, score, max_concurrency, timeout)

    def ready(self) -> dict[str, Any]:
        """This worker's frozen format, where it is, and why it cannot run rollouts (if so)."""
        return {"format": FORMAT, "error": self.error, "where": self.where}

    def check(self, examples: list[bytes]) -> tuple[int, dict[str, Any]] | None:
        """The first example that cannot be loaded here, and why."""
        for index, blob in enumerate(examples):
            try:
                cloudpickle.loads(blob)
            except Exception as error:
                return index, load_error(f"example {index}", error)
        return None

    async def run(
        self,
        example_id: str,
        example: Any,
        metadata: dict[str, MetadataValue],
        settings: DriverCapture,
    ) -> bytes:
        _instrument(settings)
        metadata = {**metadata, **self.where}
        if self.runner is None:
            assert self.error is not None
            message = load_message(**self.error)
            return freeze(failed(example_id, metadata, "ConfigurationError", message, ""))
        return freeze(await self.runner.run(example_id, example, metadata))


WHERE = ("node_id", "node_address", "worker_pid")
"""The metadata a run made on Ray gets: the node it ran on (Ray's id, and its address) and its
worker's process id. A run that failed because its worker died has those of its last try."""


def _where() -> dict[str, MetadataValue]:
    """This worker's place in the cluster (see :data:`WHERE`)."""
    context = ray.get_runtime_context()
    return dict(zip(WHERE, (context.get_node_id(), _node_address(), os.getpid()), strict=True))


def _node_address() -> str:
    return str(ray.util.get_node_ip_address())


def _instrument(settings: DriverCapture) -> None:
    """Capture as the driver has it (``instrument`` is idempotent; only a change calls it)."""
    from .._instrument import instrument, uninstrument

    if driver_capture() == settings:
        return
    if settings is None:
        uninstrument()
    else:
        instrument(request_training_data=settings[0], export_tokens=settings[1])


def failed(
    example_id: str,
    metadata: dict[str, MetadataValue],
    kind: str,
    message: str,
    trace: str,
    started: float | None = None,
) -> Trajectory:
    """A run that did not finish: the Trainer counts it under ``max_exceptions``."""
    t = Trajectory(example_id, metadata)
    t.exception = {"type": kind, "message": message, "traceback": trace}
    t.started_at, t.ended_at = started or time.time(), time.time()
    return t


# -- the driver side -------------------------------------------------------------------------


class Member:
    """One actor of the pool: starting (its ``ready`` call pending), idle, or busy."""

    __slots__ = ("actor", "loop", "ready", "state", "where")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.ready = actor.ready.remote()
        self.state = "starting"
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop watching ``ready`` (each ``asyncio.run`` has its own)."""
        self.where: dict[str, MetadataValue] = {}
        """Its worker's node and process (:data:`WHERE`), once it has started."""


_Queue = collections.deque[asyncio.Future[None]]


class PoolBroken(Exception):
    """No actor of the pool could start, time after time: the cause is the last failure."""


class Pool:
    """``size`` actors; a rollout takes an idle one and gives it back. An actor is handed out
    only once it has started: on a cluster too small for ``size`` of them, the ones that
    cannot be placed wait without holding up a rollout. A dead actor is replaced, unless
    actors keep dying before they start (a node that cannot run them): after ``size + 3``
    such deaths in a row, waiting rollouts fail with the last cause."""

    def __init__(self, actor_class: Any, size: int, sent: SentRunner) -> None:
        self._actor_class = actor_class
        self.sent = sent
        """What the actors run (a replacement is started with it)."""
        self.members = [Member(actor_class.remote(sent)) for _ in range(size)]
        self._idle: list[Member] = []
        self._waiting: tuple[asyncio.AbstractEventLoop, _Queue, _Queue] | None = None
        """The rollouts waiting for an actor, in order, on the loop they wait in: retries of
        rollouts whose worker died first, then the others."""
        self._watchers: set[asyncio.Task[None]] = set()
        self.closed = False
        self._failed_starts = 0
        self.broken: BaseException | None = None

    async def acquire(self, retry: bool = False) -> Member:
        """An idle actor; rollouts waiting for one get them in the order they came, a
        ``retry`` (a rollout whose worker died) before every rollout that is not one: it
        holds up its step, which the rollouts queued behind it may not."""
        loop = asyncio.get_running_loop()
        if self._waiting is None or self._waiting[0] is not loop:
            self._waiting = loop, collections.deque(), collections.deque()
        _, retries, others = self._waiting
        waiting, first = (retries if retry else others), False
        while True:
            if self.closed:
                raise RuntimeError("the RayExecutor was closed")
            if self.broken is not None:
                raise PoolBroken() from self.broken
            if self._idle:
                member = self._idle.pop()
                member.state = "busy"
                return member
            for member in self.members:
                if member.state == "starting" and member.loop is not loop:
                    member.loop = loop
                    task = loop.create_task(self._watch(member))
                    self._watchers.add(task)
                    task.add_done_callback(self._watchers.discard)
            turn = loop.create_future()
            if first:  # woken, but another took the actor: still first in line
                waiting.appendleft(turn)
            else:
                waiting.append(turn)
            try:
                await turn
            finally:
                if turn in waiting:  # cancelled while waiting
                    waiting.remove(turn)
            first = True

    def release(self, member: Member) -> None:
        if member.state != "busy":
            return
        member.state = "idle"
        self._idle.append(member)
        self._notify()

    def lost(self, member: Member) -> None:
        """``member``'s actor died: kill what is left of it and start another."""
        if member.state == "dead":
            return
        member.state = "dead"
        if member in self._idle:
            self._idle.remove(member)
        _kill(member.actor)
        if member in self.members and not self.closed and self.broken is None:
            replacement = Member(self._actor_class.remote(self.sent))
            self.members[self.members.index(member)] = replacement
        self._notify()

    def reload(self, sent: SentRunner) -> None:
        """Run another rollout in the same actors (no process is started); each actor is
        handed out again once it has loaded it."""
        self.sent = sent
        self._idle.clear()
        for member in self.members:
            member.actor.load.remote(sent)  # a call runs after the ones before it
            member.ready = member.actor.ready.remote()
            member.state, member.loop = "starting", None

    async def _watch(self, member: Member) -> None:
        ready = member.ready
        try:
            info = await ready
        except Exception as error:
            if member.ready is ready:
                self._failed_starts += 1
                if self._failed_starts >= len(self.members) + 3:
                    self.broken = error
                self.lost(member)
                if self.broken is not None:
                    self._notify(everyone=True)
            return
        if member.state == "starting" and member.ready is ready:
            self._failed_starts = 0
            self.started(member, info)

    def started(self, member: Member, info: dict[str, Any]) -> None:
        """``member`` has started (``info``: what its ``ready`` said): it is handed out."""
        member.where = dict(info.get("where") or {})
        member.state = "idle"
        self._idle.append(member)
        self._notify()

    def _notify(self, everyone: bool = False) -> None:
        """Wake the first rollout waiting for an actor (``everyone``: all of them, to see the
        pool closed or broken). One actor freed wakes one rollout, not every one queued."""
        if self._waiting is None:
            return
        loop, retries, others = self._waiting
        try:
            if asyncio.get_running_loop() is not loop:
                return
        except RuntimeError:  # no loop running (close, from a plain call)
            return
        for waiting in (retries, others):
            while waiting:
                turn = waiting.popleft()
                if not turn.done():
                    turn.set_result(None)
                    if not everyone:
                        return

    def close(self) -> None:
        self.closed = True
        for member in self.members:
            _kill(member.actor)
        self._notify(everyone=True)


def _kill(actor: Any) -> None:
    with contextlib.suppress(Exception):  # already dead, or the cluster is gone
        ray.kill(actor, no_restart=True)


# -- what the cluster can hold ---------------------------------------------------------------


def capacity(request: Mapping[str, float]) -> int | None:
    """How many rollout actors, each holding ``request``, the cluster's live nodes can hold at
    once (``None``: no limit, a rollout holds nothing)."""
    if not request:
        return None
    return sum(
        min(math.floor(float(have.get(k, 0)) / v + 1e-9) for k, v in request.items())
        for have in _live_resources()
    )


def placeable(request: Mapping[str, float]) -> bool:
    """Whether a node of the cluster as it is now could ever hold one rollout actor."""
    return any(all(have.get(k, 0) >= v for k, v in request.items()) for have in _live_resources())


def cluster_resources() -> str:
    """What the cluster's live nodes have, all together."""
    totals: dict[str, float] = {}
    for have in _live_resources():
        for k, v in _shown(have).items():
            totals[k] = totals.get(k, 0) + v
    return _resources(totals) or "nothing"


def node_resources() -> str:
    """What each of the cluster's live nodes has."""
    return "; ".join(_resources(_shown(r)) for r in _live_resources()) or "nothing"


def _live_resources() -> list[dict[str, float]]:
    """The resources of each live node of the cluster."""
    return [node["Resources"] for node in _nodes() if node.get("Alive")]


def _shown(resources: Mapping[str, float]) -> dict[str, float]:
    """What a user asks a rollout for (not Ray's per-node and memory entries)."""
    return {
        k: v
        for k, v in resources.items()
        if "node:" not in k and k not in ("memory", "object_store_memory")
    }


def _resources(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items()))
