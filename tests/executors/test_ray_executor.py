"""RayExecutor on a real two-node Ray cluster (tests/support/ray_cluster.py): the runs equal the
same runs in-process, a worker killed mid-run is retried (or reported), what cannot be sent to
the workers fails when the executor is bound, naming it, and a Trainer journals each slot once."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import art
import httpx
import openai
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.capture import _context
from arttrace.executors import InProcessExecutor, RayExecutor
from arttrace.executors._frozen import freeze, thaw
from arttrace.executors._rollout import RolloutRunner
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall, serve
from support import ray_agents
from support.ray_cluster import (  # noqa: F401  (the fixture)
    LOOPBACK,
    RayCluster,
    descendants,
    listening,
    ray_cluster_fixture,
)
from support.ray_driver import EXAMPLES, drivers, run_example

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
            executor.run(
                example["id"], example, lambda k=k: {"split": "train", "step": 0, "rollout": k}
            )
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


@pytest.fixture(scope="module")
def four(ray_cluster: RayCluster) -> Iterator[RayExecutor]:
    """Four actors of 2 CPUs on the two 4-CPU nodes: two on each, so both nodes run rollouts.
    Shared by the tests that bind it (a new bind keeps the actors): starting an actor's
    process takes seconds on 2 cores."""
    executor = RayExecutor(num_cpus=2, max_in_flight=4)
    yield executor
    executor.close()


async def test_runs_on_both_nodes_equal_the_same_runs_in_process(
    four: RayExecutor, ray_cluster: RayCluster, servers, tmp_path
):
    processes = {}
    for rollout in (ray_agents.solve_async, ray_agents.solve_sync):
        nodes = tmp_path / rollout.__name__
        nodes.mkdir()
        on_ray, in_process = examples(servers, 8, nodes), examples(servers, 8)
        four.bind(RolloutRunner(rollout, None, 4), on_ray, 4)
        remote = await run_group(four, on_ray)
        local = InProcessExecutor()
        local.bind(RolloutRunner(rollout, None, 8), in_process, 8)
        expected = await run_group(local, in_process)
        local.close()

        for key, t in remote.items():
            assert t.exception is None, t.exception
            data = untimed(t)
            data["metadata"] = meta = dict(data["metadata"])  # to_dict's is the run's own
            where = {k: meta.pop(k) for k in ("node_id", "node_address", "worker_pid")}
            assert data == untimed(expected[key])
            assert data["metadata"] == {"split": "train", "step": 0, "rollout": key[1]}
            assert where["node_id"] in ray_cluster.node_ids
            assert where["node_address"] == "127.0.0.1" and isinstance(where["worker_pid"], int)
            turns = [c for c in t.calls if c.trainable]
            assert len(turns) == 2 and turns[0].choices[0].message["tool_calls"]
            assert turns[1].prompt_token_ids and turns[1].choices[0].token_ids
            assert turns[1].choices[0].logprobs
        assert [t.reward for t in remote.values()] == [t.reward for t in expected.values()]
        ran = [p.read_text().split() for p in nodes.iterdir()]
        assert len(ran) == 8 * GROUP
        for (example_id, k), t in remote.items():  # the metadata says where it ran
            node, pid = (nodes / f"{example_id}-{k}").read_text().split()
            assert (t.metadata["node_id"], t.metadata["worker_pid"]) == (node, int(pid))
        assert {node for node, _ in ran} == set(ray_cluster.node_ids)
        processes[rollout] = {pid for _, pid in ran}
    # bound again for the sync rollout, the executor kept its 4 actors
    assert processes[ray_agents.solve_sync] == processes[ray_agents.solve_async]
    assert len(processes[ray_agents.solve_sync]) == 4


def test_the_cluster_keeps_what_ray_writes_in_its_own_temp_folder(ray_cluster: RayCluster):
    """On a machine where Ray never ran there is no ``<temp>/ray`` folder: Ray's
    ``ray_current_cluster`` must go under the cluster's own folder, not the system's."""
    own = ray_cluster.temp / "ray" / "ray_current_cluster"
    assert own.read_text() == ray_cluster.address
    system = Path(os.environ.get("TMPDIR") or "/tmp") / "ray" / "ray_current_cluster"
    assert not system.exists() or system.read_text() != ray_cluster.address


def test_every_process_of_the_cluster_listens_on_loopback_only(
    four: RayExecutor, ray_cluster: RayCluster
):
    """Token authentication is off on the test cluster: nothing of it may be reachable from
    the network (GCS, raylets, agents, the actors' workers, this driver)."""
    cluster = ray_cluster.cluster
    pids = {os.getpid()}
    for node in [cluster.head_node, *cluster.worker_nodes]:
        for processes in node.all_processes.values():
            for process in processes:
                pids |= descendants(process.process.pid)
    sockets = listening(pids)
    assert len({pid for pid, _ in sockets}) >= 6  # GCS, 2 raylets, the workers, this one
    assert [(pid, address) for pid, address in sockets if not _loopback(address)] == []


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rpartition(":")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv6 socket's
    return (mapped or ip).is_loopback


async def test_the_driver_judges_the_groups_of_runs_made_on_ray(
    four: RayExecutor, servers, tmp_path
):
    """A group reward with RayExecutor: the runs come back from the workers and the driver
    judges each group, outside every run and with capture off; ART gets the judge's rewards.
    (Before the test below, which closes the shared executor.)"""
    judged: list[tuple[str, int]] = []

    def judge(group: at.Group[Any]) -> list[float]:
        judged.append((group.example_id, len(group.runs)))
        assert _context.current_trajectory_var.get() is None and _context.capturing.get()
        assert all(len(run.trajectory.calls) == 2 for run in group.runs)  # the workers' calls
        return [0.1 * (run.rollout + 1) for run in group.runs]

    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(tmp_path / ".art"),
    )
    backend = at.DryRunBackend(tmp_path / "dry")
    await model.register(backend)
    trainer = at.Trainer(
        model,
        backend,
        ray_agents.solve_async,
        examples(servers, 2),
        group_size=GROUP,
        groups_per_step=2,
        executor=four,
        group_reward=judge,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    result = await trainer.step()
    assert sorted(judged) == [("ex-0", GROUP), ("ex-1", GROUP)]
    assert result.metrics["groups_judged"] == 2 and result.metrics["exceptions"] == 0
    shipped = tmp_path / "dry" / "m" / "step-00000" / "groups.jsonl"
    for line in shipped.read_text().splitlines():
        trajectories = json.loads(line)["trajectories"]
        assert [t["reward"] for t in trajectories] == pytest.approx(
            [0.1 * (k + 1) for k in range(GROUP)]
        )
        assert [t["metrics"]["independent_reward"] for t in trajectories] == [
            ray_agents._reward("It is 5.", k) for k in range(GROUP)
        ]


async def test_two_policies_on_ray_each_get_their_turns_and_rewards_from_the_workers(
    four: RayExecutor, servers, tmp_path
):
    """A Trainer of two policies with RayExecutor: the reward mapping each rollout returns on
    its worker comes back with the run, and each policy's groups ship to its own model with
    its own turns trainable and its own rewards. (Before the test below, which closes the
    shared executor.)"""
    from support.policy_runs import ModelsBackend, journaled_policies, model

    backend = ModelsBackend()
    trainer = at.Trainer(
        [
            at.Policy(model("planner-001", tmp_path), name="planner"),
            at.Policy(model("executor-001", tmp_path), name="executor"),
        ],
        backend,
        ray_agents.two_policies,
        examples(servers, 2),
        group_size=GROUP,
        groups_per_step=2,
        executor=four,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0
    assert sorted(name for name, _ in backend.trained) == ["executor-001", "planner-001"]
    expected = {
        "planner-001": ("planner", [float(k % 2) for k in range(GROUP)], "Let me add."),
        "executor-001": (
            "executor",
            [ray_agents._reward("It is 5.", k) for k in range(GROUP)],
            "It is 5.",
        ),
    }
    for name, (policy, rewards, own) in expected.items():
        groups = backend.groups(name)
        assert len(groups) == 2 and result.metrics[f"{policy}/groups_kept"] == 2
        for group in groups:
            assert [t.reward for t in group.trajectories] == rewards
            for t in group.trajectories:
                (choice,) = [c for c in t.messages_and_choices if isinstance(c, Choice)]
                assert choice.message.content == own and choice.model_extra["token_ids"]
    assert journaled_policies(tmp_path / "out") == {
        ("planner-001", "planner"),
        ("executor-001", "executor"),
    }
    for line in (tmp_path / "out/journal/step-00000/rollouts.jsonl").read_text().splitlines():
        run = json.loads(line)["trajectory"]
        k = run["metadata"]["rollout"]
        assert run["policy_rewards"] == {
            "planner": float(k % 2),
            "executor": ray_agents._reward("It is 5.", k),
        }


async def test_a_trainer_on_ray_journals_every_slot_once_saying_where_it_ran(
    four: RayExecutor, ray_cluster: RayCluster, servers, tmp_path, capsys
):
    dataset = examples(servers, 4)
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(tmp_path / ".art"),
    )
    backend = at.DryRunBackend(tmp_path / "dry")
    await model.register(backend)
    trainer = at.Trainer(
        model,
        backend,
        ray_agents.solve_async,
        dataset,
        group_size=GROUP,
        groups_per_step=2,
        executor=four,
        max_steps_off_policy=1,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    try:
        results = await trainer.train(num_steps=2)
    finally:
        trainer.close()

    for step in (0, 1):
        path = tmp_path / "out" / "journal" / f"step-{step:05d}" / "rollouts.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        slots = sorted(tuple(line["slot"]) for line in lines)
        assert slots == [(pos, k) for pos in range(2) for k in range(GROUP)]
        for line in lines:
            run = line["trajectory"]
            assert run["exception"] is None and run["reward"] is not None
            assert run["metadata"]["rollout"] == line["slot"][1]
            assert 0 <= step - run["metadata"]["policy_step"] <= 1  # pipelined, k=1
            assert [c["trainable"] for c in run["calls"]] == [True, True]
        assert (tmp_path / "dry" / "m" / f"step-{step:05d}" / "report.json").exists()
    assert [r.metrics["exceptions"] for r in results] == [0, 0]
    assert all(r.metrics["groups_kept"] == 2 for r in results)

    # where each run ran: in its metadata, shown and filtered by `arttrace runs` (and view)
    from arttrace.app.cli import main
    from arttrace.store import open_run

    with open_run(tmp_path / "out") as store:
        rows = store.trajectories(limit=None)
        assert len(rows) == 2 * 2 * GROUP
        assert {r.node_id for r in rows} <= set(ray_cluster.node_ids)
        assert {r.node_address for r in rows} == {"127.0.0.1"}
        assert all(isinstance(r.worker_pid, int) for r in rows)
        on = {node: store.count(node=node) for node in ray_cluster.node_ids}
        assert sum(on.values()) == len(rows) and store.count(node="127.0.0.1") == len(rows)
        assert [r.node_id for r in store.trajectories(node=rows[0].node_id, limit=None)] == [
            rows[0].node_id
        ] * on[rows[0].node_id]
    main(["runs", str(tmp_path / "out"), "--trajectories", "--node", rows[0].node_id])
    listed = capsys.readouterr().out.splitlines()
    assert "ran on" in listed[0] and len(listed) == 1 + on[rows[0].node_id]
    assert all(f"127.0.0.1 {rows[0].node_id[:8]} pid " in line for line in listed[1:])


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


async def test_a_client_inside_a_trainable_function_is_named_as_the_users_variable():
    """``@at.trainable``'s wrapper holds the user's function in its variable ``fn``: the
    message names the user's variable, as for an undecorated rollout."""
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")

    @at.trainable
    async def rollout(example: Any) -> float:
        await client.chat.completions.create(model="policy", messages=[])
        return 1.0

    async def calls_it(example: Any) -> float:
        return await rollout(example)

    try:
        for agent, named in (
            (rollout, "its variable 'client' (an openai.AsyncOpenAI) holds"),
            (
                calls_it,
                "the variable 'client' (an openai.AsyncOpenAI) that its variable "
                "'rollout' uses holds",
            ),
        ):
            with pytest.raises(at.ConfigurationError) as caught:
                RayExecutor().bind(RolloutRunner(agent, None, 1), [{"id": "a"}], 1)
            message = str(caught.value)
            assert f"{named} a threading.RLock at client._client." in message
            assert "'fn'" not in message
    finally:
        await client.close()


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


def test_the_default_pool_is_what_the_cluster_can_place_and_a_larger_one_is_said_once(
    ray_cluster: RayCluster, caplog
):
    """The Trainer's max_concurrency (32 by default) as the pool's size left actors pending
    for good on a small cluster: the default is what the nodes can hold (here the head node's
    one ``spare``); a max_in_flight past that is the user's, and said once."""
    runner = RolloutRunner(ray_agents.constant, None, 32)
    with caplog.at_level(logging.INFO, logger="arttrace"):
        for max_in_flight, size in ((None, 1), (3, 3)):
            executor = RayExecutor(num_cpus=0, resources={"spare": 1}, max_in_flight=max_in_flight)
            executor.bind(runner, [{"id": "a"}], 32)
            try:
                assert executor._pool is not None and len(executor._pool.members) == size
            finally:
                executor.close()
    said = [r.getMessage() for r in caplog.records if "RayExecutor:" in r.getMessage()]
    assert len(said) == 2, said
    room = "the cluster's nodes have room for 1 at a time (num_cpus=0, num_gpus=0, "
    assert said[0].startswith(
        f"arttrace: RayExecutor: 1 rollout actor(s), not the Trainer's max_concurrency=32: {room}"
    )
    assert said[1].startswith(
        f"arttrace: RayExecutor: 2 of the 3 rollout actors (max_in_flight) wait for room: {room}"
    )
    assert "spare=1" in said[0] and "an autoscaler adds nodes for them" in said[1]


def test_an_address_other_than_the_connected_clusters_is_said_to_be_ignored(
    ray_cluster: RayCluster, caplog
):
    """Ray keeps one connection per process: once it is connected (here, by the tests), an
    executor given another address uses the connected cluster, and says so."""
    runner = RolloutRunner(ray_agents.constant, None, 1)
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        for address in (ray_cluster.address, "127.0.0.1:1"):
            executor = RayExecutor(num_cpus=0, resources={"spare": 1}, address=address)
            executor.bind(runner, [{"id": "a"}], 1)
            executor.close()
    said = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert said == [
        "arttrace: RayExecutor(address='127.0.0.1:1') is ignored: this process is already "
        f"connected to the Ray cluster at {ray_cluster.address} (ray.init() was called first), "
        "and Ray keeps one connection per process. Call ray.shutdown() before the Trainer "
        "starts to use another cluster"
    ]


def test_a_rollout_from_a_module_the_workers_cannot_import_fails_at_bind_naming_it(
    ray_cluster: RayCluster, tmp_path, monkeypatch
):
    (tmp_path / "agent_only_here.py").write_text("async def rollout(example):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import agent_only_here

    runner = RolloutRunner(agent_only_here.rollout, None, 1)
    with pytest.raises(at.ConfigurationError) as caught:
        RayExecutor(num_cpus=0, max_in_flight=1).bind(runner, [{"id": "a"}], 1)
    message = str(caught.value)
    assert message.startswith("the rollout cannot be loaded on the Ray workers")
    assert "they cannot import module 'agent_only_here'" in message
    assert f"runtime_env={{'py_modules': [{str(tmp_path / 'agent_only_here.py')!r}]}}" in message

    # the fix the message gives works (a module object does too)
    executor = RayExecutor(
        num_cpus=0, max_in_flight=1, runtime_env={"py_modules": [agent_only_here]}
    )
    executor.bind(runner, [{"id": "a"}], 1)
    try:
        t = asyncio.run(executor.run("a", {"id": "a"}, lambda: {"rollout": 0}))
    finally:
        executor.close()
    assert (t.reward, t.exception) == (1.0, None)


_UNREACHABLE = """
import sys, time
import arttrace as at
from arttrace.executors import RayExecutor
from arttrace.executors._rollout import RolloutRunner

async def rollout(example):
    return 1.0

executor = RayExecutor(address="127.0.0.1:1")
started = time.monotonic()
try:
    executor.bind(RolloutRunner(rollout, None, 1), [{"id": "a"}], 1)
except at.ConfigurationError as error:
    print(f"{time.monotonic() - started:.1f}", error, file=sys.stderr)
"""


def test_an_unreachable_address_is_refused_within_seconds_naming_it(tmp_path):
    """A typo in the address: Ray alone retries it for about 14 minutes, naming another
    address (its own rewrite of 127.0.0.1). In its own process: this one is on the cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, "-c", _UNREACHABLE],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds, _, message = done.stderr.strip().splitlines()[-1].partition(" ")
    assert float(seconds) < 10, done.stderr
    assert message.startswith(
        "cannot reach the Ray cluster of RayExecutor(address=...) = '127.0.0.1:1': nothing "
        "accepts a connection at '127.0.0.1:1' (ConnectionRefusedError"
    )
    assert "Check the address (`ray status` on the head node prints it)" in message


def _where(t: at.Trajectory, ray_cluster: RayCluster) -> dict[str, Any]:
    """The node metadata ``t`` has, checked: one of the cluster's nodes, on loopback."""
    assert t.metadata["node_id"] in ray_cluster.node_ids
    return {"node_id": t.metadata["node_id"], "node_address": "127.0.0.1"}


LOST = "(ActorDiedError|ActorUnavailableError)"
"""How Ray reports a worker that died mid-call: from its death, or first from the dropped
connection (both are retried)."""


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


async def test_a_worker_killed_mid_rollout_is_retried_then_reported_when_no_retry_is_left(
    ray_cluster: RayCluster, tmp_path, caplog
):
    pids = tmp_path / "pids"
    executor = RayExecutor(num_cpus=0, max_in_flight=2, max_retries=2)
    executor.bind(RolloutRunner(ray_agents.killed_until_retried, None, 2), [{"id": "a"}], 2)
    example = {"id": "a", "pids": str(pids), "hang": 1}
    metadata = {"split": "train", "step": 0, "rollout": 3}
    try:
        with caplog.at_level(logging.WARNING, logger="arttrace"):
            run = asyncio.ensure_future(executor.run("a", example, lambda: metadata))
            killed = await asyncio.to_thread(_kill_when_written, pids, 1)
            t = await asyncio.wait_for(run, 60)
        # the first try was killed, the second ran on another worker and came back, once
        tries = [int(p) for p in pids.read_text().split()]
        assert tries[0] == killed and len(tries) == 2 and tries[1] != killed
        assert (t.reward, t.exception) == (1.0, None)
        assert t.metadata == {**metadata, **_where(t, ray_cluster), "worker_pid": tries[1]}
        [warning] = [
            r.getMessage() for r in caplog.records if "lost its Ray worker" in r.getMessage()
        ]
        assert re.search(f"lost its Ray worker: {LOST}: .*\\(attempt 2 of 3\\)", warning)
        assert "'a' (split train, step 0, rollout 3)" in warning

        caplog.clear()
        executor.max_retries = 0
        run = asyncio.ensure_future(executor.run("a", {**example, "hang": 9}, lambda: metadata))
        killed = await asyncio.to_thread(_kill_when_written, pids, 3)
        t = await asyncio.wait_for(run, 60)
    finally:
        executor.close()
    assert t.example_id == "a" and t.reward is None
    assert t.metadata == {**metadata, **_where(t, ray_cluster), "worker_pid": killed}  # last try
    assert t.exception is not None and re.fullmatch(LOST, t.exception["type"])
    assert "died on each of its 1 tries (max_retries=0)" in t.exception["message"]
    assert t.exception["type"] in t.exception["traceback"]
    assert not [r for r in caplog.records if "lost its Ray worker" in r.getMessage()]
    assert len(pids.read_text().split()) == 3


async def test_a_rollout_retried_after_its_worker_died_runs_before_the_ones_queued_behind_it(
    ray_cluster: RayCluster, tmp_path
):
    """One actor: ``a`` runs, ``b0``-``b2`` wait for it (the next step's rollouts, say). ``a``'s
    worker dies: its retry holds up its step, so it takes the next actor, not the queue's
    end."""
    log = tmp_path / "log"
    executor = RayExecutor(num_cpus=0, max_in_flight=1)
    executor.bind(RolloutRunner(ray_agents.queued, None, 1), [{"id": "a"}], 1)

    def run(name: str, **example: Any) -> asyncio.Future[at.Trajectory]:
        example = {"id": name, "log": str(log), **example}
        return asyncio.ensure_future(executor.run(name, example, lambda: {"rollout": 0}))

    try:
        first = run("a", hang=True)
        while not (log.exists() and log.read_text().endswith("\n")):
            await asyncio.sleep(0.05)
        behind = [run(f"b{i}") for i in range(3)]
        await asyncio.sleep(0.5)  # queued behind a
        os.kill(int(log.read_text().split()[1]), signal.SIGKILL)
        done = await asyncio.wait_for(asyncio.gather(first, *behind), 120)
    finally:
        executor.close()
    assert [(t.example_id, t.reward, t.exception) for t in done] == [
        (name, 1.0, None) for name in ("a", "b0", "b1", "b2")
    ]
    assert [line.split()[0] for line in log.read_text().splitlines()] == [
        "a", "a", "b0", "b1", "b2"
    ]  # fmt: skip


async def test_a_node_lost_mid_rollout_is_retried_on_a_healthy_node(
    ray_cluster: RayCluster, tmp_path, caplog
):
    doomed = ray_cluster.add_node(num_cpus=1, resources={"spare": 1})
    log = tmp_path / "log"
    # one actor on the head node and one on the doomed node: each holds its node's "spare"
    executor = RayExecutor(num_cpus=0, resources={"spare": 1}, max_in_flight=2)
    executor.bind(RolloutRunner(ray_agents.stuck_on_doomed_node, None, 2), [{"id": "a"}], 2)
    example = {"id": "a", "log": str(log), "doomed": doomed.node_id}
    try:
        with caplog.at_level(logging.WARNING, logger="arttrace"):
            runs = [
                asyncio.ensure_future(executor.run(f"r{k}", example, lambda k=k: {"rollout": k}))
                for k in range(2)
            ]
            while doomed.node_id not in (log.read_text() if log.exists() else ""):
                await asyncio.sleep(0.05)
            ray_cluster.cluster.remove_node(doomed, allow_graceful=False)
            done = await asyncio.wait_for(asyncio.gather(*runs), 60)
    finally:
        executor.close()
    assert [(t.example_id, t.reward, t.exception) for t in done] == [
        ("r0", 1.0, None),
        ("r1", 1.0, None),
    ]
    nodes = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(nodes) == sorted([doomed.node_id, *[ray_cluster.node_ids[0]] * 2])
    [warning] = [r.getMessage() for r in caplog.records if "lost its Ray worker" in r.getMessage()]
    assert re.search(f"lost its Ray worker: {LOST}: ", warning)
    assert re.search(r"rollout of 'r(\d)' \(rollout \1\) lost", warning)
    assert "(attempt 2 of 3)" in warning


async def test_a_dead_nodes_raylet_log_stays_off_the_drivers_terminal(
    ray_cluster: RayCluster, capsys, caplog
):
    """A node whose raylet is killed: its agents each send the driver the raylet's last log
    lines (~20 ``[state-dump]`` lines); a bound RayExecutor keeps them in the logs."""
    executor = RayExecutor(num_cpus=0, max_in_flight=1)
    executor.bind(RolloutRunner(ray_agents.constant, None, 1), [{"id": "a"}], 1)
    node = ray_cluster.add_node(num_cpus=1)
    printed = ""
    try:
        with caplog.at_level(logging.DEBUG, logger="arttrace"):
            node.all_processes["raylet"][0].process.kill()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                said = capsys.readouterr()
                printed += said.out + said.err
                reported = [
                    r for r in caplog.records if "reported a raylet's end" in r.getMessage()
                ]
                if reported or "Raylet is terminated" in printed:
                    break
                await asyncio.sleep(0.2)
    finally:
        executor.close()
        ray_cluster.cluster.remove_node(node, allow_graceful=False)
    assert "Raylet is terminated" not in printed and "(raylet)" not in printed
    assert (
        reported and "Raylet is terminated. Termination is unexpected" in reported[0].getMessage()
    )


_LOCAL = """
import asyncio, sys
import ray
import arttrace as at
from arttrace.executors._rollout import RolloutRunner

async def rollout(example):
    print("said by the rollout", flush=True)
    return 1.0

at.instrument()
executor = at.RayExecutor(max_in_flight=1)
executor.bind(RolloutRunner(rollout, None, 1), [{"id": "a"}], 1)
t = asyncio.run(executor.run("a", {"id": "a"}, lambda: {"rollout": 0}))
executor.close()
executor.close()
print("reward", t.reward, "ray still up:", ray.is_initialized(), file=sys.stderr)
"""


def test_with_no_cluster_it_starts_a_quiet_local_ray_and_shuts_it_down_on_close(tmp_path):
    """What a first run on a laptop does (its own process: this one is on the test cluster)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)  # Ray keeps the local instance's token in ~/.ray
    env.update(LOOPBACK)  # its Ray on 127.0.0.1 (Ray's token authentication on, as by default)
    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # its sessions' folders (short paths)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOCAL],
            env={**env, "RAY_TMPDIR": temp},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == ["reward 1.0 ray still up: False"]
    # (the rollout's print reaches this stdout through Ray's log monitor, asynchronously: a
    # driver that closes at once may end before it arrives, so it is not asserted)
    assert (tmp_path / ".ray" / "auth_token").exists()  # token auth on, without the warning


async def test_the_frozen_form_is_lossless_and_half_the_size_of_json():
    """What a worker sends back: token ids and logprobs packed, every float64 bit kept, each
    policy's reward too."""
    llm = ScriptedLLM(lambda request: Reply(" ".join(["token"] * 400)))
    client = openai.AsyncOpenAI(
        base_url="http://scripted/v1",
        api_key="k",
        http_client=httpx.AsyncClient(transport=llm.transport()),
    )
    messages: list[Any] = [{"role": "user", "content": "Go."}]
    with at.trajectory("ex-0", metadata={"step": 3}) as t:
        for _ in range(3):
            r = await at.trainable(client.chat.completions.create)(
                model="policy", messages=messages
            )
            messages += [r.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": "More."}]
        t.policy_rewards = {"planner": 0.25, "executor": 0.75}  # each policy's, and their mean
    await client.close()
    rng = random.Random(0)
    for call in t.calls:  # a real server's logprobs use every bit; ids of a 150k vocabulary
        for choice in call.choices:
            assert choice.logprobs is not None and choice.token_ids is not None
            choice.logprobs = array("d", [-rng.random() * 5 for _ in choice.logprobs])
            choice.token_ids = array("q", [rng.randrange(150_000) for _ in choice.token_ids])
    t.calls[0].choices[0].token_ids[0] = 2**40  # an id past 4 bytes is kept as it was

    frozen = freeze(t)
    assert thaw(frozen).to_dict() == t.to_dict()
    assert thaw(frozen).reward_for("planner") == 0.25 and thaw(frozen).reward == 0.5
    tokens = sum(c.completion_tokens for c in t.calls)
    as_json = len(json.dumps(t.to_dict()))
    assert len(frozen) / tokens < 0.5 * as_json / tokens


# -- the driver killed; the gateway on the workers ------------------------------------------


def test_a_driver_killed_mid_step_resumes_each_slot_once_training_a_subprocess_agent(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """examples/ray_gateway_trainer.py as the driver: each rollout starts a subprocess agent on
    a Ray worker, whose calls go to that worker's own gateway. Killed with SIGKILL mid-step,
    then run again (resume=True): every slot of the step is journaled exactly once, with the
    calls the workers' gateways recorded (exact tokens), and the step ships."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from gateway_trainer import calculator_model
    finally:
        sys.path.remove(str(EXAMPLES))
    out = tmp_path / "run"
    with serve(calculator_model()) as upstream:
        argv = (
            *("--address", ray_cluster.address, "--out", str(out)),
            *("--upstream", upstream.base_url, "--steps", "1"),
        )
        first = drivers().Process(target=run_example, args=("ray_gateway_trainer.py", *argv))
        first.start()
        rollouts = out / "journal" / "step-00000" / "rollouts.jsonl"
        deadline = time.monotonic() + 240
        while not (rollouts.exists() and rollouts.read_bytes().count(b"\n") >= 3):
            assert first.is_alive(), f"the driver exited with {first.exitcode}"
            assert time.monotonic() < deadline, "no rollout journaled in 240 s"
            time.sleep(0.05)
        first.kill()  # SIGKILL, mid-step: some slots journaled, others in flight
        first.join()
        assert rollouts.read_bytes().count(b"\n") < 8
        again = drivers().Process(target=run_example, args=("ray_gateway_trainer.py", *argv))
        again.start()
        again.join(400)
    assert again.exitcode == 0, again.exitcode

    step = out / "journal" / "step-00000"
    lines = [json.loads(line) for line in (step / "rollouts.jsonl").read_text().splitlines()]
    slots = [tuple(line["slot"]) for line in lines]
    assert sorted(slots) == [(p, k) for p in range(2) for k in range(4)]  # each once
    for line in lines:
        calls = line["trajectory"]["calls"]
        assert calls and {c["source"] for c in calls} == {"gateway"}
        assert all(c["choices"][0]["token_ids"] for c in calls if c["trainable"])
    assert (step / "shipped.json").exists()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0]
    assert metrics[0]["trainable_tokens"] > 0  # groups with signal shipped
