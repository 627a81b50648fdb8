"""One real Ray cluster for the tests: a head node and a worker node, each its own raylet and
processes on this machine, started once per session (~20 s on 2 cores) and torn down after.

Loopback only: every process of the cluster (GCS, raylets, agents, workers) and the drivers
listen on 127.0.0.1 and nothing else, so nothing of it is reachable from the network and Ray's
token authentication can stay off. Ray binds 127.0.0.1 only for a node at that address, and
a driver given ``127.0.0.1:port`` would connect to the machine's network address instead
(Ray's rule for local addresses): both follow ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
Ray's switch for a single-machine Ray, set for the session. (Nodes at 127.0.0.2 and
127.0.0.3 keep the connections on loopback too, but Ray then listens on every interface.)

Everything Ray writes goes under a temp folder of the fixture's own (``RAY_TMPDIR``),
``ray_current_cluster`` included: Ray writes that file under its default temp folder,
which a machine where Ray never ran does not have.

The nodes' worker processes can import the test modules (this folder is on their
``PYTHONPATH``, as an agent's package is installed on real nodes); a module elsewhere is
not importable there, as on a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

STARTUP_LIMIT = 120
"""Seconds the cluster may take to start (a retry included) before the Ray tests fail."""

_NODE = {"num_cpus": 4, "object_store_memory": 80 * 1024 * 1024}
_HEAD = {
    **_NODE,
    "resources": {"spare": 1},
    "include_dashboard": False,
    "no_monitor": True,  # no autoscaler, no log streaming: fewer processes to start
    "include_log_monitor": False,
    # a lost node is declared dead within ~2 s (Ray's default: ~30 s)
    "_system_config": {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 500,
        "health_check_timeout_ms": 500,
        "health_check_failure_threshold": 3,
    },
}


@dataclass
class RayCluster:
    cluster: Any
    """The ``ray.cluster_utils.Cluster``."""
    address: str
    node_ids: tuple[str, str]
    """The head node's id, then the worker node's (4 CPUs each; the head has a custom
    resource ``spare: 1``)."""
    startup_seconds: float
    environ: dict[str, str]
    """What the nodes' processes, and this one while the cluster is up, add to their
    environment."""
    temp: Path
    """Ray's temp folder for the session (``RAY_TMPDIR``)."""

    def add_node(self, **args: Any) -> Any:
        """Another node (``ray._private.node.Node``), as the first two were started."""
        with _environ(**self.environ):
            node = self.cluster.add_node(**{**_NODE, **args})
        self.cluster.wait_for_nodes(timeout=STARTUP_LIMIT)
        return node


@contextlib.contextmanager
def _deadline(seconds: int, what: str) -> Iterator[None]:
    """Fail with ``what`` if the block takes longer than ``seconds`` (main thread only)."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray on this machine alone: its nodes at 127.0.0.1, listening there only, and a driver's
``127.0.0.1:port`` kept as it is (Ray's constant is read when Ray is imported: a process that
imports Ray after this is in its environment needs nothing else)."""


@contextlib.contextmanager
def _loopback(ray: Any) -> Iterator[None]:
    """:data:`LOOPBACK` for this process, which may have imported Ray before."""
    constants = ray._private.ray_constants
    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


def listening(pids: set[int]) -> list[tuple[int, str]]:
    """The TCP sockets the processes ``pids`` listen on: (pid, "host:port"), from /proc."""
    inodes: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes[target[8:-1]] = pid
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as file:
            next(file)
            for line in file:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                host, port = local.split(":")
                raw = bytes.fromhex(host)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                family = socket.AF_INET if width == 4 else socket.AF_INET6
                found.append((inodes[inode], f"{socket.inet_ntop(family, words)}:{int(port, 16)}"))
    return found


def descendants(pid: int) -> set[int]:
    """``pid`` and every process started under it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as file:
                    parent = int(file.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(children.get(current, ()))
    return found


_SESSION: list[RayCluster] = []
"""The session's cluster, while it runs."""


@pytest.fixture(scope="session", name="ray_cluster")
def ray_cluster_fixture() -> Iterator[RayCluster]:
    """The session's one cluster, however many test modules import this fixture: to pytest
    each import is a fixture of its own, and a second cluster cannot start beside the first
    (one ``ray.init`` per process)."""
    if _SESSION:
        yield _SESSION[0]
        return
    for cluster in _cluster():  # one item; the loop's end tears the cluster down
        _SESSION.append(cluster)
        try:
            yield cluster
        finally:
            _SESSION.clear()


def _cluster() -> Iterator[RayCluster]:
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # Ray's socket paths must stay short
    tests = str(Path(__file__).parents[1])  # support is a package in it
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    environ = {
        **LOOPBACK,
        "RAY_TMPDIR": temp,  # everything Ray writes, ray_current_cluster included
        "RAY_AUTH_MODE": "disabled",  # listening on loopback only (nothing written to ~/.ray)
        "PYTHONPATH": path,  # the test modules, importable by the workers
    }
    cluster = None
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as session:
            session.enter_context(_environ(**environ))  # the drivers the tests fork, too
            session.enter_context(_loopback(ray))
            with _deadline(STARTUP_LIMIT, "starting the test Ray cluster (head + 1 worker node)"):
                for attempt in (1, 2):
                    try:
                        cluster = Cluster(initialize_head=True, head_node_args=_HEAD)
                        worker = cluster.add_node(**_NODE)
                        break
                    except Exception as error:  # Ray gives a raylet 30 s to register
                        if cluster is not None:
                            cluster.shutdown()
                            cluster = None
                        if attempt == 2 or "timed out during startup" not in str(error):
                            raise
                assert cluster is not None
                cluster.wait_for_nodes(timeout=STARTUP_LIMIT)
                ray.init(address=cluster.address, logging_level="WARNING")
            head = cluster.head_node.node_id
            yield RayCluster(
                cluster,
                cluster.address,
                (head, worker.node_id),
                time.perf_counter() - started,
                environ,
                Path(temp),
            )
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
