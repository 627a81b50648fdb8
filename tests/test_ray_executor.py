"""RayExecutor on a real two-node Ray cluster (tests/ray_cluster.py): the runs equal the same
runs in-process, a worker killed mid-run is retried (or reported), and what cannot be sent to
the workers fails when the executor is bound, naming it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import arttrace as at
import ray_agents
from arttrace.executors import InProcessExecutor, RayExecutor
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall, serve
from arttrace.training._rollout import RolloutRunner
from ray_cluster import RayCluster, ray_cluster_fixture  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("instrumented")

GROUP = 8


def answer(request: dict[str, Any]) -> Reply:
    """A tool call, then the answer: two policy turns with tokens, logprobs and a tool call."""
    last = request["messages"][-1]
    if last["role"] == "user":
        return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])
    return Reply(f"It is {last['content']}.")


@pytest.fixture
def servers() -> Iterator[Callable[[], str]]:
    """Fresh scripted servers (their URLs), stopped together after the test (one by one,
    each stop waits up to half a second for its server's loop)."""
    started: list[LLMServer] = []

    def start() -> str:
        started.append(serve(ScriptedLLM(answer)))
        return started[-1].base_url

    yield start
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(LLMServer.stop, started))


def examples(servers: Callable[[], str], n: int, nodes: Path | None = None) -> list[dict[str, Any]]:
    """``n`` examples, each run ``GROUP`` times, each run with its own fresh server."""
    return [
        {
            "id": f"ex-{i}",
            "q": f"What is 2 + 3? ({i})",
            "urls": [servers() for _ in range(GROUP)],
            "nodes": str(nodes) if nodes else None,
        }
        for i in range(n)
    ]


async def run_group(executor: Any, batch: list[dict[str, Any]]) -> dict[tuple[str, int], Any]:
    keys = [(example["id"], k) for example in batch for k in range(GROUP)]
    runs = await asyncio.gather(
        *(
            executor.run(example["id"], example, {"split": "train", "step": 0, "rollout": k})
            for example in batch
            for k in range(GROUP)
        )
    )
    return dict(zip(keys, runs, strict=True))


def untimed(t: at.Trajectory) -> dict[str, Any]:
    data = t.to_dict()
    for record in [data, *data["calls"]]:
        record.pop("started_at"), record.pop("ended_at")
    return data


async def test_runs_on_both_nodes_equal_the_same_runs_in_process(
    ray_cluster: RayCluster, servers, tmp_path
):
    # 2 CPUs a run on 4-CPU nodes: two actors per node, so both nodes run rollouts
    executor = RayExecutor(num_cpus=2, max_in_flight=4)
    where: dict[str, list[str]] = {}
    try:
        for rollout in (ray_agents.solve_async, ray_agents.solve_sync):
            nodes = tmp_path / rollout.__name__
            nodes.mkdir()
            on_ray, in_process = examples(servers, 8, nodes), examples(servers, 8)
            executor.bind(RolloutRunner(rollout, None, 4), on_ray, 4)  # the second keeps the actors
            remote = await run_group(executor, on_ray)
            local = InProcessExecutor()
            local.bind(RolloutRunner(rollout, None, 8), in_process, 8)
            expected = await run_group(local, in_process)
            local.close()

            for key, t in remote.items():
                assert t.exception is None, t.exception
                assert untimed(t) == untimed(expected[key])
                assert t.metadata == {"split": "train", "step": 0, "rollout": key[1]}
                turns = [c for c in t.calls if c.trainable]
                assert len(turns) == 2 and turns[0].choices[0].message["tool_calls"]
                assert turns[1].prompt_token_ids and turns[1].choices[0].token_ids
                assert turns[1].choices[0].logprobs
            assert [t.reward for t in remote.values()] == [t.reward for t in expected.values()]
            ran = [p.read_text().split() for p in nodes.iterdir()]
            assert len(ran) == 8 * GROUP
            assert {node for node, _ in ran} == set(ray_cluster.node_ids)
            where[rollout.__name__] = sorted({pid for _, pid in ran})
    finally:
        executor.close()
    assert where["solve_sync"] == where["solve_async"]  # re-bound: the same 4 processes
    assert len(where["solve_sync"]) == 4


def test_a_rollout_that_cannot_be_pickled_fails_at_bind_naming_it():
    lock = threading.Lock()

    async def rollout(example: Any) -> float:
        with lock:
            return 1.0

    with pytest.raises(at.ConfigurationError) as caught:
        RayExecutor().bind(RolloutRunner(rollout, None, 1), [{"id": "a"}], 1)
    message = str(caught.value)
    assert message.startswith("the rollout cannot be sent to the Ray workers")
    assert "its variable 'lock' is a threading.Lock, which cannot be pickled" in message


def test_a_reward_fn_or_example_that_cannot_be_pickled_fails_at_bind_naming_it():
    lock = threading.Lock()
    with pytest.raises(
        at.ConfigurationError,
        match=r"^reward_fn cannot be sent.*its variable 'lock' is a threading\.Lock",
    ):
        RayExecutor().bind(
            RolloutRunner(ray_agents.constant, lambda e, o: lock and 1.0, 1), [{"id": "a"}], 1
        )
    dataset = [{"id": "a"}, {"id": "b"}, {"id": "c", "guard": lock}]
    with pytest.raises(at.ConfigurationError) as caught:
        RayExecutor().bind(RolloutRunner(ray_agents.constant, None, 1), dataset, 1)
    assert str(caught.value).startswith("example 2 (id 'c') cannot be sent to the Ray workers")
    assert "example['guard'] is a threading.Lock" in str(caught.value)
    assert "Keep examples to plain data" in str(caught.value)


def test_a_rollout_from_a_module_the_workers_cannot_import_fails_at_bind_naming_it(
    ray_cluster: RayCluster, tmp_path, monkeypatch
):
    (tmp_path / "agent_only_here.py").write_text("async def rollout(example):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import agent_only_here

    runner = RolloutRunner(agent_only_here.rollout, None, 1)
    with pytest.raises(at.ConfigurationError) as caught:
        RayExecutor(max_in_flight=1).bind(runner, [{"id": "a"}], 1)
    message = str(caught.value)
    assert "the rollout cannot be loaded on the Ray workers" in message
    assert "they cannot import module 'agent_only_here'" in message
    assert f"runtime_env={{'py_modules': [{str(tmp_path / 'agent_only_here.py')!r}]}}" in message

    # the fix the message gives works
    executor = RayExecutor(max_in_flight=1, runtime_env={"py_modules": [agent_only_here]})
    executor.bind(runner, [{"id": "a"}], 1)
    try:
        t = await_run(executor, "a", {"id": "a"})
    finally:
        executor.close()
    assert (t.reward, t.exception) == (1.0, None)


def await_run(executor: RayExecutor, example_id: str, example: Any) -> at.Trajectory:
    return asyncio.run(executor.run(example_id, example, {"rollout": 0}))


def _kill_when_written(pids: Path, count: int) -> int:
    """Kill the process whose PID is line ``count`` of ``pids`` once it is written."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = pids.read_text().split() if pids.exists() else []
        if len(lines) >= count:
            pid = int(lines[count - 1])
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no rollout wrote its PID to {pids}")


async def test_a_worker_killed_mid_rollout_is_retried_once_on_another_worker(
    ray_cluster: RayCluster, tmp_path, caplog
):
    pids = tmp_path / "pids"
    executor = RayExecutor(max_in_flight=2, max_retries=2)
    executor.bind(RolloutRunner(ray_agents.killed_until_retried, None, 2), [{"id": "a"}], 2)
    example = {"id": "a", "pids": str(pids), "hang": 1}
    try:
        with caplog.at_level(logging.WARNING, logger="arttrace"):
            run = asyncio.ensure_future(
                executor.run("a", example, {"split": "train", "step": 0, "rollout": 3})
            )
            killed = await asyncio.to_thread(_kill_when_written, pids, 1)
            t = await asyncio.wait_for(run, 60)
    finally:
        executor.close()
    assert (t.reward, t.exception) == (1.0, None)
    assert t.metadata == {"split": "train", "step": 0, "rollout": 3}
    tries = [int(p) for p in pids.read_text().split()]
    assert tries[0] == killed and len(tries) == 2 and tries[1] != killed
    [warning] = [r.getMessage() for r in caplog.records if "lost its Ray worker" in r.getMessage()]
    assert "ActorDiedError" in warning and "(attempt 2 of 3)" in warning
    assert "'a' (split train, step 0, rollout 3)" in warning


async def test_with_no_retry_left_the_killed_rollout_comes_back_with_the_cause(
    ray_cluster: RayCluster, tmp_path, caplog
):
    pids = tmp_path / "pids"
    executor = RayExecutor(max_in_flight=1, max_retries=0)
    executor.bind(RolloutRunner(ray_agents.killed_until_retried, None, 1), [{"id": "a"}], 1)
    try:
        with caplog.at_level(logging.WARNING, logger="arttrace"):
            run = asyncio.ensure_future(
                executor.run("a", {"id": "a", "pids": str(pids), "hang": 9}, {"rollout": 0})
            )
            await asyncio.to_thread(_kill_when_written, pids, 1)
            t = await asyncio.wait_for(run, 60)
    finally:
        executor.close()
    assert t.example_id == "a" and t.metadata == {"rollout": 0} and t.reward is None
    assert t.exception is not None and t.exception["type"] == "ActorDiedError"
    assert "died on each of its 1 tries (max_retries=0)" in t.exception["message"]
    assert "ActorDiedError" in t.exception["traceback"]
    assert not [r for r in caplog.records if "lost its Ray worker" in r.getMessage()]
    assert len(pids.read_text().split()) == 1
