"""Rollouts on a Ray cluster: a pool of actors, each running one rollout at a time.

Why actors and not tasks: an actor unpickles the rollout and ``reward_fn`` and instruments
capture once, then keeps one event loop for every rollout it runs, so an agent's async
clients (bound to the loop they first ran on) keep working from one rollout to the next; a
task pays that setup per rollout, or caches it per worker process and still starts an event
loop per call. Per rollout of a trivial agent on a 2-node local cluster (2 cores): actors
p50 2.3 ms, p99 6.6 ms; tasks with the runner cached per process p50 3.5 ms, p99 7.3 ms;
in-process 0.01 ms. Either is small next to one LLM call.

Faults: an actor whose process or node dies mid-rollout is replaced, and the rollout runs
again on another actor (``max_retries`` times, each retry logged). Ray never retries a
rollout by itself (``max_restarts=0``, ``max_task_retries=0``), so a rollout runs at most
``1 + max_retries`` times and comes back once: finished, or with the cause on
``Trajectory.exception``.

This module is the executor (binding, retries, the connection to the cluster); the actors and
their pool are in :mod:`._ray_pool`, and what cannot be sent to the workers is named by
:mod:`._ray_pickling`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    import ray
    import ray.exceptions
except ImportError as error:  # pragma: no cover  (ray is in the test set)
    raise ImportError("arttrace.RayExecutor needs Ray: pip install 'arttrace[ray]'") from error

from .._errors import ConfigurationError
from ..capture._trajectory import Trajectory
from ._frozen import FORMAT, thaw
from ._ray_pickling import example_name, load_message, pickled
from ._ray_pool import (
    Member,
    Pool,
    PoolBroken,
    RolloutActor,
    capacity,
    cluster_resources,
    driver_capture,
    failed,
    node_resources,
    placeable,
)

if TYPE_CHECKING:
    from ._executor import Metadata
    from ._rollout import RolloutRunner

_log = logging.getLogger("arttrace")

_START_TIMEOUT = 300.0
"""Seconds :meth:`RayExecutor.bind` waits for its first actor (runtime_env set-up included)."""

_WORKER_LOST = (
    ray.exceptions.RayActorError,  # the actor's process died, or its node
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.ObjectLostError,  # the result was on a node that died
    ray.exceptions.OutOfMemoryError,  # Ray's memory monitor killed the worker
)
"""Failures of the worker, not of the rollout: the rollout is run again elsewhere."""

_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_AUTH_ON = "Token authentication is enabled for this Ray cluster"
"""Ray (>= 2.52) turns token authentication on for a local instance it starts, and warns
that it did, with how to opt out. For the instance a RayExecutor starts for itself that is
the right default, not news: the warning is left out (the token is Ray's usual,
``~/.ray/auth_token``; ``RAY_AUTH_MODE`` set by the user is respected)."""


@contextlib.contextmanager
def _quiet(logger: str, message: str) -> Iterator[None]:
    """Leave out ``logger``'s records that start with ``message`` inside the block."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(message)

    log = logging.getLogger(logger)
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


_RAYLET_ENDED = "Raylet is terminated"
"""How Ray's report of a raylet that ended starts: the node's agents each send the driver the
last lines of the raylet's log (its periodic ``[state-dump]``), about 20 lines each."""


def _quiet_raylet_logs() -> None:
    """Keep Ray's reports of a dead node's raylet (:data:`_RAYLET_ENDED`) off this process's
    terminal: they stay in that node's ``raylet.out``, and go to the ``arttrace`` logger at
    DEBUG. The rollouts the node took are retried, and each says so in one warning. Every
    other line Ray prints here (the rollouts' own output) is kept. Idempotent; a Ray without
    the function this wraps (private) is left as it is."""
    worker = ray._private.worker
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "arttrace_quiet", False):
        return

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = data.get("lines") or ()
        if data.get("pid") == "raylet" and any(
            isinstance(line, str) and line.startswith(_RAYLET_ENDED) for line in lines
        ):
            _log.debug("arttrace: Ray reported a raylet's end: %s", "\n".join(lines))
            return
        printer(data, ignore_prefix)

    print_to_stdstream.arttrace_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_to_stdstream


_connection = threading.Lock()
_users = 0
"""RayExecutors bound on the Ray connection arttrace opened (0 when the user opened it)."""
_local = False
"""That connection started a local Ray instance (no autoscaler will add a node to it)."""


class RayExecutor:
    """Run the Trainer's rollouts on a Ray cluster: ``Trainer(..., executor=RayExecutor())``.

    Each rollout runs in an actor (a worker process) on any node of the cluster, one rollout
    per actor at a time, with capture instrumented as in the Trainer's process
    (``arttrace.instrument()``'s settings) and the rollout's trajectory opened with the
    example id and metadata it would have in-process; the reward rules are the Trainer's.
    The finished trajectory comes back in a compact binary form (token ids and logprobs as
    packed arrays), equal to what the worker recorded. The rollout, ``reward_fn`` and every
    dataset example are pickled (``cloudpickle``) and loaded on a worker when the Trainer is
    built: one that cannot be sent fails there, with a
    :class:`~arttrace.ConfigurationError` naming it and the fix.

    Args:
        address: The cluster: ``None`` connects to ``RAY_ADDRESS`` when it is set, else
            starts a local Ray instance (shut down again by :meth:`close`); ``"auto"`` finds
            a running local cluster (``ray start``); ``"ray://host:port"`` connects
            through Ray Client; ``"host:port"`` to a head node. A Ray already initialized in
            this process (``ray.init()`` of your own) is used as it is, and never shut down.
        num_cpus: CPUs each rollout holds (its actor's reservation), fractional allowed.
        num_gpus: GPUs each rollout holds.
        resources: Custom resources each rollout holds, e.g. ``{"sandbox": 1}``.
        runtime_env: The rollout actors' Ray runtime environment (each actor's option, so it
            applies on a cluster you connected to as on one started here), e.g.
            ``{"py_modules": [my_agent]}`` to send a module the nodes do not have, or
            ``{"pip": [...]}``.
        max_in_flight: Rollouts running at a time, i.e. actors in the pool (default: the
            Trainer's ``max_concurrency``). Actors the cluster has no room for wait unused.
        max_retries: How many times a rollout whose worker died (its process killed, its
            node lost) is run again on another worker, each retry logged as a warning.
            Past it the rollout comes back with the cause on ``Trajectory.exception``
            (counted under the Trainer's ``max_exceptions``). A rollout that raises is never
            retried: that is the agent's failure, kept as in-process.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        resources: dict[str, float] | None = None,
        runtime_env: dict[str, Any] | None = None,
        max_in_flight: int | None = None,
        max_retries: int = 2,
    ) -> None:
        for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"{name} must be a number >= 0, got {value!r}")
        if max_in_flight is not None and (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 1
        ):
            raise ConfigurationError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.address = address
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.resources = dict(resources or {})
        self.runtime_env = runtime_env
        self.max_in_flight = max_in_flight
        self.max_retries = max_retries
        self._pool: Pool | None = None
        self._timeout: float | None = None
        """The Trainer's ``rollout_timeout``, enforced on the worker (and here, as a backstop)."""
        self._connected = False
        self._shared = False
        """Bound on the Ray connection arttrace opened (not on the user's own)."""

    # -- bind ------------------------------------------------------------------------------

    def bind(self, runner: RolloutRunner[Any], examples: Sequence[Any], concurrency: int) -> None:
        """Check that the rollout, ``reward_fn`` and ``examples`` can be sent to and loaded on
        a worker, connect to the cluster and start the actors."""
        rollout = pickled(runner.rollout, "the rollout", "rollout")
        reward_fn = (
            None
            if runner.reward_fn is None
            else pickled(runner.reward_fn, "reward_fn", "reward_fn")
        )
        blobs = [
            pickled(example, example_name(i, example), "example")
            for i, example in enumerate(examples)
        ]
        self._connect()
        _quiet_raylet_logs()
        size = self._size(concurrency)
        sent = (rollout, reward_fn, concurrency, runner.timeout)  # the limit applies there
        self._timeout = runner.timeout
        pool = self._pool
        if pool is not None and len(pool.members) == size:
            pool.reload(sent)
        else:
            if pool is not None:
                pool.close()
            options: dict[str, Any] = {
                "num_cpus": self.num_cpus,
                "num_gpus": self.num_gpus,
                "resources": self.resources or None,
                "max_restarts": 0,  # a dead actor is replaced by the pool, and its rollout
                "max_task_retries": 0,  # retried there: Ray never runs a rollout twice itself
                "max_concurrency": 1,
            }
            if self.runtime_env is not None:
                options["runtime_env"] = _uploaded(self.runtime_env)
            pool = Pool(ray.remote(RolloutActor).options(**options), size, sent)
        self._pool = None
        try:
            first = self._first_ready(pool)
            self._check(first, blobs, examples)
        except BaseException:
            pool.close()
            raise
        self._pool = pool

    def _first_ready(self, pool: Pool) -> tuple[Member, dict[str, Any]]:
        """The first actor to start, and what it said: the bind-time check of the worker."""
        pending = {m.ready: m for m in pool.members}
        deadline = time.monotonic() + _START_TIMEOUT
        warned = False
        while True:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=5.0)
            if done:
                member = pending[done[0]]
                try:
                    info = ray.get(done[0])
                except ray.exceptions.RuntimeEnvSetupError as error:
                    raise ConfigurationError(
                        f"the Ray workers could not set up runtime_env={self.runtime_env!r}: "
                        f"{_summary(error)}"
                    ) from None
                except ray.exceptions.RayActorError as error:
                    raise ConfigurationError(
                        "a Ray worker could not start the rollout actor: "
                        f"{_summary(error)}. Is arttrace installed on every node (the same "
                        "version as here)? Install it there, or send it with "
                        "runtime_env={'pip': ['arttrace[ray]']}"
                    ) from None
                pool.started(member, info)
                return member, info
            if not warned and not placeable(self._request()):
                if _local:
                    raise self._unplaceable()
                _log.warning("arttrace: RayExecutor: %s; waiting for one", self._unplaceable())
                warned = True
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"no rollout actor of the RayExecutor started within {_START_TIMEOUT:.0f} "
                    f"s ({self._request_text()} each); check the cluster's free resources "
                    "(ray status) and the runtime_env"
                )

    def _check(
        self, first: tuple[Member, dict[str, Any]], blobs: list[bytes], examples: Sequence[Any]
    ) -> None:
        member, info = first
        if info["format"] != FORMAT:
            raise ConfigurationError(
                f"the Ray workers run another arttrace (frozen trajectory format "
                f"{info['format']}, this process {FORMAT}): install the same arttrace version "
                "on every node"
            )
        if info["error"] is not None:
            raise ConfigurationError(load_message(**info["error"]))
        bad = ray.get(member.actor.check.remote(blobs)) if blobs else None
        if bad is not None:
            index, error = bad
            error["what"] = example_name(index, examples[index])
            raise ConfigurationError(load_message(**error))

    def _size(self, concurrency: int) -> int:
        """The pool's size: ``max_in_flight``, else the Trainer's ``concurrency`` cut to the
        rollouts the cluster's nodes can hold at once (an actor that cannot be placed would
        wait for good, unless an autoscaler adds a node). Either way, said once when the
        cluster cannot place them all now."""
        fits = capacity(self._request())
        size = self.max_in_flight or concurrency
        if fits is None or fits >= size or fits == 0:  # 0: _first_ready says why
            return size
        room = (
            f"the cluster's nodes have room for {fits} at a time "
            f"({self._request_text()} each; they have {cluster_resources()})"
        )
        if self.max_in_flight is None:
            _log.info(
                "arttrace: RayExecutor: %d rollout actor(s), not the Trainer's "
                "max_concurrency=%d: %s. Give max_in_flight to ask for more (an autoscaler "
                "adds nodes for them)",
                fits,
                concurrency,
                room,
            )
            return fits
        _log.warning(
            "arttrace: RayExecutor: %d of the %d rollout actors (max_in_flight) wait for room: "
            "%s. They hold up no rollout, and start when a node has room (an autoscaler adds "
            "nodes for them); a smaller max_in_flight leaves them out",
            size - fits,
            size,
            room,
        )
        return size

    def _request(self) -> dict[str, float]:
        return {
            k: v
            for k, v in {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}.items()
            if v
        }

    def _request_text(self) -> str:
        parts = [f"num_cpus={self.num_cpus}", f"num_gpus={self.num_gpus}"]
        if self.resources:
            parts.append(f"resources={self.resources}")
        return ", ".join(parts)

    def _unplaceable(self) -> ConfigurationError:
        return ConfigurationError(
            f"no node of the Ray cluster can hold one rollout ({self._request_text()}); "
            f"its nodes have: {node_resources()}. Ask for less per rollout, or add a node "
            "that has it"
        )

    def _connect(self) -> None:
        global _users, _local
        if self._connected:
            return
        with _connection:
            if not ray.is_initialized():
                address = self.address or os.environ.get("RAY_ADDRESS") or None
                if address is None:
                    with _quiet(_AUTH_LOGGER, _AUTH_ON):
                        ray.init(
                            address="local",
                            include_dashboard=False,
                            logging_level=logging.WARNING,
                            log_to_driver=True,
                        )
                    _local = True
                else:
                    given = "RayExecutor(address=...)" if self.address else "RAY_ADDRESS"
                    _reachable(address, given)
                    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
                _users = 0
            else:
                _elsewhere(self.address)
                if not _users:  # the user's own ray.init(): theirs to shut down
                    self._connected, self._shared = True, False
                    return
            _users += 1
            self._connected = self._shared = True

    # -- run -------------------------------------------------------------------------------

    async def run(self, example_id: str, example: Any, metadata: Metadata) -> Trajectory:
        """One rollout on the cluster; see the class docstring for retries and failures.
        ``metadata()`` is asked each time a worker takes the rollout (a retry samples from the
        policy of its own time)."""
        if self._pool is None:
            raise RuntimeError("RayExecutor.run before bind: pass it to a Trainer")
        pool = self._pool
        wanted = driver_capture()
        started = time.time()
        causes: list[str] = []
        attempts = self.max_retries + 1
        meta = metadata()
        for attempt in range(1, attempts + 1):
            try:
                member = await pool.acquire(retry=attempt > 1)
            except PoolBroken as broken:
                cause = broken.__cause__ or broken
                message = (
                    f"no Ray worker could start a rollout actor ({_summary(cause)}); "
                    "check the nodes' logs (ray logs) and the runtime_env"
                )
                return failed(
                    example_id, meta, type(cause).__name__, message, _trace(cause), started
                )
            meta = {**metadata(), **member.where}  # once it starts: the policy it samples from
            ref = member.actor.run.remote(example_id, example, meta, wanted)
            try:
                limit = None if self._timeout is None else self._timeout + _TIMEOUT_GRACE
                async with asyncio.timeout(limit):
                    blob = await ref
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
                pool.release(member)
                raise
            except TimeoutError:  # the worker did not stop the run: its event loop is stuck
                pool.lost(member)
                return failed(
                    example_id, meta, "RolloutTimeoutError", _stuck(self._timeout), "", started
                )
            except _WORKER_LOST as error:
                pool.lost(member)
                causes.append(_summary(error))
                if attempt < attempts:
                    _log.warning(
                        "arttrace: rollout of %r (%s) lost its Ray worker: %s; running it "
                        "again on another worker (attempt %d of %d)",
                        example_id,
                        _slot(meta),
                        causes[-1],
                        attempt + 1,
                        attempts,
                    )
                    continue
                return failed(
                    example_id,
                    meta,
                    type(error).__name__,
                    _exhausted(causes, self.max_retries),
                    _trace(error),
                    started,
                )
            except Exception as error:  # the actor call failed, its worker alive
                pool.release(member)
                cause = getattr(error, "cause", None) or error
                message = f"the rollout failed on its Ray worker: {_summary(error)}"
                return failed(
                    example_id, meta, type(cause).__name__, message, _trace(error), started
                )
            pool.release(member)
            try:
                return thaw(blob)
            except Exception as error:
                message = f"the trajectory a Ray worker sent could not be read: {error}"
                return failed(
                    example_id, meta, type(error).__name__, message, _trace(error), started
                )
        raise AssertionError("unreachable")  # pragma: no cover

    # -- close -----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill the actors; shut down the Ray instance :meth:`bind` started, if it did, once
        no other RayExecutor uses it (idempotent)."""
        global _users, _local
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if not self._connected:
            return
        self._connected = False
        with _connection:
            if self._shared:
                _users -= 1
                if _users == 0 and ray.is_initialized():
                    ray.shutdown()
                    _local = False


def _uploaded(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with its local folders and modules (``py_modules``, ``working_dir``)
    uploaded to the cluster, as ``ray.init`` does for a job's: an actor's ``runtime_env``
    takes only their URIs."""
    if not (runtime_env.get("py_modules") or runtime_env.get("working_dir")):
        return runtime_env
    node = ray._private.worker.global_worker.node
    if node is None:  # Ray Client: they are uploaded on the cluster's side
        return runtime_env
    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

        scratch = node.get_runtime_env_dir_path()
        env = dict(runtime_env)
        for upload in (upload_py_modules_if_needed, upload_working_dir_if_needed):
            kwargs: dict[str, Any] = {"scratch_dir": scratch}
            if "include_gitignore" in inspect.signature(upload).parameters:
                kwargs["include_gitignore"] = True
            env = upload(env, **kwargs)
        env.pop("excludes", None)  # used by the upload only
        return env
    except Exception as error:
        raise ConfigurationError(
            f"could not send the local files of runtime_env={runtime_env!r} to the Ray "
            f"cluster ({type(error).__name__}: {error}). Give this runtime_env to "
            "ray.init(runtime_env=...) before building the Trainer instead, and no "
            "runtime_env to RayExecutor"
        ) from error


_TIMEOUT_GRACE = 30.0
"""Seconds past ``rollout_timeout`` the driver waits for a worker to send back the run it
stopped, before it gives the worker up as stuck (its first run also loads capture)."""


def _stuck(timeout: float | None) -> str:
    return (
        f"the run took longer than rollout_timeout={timeout:g} s, and its Ray worker did not "
        f"stop it within {_TIMEOUT_GRACE:g} s more: the rollout blocks its worker's event loop "
        "(a sync call, such as time.sleep or a sync HTTP client, inside an async rollout). "
        "The worker was replaced, and the run's calls were lost with it. Make the rollout a "
        "sync function (it then runs in a thread), or await the call (asyncio.to_thread)"
    )


_PROBE_SECONDS = 5.0
"""Seconds a cluster's address has to accept a connection before :meth:`RayExecutor.bind`
refuses it (Ray itself retries an address nothing answers at for about 14 minutes)."""


def _elsewhere(address: str | None) -> None:
    """Say so when ``RayExecutor(address=...)`` is not the cluster this process is already
    connected to: Ray keeps one connection per process, so the executor uses that one."""
    if not address or address in ("auto", "local"):
        return
    connected = ray.get_runtime_context().gcs_address
    host, port = _host_port(address)
    at_host, at_port = _host_port(connected)
    here = {"localhost", "127.0.0.1", ray.util.get_node_ip_address()}
    if port == at_port and (host == at_host or {host, at_host} <= here):
        return
    _log.warning(
        "arttrace: RayExecutor(address=%r) is ignored: this process is already connected to "
        "the Ray cluster at %s (ray.init() was called first), and Ray keeps one connection "
        "per process. Call ray.shutdown() before the Trainer starts to use another cluster",
        address,
        connected,
    )


def _host_port(address: str) -> tuple[str, str]:
    """``host:port`` (or ``ray://host:port``) as its two parts (``""`` for a missing one)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host, port


def _reachable(address: str, given: str) -> None:
    """Refuse ``address`` (``given`` says where it came from) if nothing accepts a connection
    there, or at the address Ray turns it into: Ray replaces a local address (``127.0.0.1``,
    ``localhost``) with this machine's network address."""
    if address in ("auto", "local"):
        return
    client = address.startswith("ray://")
    host, port = _host_port(address)
    if not (host and port.isdigit()):
        raise ConfigurationError(
            f"{given} = {address!r} is not a Ray address: give the head node's 'host:port' "
            "(port 6379 unless `ray start --head --port` chose another), "
            "'ray://host:10001' for Ray Client, or 'auto' for the cluster this machine is in"
        )
    target = (host.strip("[]"), int(port))
    ray_target = target
    if not client:
        with contextlib.suppress(Exception):  # Ray's own rule (private: best effort)
            from ray._private.services import canonicalize_bootstrap_address

            rewritten = canonicalize_bootstrap_address(address) or address
            rhost, _, rport = rewritten.rpartition(":")
            ray_target = (rhost.strip("[]"), int(rport))
    for where in dict.fromkeys([target, ray_target]):
        try:
            socket.create_connection(where, timeout=_PROBE_SECONDS).close()
        except OSError as error:
            cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            if where == target:
                said = f"nothing accepts a connection at {address!r} ({cause})"
            else:
                said = (
                    f"Ray connects to {address!r} at {where[0]}:{where[1]}, this machine's "
                    f"network address (its rule for a local address), and nothing accepts a "
                    f"connection there ({cause}); a head node started with "
                    "--node-ip-address=127.0.0.1 listens on loopback only"
                )
            raise ConfigurationError(
                f"cannot reach the Ray cluster of {given} = {address!r}: {said}. Check the "
                "address (`ray status` on the head node prints it), that the head node is "
                "running, and that this machine can reach that port (firewall rules, "
                "security groups)"
            ) from None


def _slot(metadata: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {metadata[k]}" for k in ("split", "step", "rollout") if k in metadata)


def _summary(error: BaseException) -> str:
    """A Ray error in one line: its type, what happened, and the worker's PID and address
    (Ray's list of common causes and its actor ids left out)."""
    text = str(error)
    for tail in ("Some common causes include", "To troubleshoot", "There are some potential"):
        text = text.split(tail)[0]
    said, where = [], []
    for line in text.splitlines():
        key, sep, value = line.strip().partition(": ")
        if line.startswith("\t") and sep:  # ActorDiedError's "\tpid: 123", "\tip: 10.0.0.2"
            if key in ("pid", "ip"):
                where.append(f"{key} {value}")
        elif line.strip():
            said.append(line.strip())
    text = " ".join(said) + (f" ({', '.join(where)})" if where else "")
    text = text if len(text) <= 500 else text[:500] + "..."
    return f"{type(error).__name__}: {text}"


def _exhausted(causes: list[str], retries: int) -> str:
    tries = "; ".join(f"try {i}: {cause}" for i, cause in enumerate(causes, 1))
    return (
        f"the Ray worker running this rollout died on each of its {len(causes)} tries "
        f"(max_retries={retries}): {tries}. If a rollout kills its worker (memory, a crash "
        "in native code), give it more (num_cpus, resources, larger nodes) or fix the "
        "crash (the worker's log: ray logs); if nodes are being lost, raise max_retries"
    )


def _trace(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))
