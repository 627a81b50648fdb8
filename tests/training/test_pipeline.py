"""Pipelined training, ``Trainer(max_steps_off_policy=k)``: ``train()`` runs the rollouts of
the next ``k`` steps while a step trains, so neither waits for the other, yet no run samples
from a policy more than ``k`` steps older than the step that ships it; each step still ships
once and in order, from the journal, even when the process is killed with rollouts of two
steps in flight."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import art
import pytest

import arttrace as at
from arttrace._errors import ConfigurationError
from arttrace._journal import Journal
from arttrace.testing import LLMServer, Reply, ScriptedLLM
from support.art_server import FakeServerlessAPI
from support.trainer import (
    Agent,
    Hangs,
    RecordingBackend,
    SteppingBackend,
    dataset,
    journaled,
    make,
)


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


def model_url(server: Callable[[ScriptedLLM], LLMServer]) -> str:
    """The scripted model on a local server, answering as Agent's in-process one does."""
    return server(
        ScriptedLLM(lambda r: Reply("answer to " + r["messages"][-1]["content"]))
    ).base_url


def by_rollout(example: dict[str, Any], k: int) -> float:
    """A reward fixed by the run's place in its group (``rollout`` in its metadata), so a run
    re-run in another process scores as the one it replaces, and every group has spread."""
    return float(int(str(at.current_trajectory().metadata["rollout"])) % 2)


class SlowAgent(Agent):
    """Agent whose runs take ``seconds`` (its tools, its other calls) before the model call."""

    def __init__(self, seconds: float, base_url: str, score: Any = None) -> None:
        super().__init__(score, base_url)
        self.seconds = seconds

    async def rollout(self, example: dict[str, Any]) -> float:
        await asyncio.sleep(self.seconds)
        return await super().rollout(example)


class TimedBackend(SteppingBackend):
    """Trains for ``seconds`` (a GPU step takes time: the window pipelining fills), recording
    when each call began and returned."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.spans: list[tuple[float, float]] = []

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        began = time.time()
        await asyncio.sleep(self.seconds)
        result = await super().train(model, groups, **kwargs)
        self.spans.append((began, time.time()))
        return result


def runs(out: Path, step: int) -> list[dict[str, Any]]:
    """The journaled trajectories of ``step``."""
    return [line["trajectory"] for line in journaled(out, step)]


def lag(step: int, trajectory: dict[str, Any]) -> int:
    """How many steps behind ``step`` the policy the run sampled from is."""
    policy = trajectory["metadata"]["policy_step"]
    assert isinstance(policy, int)
    return step - policy


def metrics(out: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


# -- 1: the rollouts of the next k steps overlap training, never more -------------------------


@pytest.mark.parametrize("k", [0, 1, 2])
async def test_rollouts_overlap_training_but_never_sample_a_policy_more_than_k_steps_old(
    tmp_path, server, k
):
    backend = TimedBackend(0.2)
    agent = SlowAgent(0.05, model_url(server))
    trainer = make(
        tmp_path,
        agent,
        backend,
        train_dataset=dataset(4),
        group_size=2,
        groups_per_step=2,
        max_steps_off_policy=k,
    )
    await trainer.train(num_steps=4)  # 2 epochs
    out = tmp_path / "out"
    by_step = {s: runs(out, s) for s in range(4)}
    assert [len(v) for v in by_step.values()] == [4] * 4 and len(backend.spans) == 4

    lags = {s: [lag(s, t) for t in ts] for s, ts in by_step.items()}
    assert all(0 <= x <= k for xs in lags.values() for x in xs), lags
    assert max(x for xs in lags.values() for x in xs) == k  # it did use the staleness it may
    first_start = {s: min(t["started_at"] for t in ts) for s, ts in by_step.items()}
    for s, (_, trained) in enumerate(backend.spans):
        if s + k + 1 < 4:  # step s+k+1 samples from step s's training: it waits for it
            assert first_start[s + k + 1] >= trained, (s, k)
        if k and s + k < 4:  # while step s trains, the rollouts of step s+k already run
            assert first_start[s + k] < trained, (s, k)

    lines = metrics(out)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    for m in lines:
        s = m["step"]
        assert m["off_policy_steps_max"] == max(lags[s]) <= k
        assert m["off_policy_steps_mean"] == pytest.approx(sum(lags[s]) / 4)
        assert m["runs_stale_dropped"] == 0


async def test_a_run_queued_for_a_slot_records_the_policy_it_starts_on(tmp_path, server):
    """With fewer slots than runs, a run of step 1 queued behind others may start after step
    0 has trained: it samples from that newer policy, and says so."""
    backend = TimedBackend(0.2)
    trainer = make(
        tmp_path,
        SlowAgent(0.05, model_url(server)),
        backend,
        train_dataset=dataset(6),
        max_steps_off_policy=1,
        max_concurrency=2,
    )
    await trainer.train(num_steps=3)
    trained = [end for _, end in backend.spans]
    for s in range(3):
        for t in runs(tmp_path / "out", s):
            before = sum(end <= t["started_at"] for end in trained)
            # trained before it started; at most one step newer, its count not yet recorded
            assert before - 1 <= t["metadata"]["policy_step"] <= before, (s, t["metadata"])
    assert {t["metadata"]["policy_step"] for t in runs(tmp_path / "out", 1)} == {0, 1}


async def test_step_alone_stays_synchronous(tmp_path, server):
    """Pipelining is train()'s: step() runs its rollouts on the policy trained so far."""
    backend = TimedBackend(0.05)
    trainer = make(
        tmp_path,
        SlowAgent(0.01, model_url(server)),
        backend,
        train_dataset=dataset(6),
        max_steps_off_policy=2,
    )
    await trainer.step()
    await trainer.step()
    second = runs(tmp_path / "out", 1)
    assert {t["metadata"]["policy_step"] for t in second} == {1}
    assert min(t["started_at"] for t in second) >= backend.spans[0][1]
    assert not (tmp_path / "out" / "journal" / "step-00002").exists()


# -- 2: faster when rollouts and training take about as long ------------------------------------


async def test_the_wait_metrics_say_who_waited_for_whom(tmp_path, server):
    """Synchronous steps: the rollouts wait for every step's training; pipelined, for the
    last step's, with no step left to roll out. (That they overlap otherwise is the first
    test's; the speed-up is measured by bench/bench_scale.py, not timed here: under load,
    sleeps give only lower bounds.)"""
    seconds, url = 0.25, model_url(server)
    lines: dict[int, list[dict[str, Any]]] = {}
    for k in (0, 1):
        trainer = make(
            tmp_path / str(k),
            SlowAgent(seconds, url),
            TimedBackend(seconds),
            train_dataset=dataset(6),
            max_steps_off_policy=k,
        )
        await trainer.train(num_steps=4)
        lines[k] = metrics(tmp_path / str(k) / "out")
    assert lines[0][0]["trainer_wait_seconds"] >= seconds  # the first step waits in both
    assert lines[1][0]["trainer_wait_seconds"] >= seconds
    for m in lines[0]:  # synchronous: no rollout runs while a step trains
        assert m["rollout_wait_seconds"] >= 0.9 * seconds
    assert lines[1][-1]["rollout_wait_seconds"] >= 0.9 * seconds  # no step left to roll out


# -- 3: every run says which policy it sampled from --------------------------------------------


async def test_policy_step_is_in_the_journal_and_in_what_the_backend_trains_on(tmp_path, server):
    backend = TimedBackend(0.05)  # step 2's runs start while step 1 trains
    trainer = make(
        tmp_path,
        SlowAgent(0.01, model_url(server)),
        backend,
        train_dataset=dataset(6),
        max_steps_off_policy=1,
    )
    await trainer.train(num_steps=3)
    out = tmp_path / "out"
    # steps 0 and 1 start together on the base policy; step 2 once step 0 has trained
    assert [sorted({t["metadata"]["policy_step"] for t in runs(out, s)}) for s in range(3)] == [
        [0],
        [0],
        [1],
    ]
    assert len(backend.calls) == 3
    for s, (groups, _) in enumerate(backend.calls):
        on_disk = {
            (t["example_id"], t["metadata"]["rollout"]): t["metadata"]["policy_step"]
            for t in runs(out, s)
        }
        sent = {
            (t.metadata["example_id"], t.metadata["rollout"]): t.metadata["policy_step"]
            for g in groups
            for t in g.trajectories
        }
        assert sent == on_disk and len(sent) == 12


# -- 4: exactly once, killed with two steps in flight -------------------------------------------


ROLLOUT_SECONDS, TRAIN_SECONDS = 0.03, 0.2


class DurableBackend(RecordingBackend):
    """Trains for ``TRAIN_SECONDS`` and records each training in ``path`` (synced) halfway,
    as a real trainer's checkpoint lands before its call returns. Its step (``_get_step``) is
    what ``path`` holds, so a new process knows what a killed one trained."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def trained(self) -> list[dict[str, Any]]:
        text = self.path.read_text() if self.path.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    async def _get_step(self, model: Any) -> int:
        return len(self.trained())

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        await asyncio.sleep(TRAIN_SECONDS / 2)
        steps = sorted({t.metadata["step"] for g in groups for t in g.trajectories})
        line = json.dumps({"steps": steps, "groups": len(groups)}).encode() + b"\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        await asyncio.sleep(TRAIN_SECONDS / 2)
        return art.TrainResult(step=len(self.trained()), metrics={"loss": 0.5})


async def train_durably(tmp_path: Path, url: str, *, resume: bool) -> None:
    """4 steps of 2 groups of 2, two runs in flight at a time, k=1."""
    trainer = make(
        tmp_path,
        SlowAgent(ROLLOUT_SECONDS, url, by_rollout),
        DurableBackend(tmp_path / "trained.jsonl"),
        train_dataset=dataset(4),
        group_size=2,
        groups_per_step=2,
        max_concurrency=2,
        max_steps_off_policy=1,
        resume=resume,
    )
    await trainer.train(num_steps=4)


def train_in_child(tmp_path: Path, url: str) -> int:
    """A forked copy of this process, training. A fresh interpreter would spend ~20 s
    importing ART (torch, transformers) where bytecode is not cached; the fork has it loaded
    already and is killed as any process is."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    with open(tmp_path / "child.log", "w") as log:
        try:
            sys.stdout = sys.stderr = log
            asyncio.run(train_durably(tmp_path, url, resume=False))
            code = 0
        except BaseException:
            traceback.print_exc(file=log)
        finally:
            log.flush()
            os._exit(code)
    raise AssertionError("unreachable")  # for the type checker: the child never returns


def lines_in(path: Path) -> int:
    """Whole lines in ``path`` (a line being written is not counted)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def step_file(out: Path, step: int, name: str) -> Path:
    return out / "journal" / f"step-{step:05d}" / name


KILLS: dict[str, Callable[[Path], bool]] = {
    "mid-rollouts of the first step": lambda d: (
        lines_in(step_file(d / "out", 0, "rollouts.jsonl")) >= 2
    ),
    "rollouts of step 2 while step 1 trains": lambda d: (
        step_file(d / "out", 1, "shipping.json").exists()
        and 1 <= lines_in(step_file(d / "out", 2, "rollouts.jsonl")) < 4
    ),
    "step 1 trained, not yet recorded as shipped": lambda d: (
        lines_in(d / "trained.jsonl") == 2 and not step_file(d / "out", 1, "shipped.json").exists()
    ),
    "right after step 2 shipped": lambda d: step_file(d / "out", 2, "shipped.json").exists(),
}


@pytest.mark.parametrize("moment", list(KILLS))
def test_killed_with_steps_in_flight_the_resumed_run_journals_and_ships_each_once(
    tmp_path, server, moment
):
    url = model_url(server)
    pid = train_in_child(tmp_path, url)
    deadline, reached = time.monotonic() + 30, False
    try:
        while time.monotonic() < deadline:
            if KILLS[moment](tmp_path):
                reached = True
                break
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                pid = 0
                break
            time.sleep(0.001)
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    log = (tmp_path / "child.log").read_text()
    assert reached and pid, f"the run ended before {moment}: {log}"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, log

    asyncio.run(train_durably(tmp_path, url, resume=True))

    out = tmp_path / "out"
    slots = [[p, k] for p in range(2) for k in range(2)]
    for s in range(4):
        lines = journaled(out, s)
        assert sorted(line["slot"] for line in lines) == slots, (s, lines)  # each once
        assert len(Journal(out).finished(s)) == 4  # and the journal reads them back
        assert all(0 <= lag(s, line["trajectory"]) <= 1 for line in lines)
        assert step_file(out, s, "shipped.json").exists()
    trained = DurableBackend(tmp_path / "trained.jsonl").trained()
    assert trained == [{"steps": [s], "groups": 2} for s in range(4)]  # once each, in order
    assert [m["step"] for m in metrics(out)] == [0, 1, 2, 3]
    assert json.loads((out / "state.json").read_text())["completed_steps"] == 4


# -- 5: runs older than k when their step ships are left out ----------------------------------


async def test_runs_older_than_max_steps_off_policy_are_left_out_once_resumed_with_less(
    tmp_path, server
):
    """Step 1's runs sample from policy 0 while step 0 trains (k=1); the run stops before
    step 0 has trained and is resumed with k=0: those runs are a step too old."""
    url = model_url(server)
    hangs = Hangs()
    trainer = make(
        tmp_path,
        SlowAgent(0.02, url, by_rollout),
        hangs,
        train_dataset=dataset(6),
        max_concurrency=2,
        max_steps_off_policy=1,
    )
    out = tmp_path / "out"
    training = asyncio.ensure_future(trainer.train(num_steps=2))
    while len(journaled(out, 1)) < 4:
        await asyncio.sleep(0.001)
    training.cancel()  # Ctrl-C: step 0 never trained, step 1 is a third journaled
    with pytest.raises(asyncio.CancelledError):
        await training
    old = len(journaled(out, 1))
    assert 4 <= old <= 8 and {lag(1, t) for t in runs(out, 1)} == {1}

    backend = SteppingBackend()
    resumed = make(
        tmp_path,
        SlowAgent(0.02, url, by_rollout),
        backend,
        train_dataset=dataset(6),
        max_concurrency=2,
        max_steps_off_policy=0,
        resume=True,
    )
    with pytest.warns(at.NothingToTrainWarning) as warned:
        await resumed.train(num_steps=2)
    (stale,) = [w for w in warned if issubclass(w.category, at.NothingToTrainWarning)]
    message = str(stale.message)
    assert f"step 1: {old} runs" in message and "max_steps_off_policy=0" in message
    assert str(journal_file := out / "journal" / "step-00001" / "rollouts.jsonl") in message
    assert len(journal_file.read_text().splitlines()) == 12  # left out, not deleted

    first, second = metrics(out)
    assert first["runs_stale_dropped"] == 0 and second["runs_stale_dropped"] == old
    assert second["trajectories_scored"] == 12 - old
    assert second["off_policy_steps_max"] == 0  # what was trained on was on-policy
    _, (groups_1, _) = backend.calls
    shipped = [t.metadata["policy_step"] for g in groups_1 for t in g.trajectories]
    assert len(shipped) >= 4 and set(shipped) == {1}  # the last group ran in full after the resume


# -- 6: a bad setting is named ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_a_bad_max_steps_off_policy_is_a_configuration_error_naming_it(tmp_path, bad):
    with pytest.raises(ConfigurationError, match="max_steps_off_policy") as caught:
        make(tmp_path, Agent(), train_dataset=dataset(3), max_steps_off_policy=bad)
    assert repr(bad) in str(caught.value)
    assert not (tmp_path / "out").exists()  # refused before touching the run folder


# -- 7: validation on the policy trained so far -------------------------------------------------


async def test_validation_in_pipelined_training_runs_on_the_policy_trained_so_far(tmp_path, server):
    backend = TimedBackend(0.05)
    agent = SlowAgent(0.01, model_url(server))
    seen: list[tuple[int, int, int]] = []

    async def rollout(example: dict[str, Any]) -> float:
        metadata = at.current_trajectory().metadata
        if metadata["split"] == "val":  # its step, its policy, the steps the backend trained
            step, policy = int(str(metadata["step"])), int(str(metadata["policy_step"]))
            seen.append((step, policy, len(backend.calls)))
        return await agent.rollout(example)

    trainer = make(
        tmp_path,
        agent,
        backend,
        train_dataset=dataset(6),
        val_dataset=[{"id": f"v-{i}", "q": f"val {i}"} for i in range(2)],
        max_steps_off_policy=1,
    )
    trainer.rollout = rollout
    await trainer.train(num_steps=4, validate_every=2)
    out = tmp_path / "out"
    assert [v["step"] for v in metrics(out, "validation.jsonl")] == [0, 2, 4]
    assert sorted(seen) == [(s, s, s) for s in (0, 2, 4) for _ in range(2)]
    for s in range(4):
        assert all(0 <= lag(s, t) <= 1 for t in runs(out, s))


# -- 8: through ART's ServerlessBackend ----------------------------------------------------------


async def test_pipelined_training_through_serverless_backend_ships_each_step_once_in_order(
    tmp_path, server, monkeypatch
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # nothing leaves 127.0.0.1
    api = FakeServerlessAPI(api_key="wandb-key")
    try:
        backend = art.ServerlessBackend(base_url=api.base_url, api_key="wandb-key")
        trainer = make(
            tmp_path,
            SlowAgent(0.1, model_url(server), by_rollout),
            backend,
            train_dataset=dataset(4),
            group_size=2,
            groups_per_step=2,
            max_steps_off_policy=1,
        )
        await trainer.model.register(backend)
        await trainer.train(num_steps=3)
    finally:
        api.stop()
    posts = [r for r in api.requests if r == ("POST", "/v1/preview/training-jobs")]
    assert len(posts) == len(api.jobs) == 3
    out = tmp_path / "out"
    for s, job in enumerate(api.jobs):
        shipped = {
            (t["metadata"]["example_id"], t["metadata"]["rollout"]): t["metadata"]
            for g in job["trajectory_groups"]
            for t in g["trajectories"]
        }
        assert {m["step"] for m in shipped.values()} == {s}  # step s was job s+1
        on_disk = {(t["example_id"], t["metadata"]["rollout"]): t for t in runs(out, s)}
        assert shipped.keys() == on_disk.keys()
        assert all(
            m["policy_step"] == on_disk[key]["metadata"]["policy_step"]
            for key, m in shipped.items()
        )
    lines = metrics(out)
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert [m["off_policy_steps_max"] for m in lines] == [0, 1, 1]
    for m in lines[1:]:  # each job takes a second: the next step's runs were ready by then
        assert m["trainer_wait_seconds"] < 0.5 and m["train_seconds"] >= 1
    assert not math.isnan(lines[0]["off_policy_steps_mean"])
