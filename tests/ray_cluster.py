"""One real Ray cluster for the tests: a head node and a worker node, each its own raylet and
processes on this machine (at its own address: with ``node_ip_address="127.0.0.1"`` Ray 2.60's
driver cannot reach the GCS), started once per session (~20 s on 2 cores) and torn down after.

The nodes' worker processes can import the test modules (this folder is on their
``PYTHONPATH``, as an agent's package is installed on real nodes); a module elsewhere is
not importable there, as on a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
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
    """What the nodes' processes add to their environment."""

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
    tests = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    # No token auth on a loopback test cluster (nothing written to ~/.ray), and the test
    # modules importable by the workers.
    environ = {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": path}
    cluster = None
    started = time.perf_counter()
    try:
        with (
            _environ(**environ),
            _deadline(STARTUP_LIMIT, "starting the test Ray cluster (head + 1 worker node)"),
        ):
            for attempt in (1, 2):
                try:
                    cluster = Cluster(
                        initialize_head=True, head_node_args={**_HEAD, "temp_dir": temp}
                    )
                    worker = cluster.add_node(**_NODE)
                    break
                except Exception as error:  # Ray gives a raylet 30 s to register: a loaded host
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
        )
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
