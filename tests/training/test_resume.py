"""The Trainer's durability: resume only with the run's settings, ship each step exactly once,
one Trainer per run folder, damaged files named, retries only for transient failures, a time
limit on backend.train, what ships is what the journal holds, files for the user only."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

import art
import httpx
import openai
import pytest

import arttrace as at
from arttrace._errors import ConfigurationError, JournalError, ResumeError, RunLockedError
from arttrace._journal import Journal
from support.trainer import (
    Agent,
    Hangs,
    RecordingBackend,
    SteppingBackend,
    dataset,
    hold_lock,
    journaled,
    make,
)


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


class Killed(BaseException):
    """The process dying at this point (nothing after it runs, nothing catches it)."""


async def crash_mid_step(trainer: at.Trainer[Any], agent: Agent, finished: int) -> None:
    """Ctrl-C in a step once ``finished`` runs have finished."""
    before = sum(agent.finished.values())
    step = asyncio.ensure_future(trainer.step())
    while sum(agent.finished.values()) - before < finished:
        await asyncio.sleep(0.001)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step


# -- 4.2: resume only with the settings the run started with ---------------------------------


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"seed": 1}, "seed: 0 when the run started, 1 now"),
        ({"group_size": 2}, "group_size: 4 when the run started, 2 now"),
        ({"groups_per_step": 2}, "groups_per_step: 3 when the run started, 2 now"),
        ({"train_dataset": dataset(6)[::-1]}, "dataset: (examples=6, ids_sha256="),
        ({"train_dataset": dataset(5)}, "examples=6, "),
        ({"curriculum": at.Curriculum()}, "curriculum: none when the run started"),
    ],
)
async def test_resume_with_other_settings_is_refused_naming_the_difference(
    tmp_path, changed, named
):
    agent = Agent()
    trainer = make(tmp_path, agent, train_dataset=dataset(6), max_concurrency=2)
    await crash_mid_step(trainer, agent, 5)  # step 0 half done: its runs are in the journal
    settings = {"train_dataset": dataset(6), "resume": True, **changed}
    with pytest.raises(ResumeError, match="started with other settings") as caught:
        make(tmp_path, agent, **settings)
    assert named in str(caught.value) and isinstance(caught.value, ValueError)
    assert len(str(caught.value).split(" now")) == 2  # only the one difference is named
    resumed = make(tmp_path, agent, train_dataset=dataset(6), resume=True)
    result = await resumed.step()  # the same settings resume
    for group in result.groups:
        assert {t.metadata["example_id"] for t in group.trajectories} == {
            group.metadata["example_id"]
        }


async def test_a_crashed_first_step_is_a_run_too(tmp_path):
    """Killed in step 0, before any step completed: a new Trainer without resume=True must
    not pick its runs up as its own."""
    agent = Agent()
    trainer = make(tmp_path, agent, train_dataset=dataset(6), max_concurrency=2)
    await crash_mid_step(trainer, agent, 3)
    with pytest.raises(ConfigurationError, match=r"already holds a run \(0 steps\)"):
        make(tmp_path, agent, train_dataset=dataset(6), seed=5)


async def test_a_journal_whose_runs_sit_under_other_examples_is_refused(tmp_path):
    """A run folder saved without settings (an older arttrace): each journaled run's example
    is still checked against its place in the batch."""
    agent = Agent()
    trainer = make(tmp_path, agent, train_dataset=dataset(6), max_concurrency=2)
    await crash_mid_step(trainer, agent, 5)
    state_path = tmp_path / "out" / "state.json"
    state = json.loads(state_path.read_text())
    del state["settings"]
    state_path.write_text(json.dumps(state))
    resumed = make(tmp_path, agent, train_dataset=dataset(6), seed=7, resume=True)
    with pytest.raises(ResumeError, match=r"holds a run of 'ex-\d' at place \[\d, \d\] of step 0"):
        await resumed.step()


# -- 4.3 and 4.14: each step is trained exactly once -------------------------------------------


class TrainsThenDies(at.DryRunBackend):
    """DryRunBackend whose process dies right after it trained (before train returns)."""

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        await super().train(model, groups, **kwargs)
        raise Killed


def trained_steps(dry: Path) -> list[Path]:
    """DryRunBackend's folders, one per train() call."""
    return sorted(p.parent for p in (dry / "m").glob("step-*/report.json"))


async def registered(trainer: at.Trainer[Any]) -> at.Trainer[Any]:
    await trainer.model.register(trainer.backend)
    return trainer


@pytest.mark.parametrize("dies", ["in train, after training", "after train returned"])
async def test_killed_after_training_the_resumed_run_does_not_train_again(
    tmp_path, monkeypatch, caplog, dies
):
    dry = tmp_path / "dry"
    backend = TrainsThenDies(dry) if dies.startswith("in") else at.DryRunBackend(dry)
    trainer = await registered(make(tmp_path, Agent(), backend, train_dataset=dataset(3)))
    if dies.startswith("after"):

        def die(*args: Any) -> None:
            raise Killed

        monkeypatch.setattr(Journal, "mark_shipped", die)  # killed before recording it
    with pytest.raises(Killed):
        await trainer.step()
    monkeypatch.undo()
    assert len(trained_steps(dry)) == 1

    fresh = at.DryRunBackend(dry)  # a new process: the backend knows only what is on disk
    resumed = await registered(
        make(tmp_path, Agent(), fresh, train_dataset=dataset(3), resume=True)
    )
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        result = await resumed.step()
    assert result.step == 0 and result.train_result is None
    assert len(trained_steps(dry)) == 1  # not trained twice
    assert "not shipped again" in caplog.text
    await resumed.step()
    _, second = trained_steps(dry)
    report = json.loads((second / "report.json").read_text())
    batch = {resumed.example_id(resumed.train_dataset[i], i, "train") for i in resumed.batch(1)[1]}
    assert {g["example_id"] for g in report["per_group"]} == batch  # the second is step 1


async def test_killed_before_the_backend_trained_the_resumed_run_ships(tmp_path):
    agent, hangs = Agent(), Hangs()
    trainer = make(tmp_path, agent, hangs, train_dataset=dataset(3))
    step = asyncio.ensure_future(trainer.step())
    await hangs.entered.wait()
    step.cancel()  # Ctrl-C while train hangs: nothing was trained
    with pytest.raises(asyncio.CancelledError):
        await step
    up = SteppingBackend()
    resumed = make(tmp_path, agent, up, train_dataset=dataset(3), resume=True)
    result = await resumed.step()
    assert len(up.calls) == 1 and result.train_result is not None
    assert sorted(len(g.trajectories) for g in up.calls[0][0]) == [4, 4, 4]


async def test_a_call_that_failed_after_training_is_not_retried(tmp_path, caplog):
    """The connection dropped after the backend trained: the retry asks first."""

    class AnswerLost(SteppingBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
            await super().train(model, groups, **kwargs)
            raise httpx.RemoteProtocolError("Server disconnected without sending a response")

    backend = AnswerLost()
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3))
    await trainer.model.register(backend)
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        result = await trainer.step()
    assert len(backend.calls) == 1 and result.train_result is None
    assert "not shipped again" in caplog.text and trainer.completed_steps == 1


async def test_a_backend_that_cannot_say_is_not_trained_twice_silently(tmp_path):
    """Killed during train on a backend without _get_step: the resume stops and says how to
    go on, rather than guess."""

    class Dies(RecordingBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
            await super().train(model, groups, **kwargs)
            raise Killed

    trainer = make(tmp_path, Agent(), Dies(), train_dataset=dataset(3))
    with pytest.raises(Killed):
        await trainer.step()
    backend = RecordingBackend()
    resumed = make(tmp_path, Agent(), backend, train_dataset=dataset(3), resume=True)
    shipping = tmp_path / "out" / "journal" / "step-00000" / "shipping.json"
    with pytest.raises(at.TrainingError, match=f"delete {shipping} and run again") as caught:
        await resumed.step()
    assert "has no _get_step" in str(caught.value) and backend.calls == []
    shipping.rename(shipping.with_name("shipped.json"))  # the user knows it trained
    await resumed.step()
    assert backend.calls == [] and resumed.completed_steps == 1


@pytest.mark.parametrize(
    ("garbage", "named"),
    [
        ({"loss": 0.1}, "{'loss': 0.1}"),
        (art.TrainResult(1, None), "TrainResult(step=1, metrics=None)"),
    ],
)
async def test_garbage_from_train_fails_the_step_and_the_resume_trains_again(
    tmp_path, garbage, named
):
    class Garbage(SteppingBackend):
        async def train(self, model: Any, groups: Any, **kwargs: Any) -> Any:
            return garbage  # not what ART's train returns, and its step did not move

    agent = Agent()
    trainer = make(tmp_path, agent, Garbage(), train_dataset=dataset(3))
    with pytest.raises(at.TrainingError, match=f"returned {re.escape(named)}, not an art"):
        await trainer.step()
    assert trainer.completed_steps == 0
    up = SteppingBackend()
    runs = sum(agent.finished.values())
    resumed = make(tmp_path, agent, up, train_dataset=dataset(3), resume=True)
    await resumed.step()
    assert len(up.calls) == 1 and sum(agent.finished.values()) == runs


async def test_a_hanging_backend_times_out_and_the_groups_are_kept(tmp_path):
    agent = Agent()
    trainer = make(tmp_path, agent, Hangs(), train_dataset=dataset(3), train_timeout=0.05)
    with pytest.raises(at.TrainingError, match=r"did not return within train_timeout=0.05 s"):
        await trainer.step()
    assert len(journaled(tmp_path / "out", 0)) == 12
    up = SteppingBackend()
    resumed = make(tmp_path, agent, up, train_dataset=dataset(3), resume=True)
    await resumed.step()
    assert sum(len(g.trajectories) for g in up.calls[0][0]) == 12


def test_train_timeout_must_be_positive(tmp_path):
    with pytest.raises(ConfigurationError, match="train_timeout must be a positive"):
        make(tmp_path, Agent(), train_dataset=dataset(3), train_timeout=0)


# -- 4.10: only transient failures are retried ---------------------------------------------------


def _response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", "http://art.invalid/v1/train"))


TRANSIENT = [
    ConnectionError("refused"),
    httpx.ConnectError("refused"),
    httpx.ReadTimeout("slow"),
    openai.APIConnectionError(request=httpx.Request("POST", "http://art.invalid")),
    openai.InternalServerError("boom", response=_response(503), body=None),
    openai.RateLimitError("slow down", response=_response(429), body=None),
    httpx.HTTPStatusError("bad gateway", request=_response(502).request, response=_response(502)),
]
PERMANENT = [
    TypeError("train() got an unexpected keyword argument 'lerning_rate'"),
    ValueError("ServerlessBackend requires adam_params=None."),
    openai.BadRequestError("bad", response=_response(400), body=None),
    httpx.HTTPStatusError("not found", request=_response(404).request, response=_response(404)),
]


class FailsOnce(RecordingBackend):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error, self.attempts = error, 0

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        self.attempts += 1
        if self.attempts == 1:
            raise self.error
        return await super().train(model, groups, **kwargs)


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
async def test_transient_failures_are_retried(tmp_path, error):
    backend = FailsOnce(error)
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3))
    await trainer.model.register(backend)
    result = await trainer.step()
    assert backend.attempts == 2 and result.train_result is not None


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
async def test_other_failures_fail_at_once_with_their_cause(tmp_path, error):
    backend = FailsOnce(error)
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3), retry_delay=60)
    await trainer.model.register(backend)
    with pytest.raises(at.TrainingError, match="which retrying cannot fix") as caught:
        await trainer.step()
    assert backend.attempts == 1 and caught.value.__cause__ is error
    assert repr(error) in str(caught.value)


# -- 4.4: one Trainer per run folder ---------------------------------------------------------------


async def test_a_second_trainer_on_the_folder_is_refused_with_the_holder(tmp_path):
    agent, gate = Agent(), asyncio.Event()

    async def waits(example: dict[str, Any]) -> float:
        await gate.wait()
        return await agent.rollout(example)

    first = make(tmp_path, agent, train_dataset=dataset(3))
    first.rollout = waits
    step = asyncio.ensure_future(first.step())
    while not (tmp_path / "out" / "state.json").exists():
        await asyncio.sleep(0.001)
    folder = tmp_path / "out"
    with pytest.raises(RunLockedError, match=f"{folder} is in use by process {os.getpid()}"):
        make(tmp_path, agent, train_dataset=dataset(3), resume=True)
    gate.set()
    await step
    second = make(tmp_path, agent, train_dataset=dataset(3), resume=True)
    await second.step()  # the folder is free once the first is done
    with pytest.raises(RunLockedError, match="another Trainer advanced the run"):
        await first.step()  # its idea of the run is out of date


async def test_a_trainer_meets_another_process_holding_the_folder(tmp_path):
    holder = hold_lock(tmp_path / "out")
    try:
        with pytest.raises(RunLockedError, match=f"in use by process {holder.pid}"):
            make(tmp_path, Agent(), train_dataset=dataset(3))
    finally:
        holder.kill()  # it dies: the OS releases its lock
        holder.wait()
    await make(tmp_path, Agent(), train_dataset=dataset(3)).step()


# -- 4.5: damaged files are named; torn last lines are cut off ----------------------------------


async def test_torn_last_lines_of_metrics_and_validation_are_cut_off_on_resume(tmp_path, caplog):
    agent = Agent()
    val = [{"id": "v", "q": "val"}]
    trainer = make(tmp_path, agent, train_dataset=dataset(3), val_dataset=val)
    await trainer.train(num_steps=1)
    out = tmp_path / "out"
    for name in ("metrics.jsonl", "validation.jsonl"):
        with (out / name).open("a") as f:
            f.write('{"step": 1, "reward_m')  # the process died writing it
    resumed = make(tmp_path, agent, train_dataset=dataset(3), val_dataset=val, resume=True)
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        await resumed.train(num_steps=2)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validation = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert [v["step"] for v in validation] == [0, 1, 2]
    assert "cut short" in caplog.text


async def test_garbage_in_the_middle_of_the_journal_names_file_and_line(tmp_path):
    agent = Agent()
    trainer = make(tmp_path, agent, train_dataset=dataset(3), max_concurrency=2)
    await crash_mid_step(trainer, agent, 5)
    path = tmp_path / "out" / "journal" / "step-00000" / "rollouts.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], b"\x00\x00garbage\xff\n", *lines[1:]]))
    resumed = make(tmp_path, agent, train_dataset=dataset(3), resume=True)
    with pytest.raises(JournalError, match=f"{path}, line 2: not a line of JSON"):
        await resumed.step()


async def test_a_metrics_line_lost_between_the_state_and_the_line_is_put_back(
    tmp_path, monkeypatch
):
    """Killed after the step was recorded, before its metrics line was written."""
    from arttrace.training._report import Reporter

    trainer = make(tmp_path, Agent(), train_dataset=dataset(3))

    def die(*args: Any) -> None:
        raise Killed

    monkeypatch.setattr(Reporter, "append", die)
    with pytest.raises(Killed):
        await trainer.step()
    monkeypatch.undo()
    make(tmp_path, Agent(), train_dataset=dataset(3), resume=True)
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0]
    assert json.loads(lines[0])["train/loss"] == 0.5


# -- 4.13: what ships is what the journal holds ----------------------------------------------------


async def test_a_run_changed_after_it_was_journaled_ships_as_journaled(tmp_path):
    """Work the rollout left behind (a fire-and-forget call, a late scorer) touches its
    trajectory after the run closed: the shipped group must still match the journal."""
    agent = Agent()
    late: list[asyncio.Task[None]] = []

    async def rollout(example: dict[str, Any]) -> float:
        t = at.current_trajectory()

        async def afterwards() -> None:
            while t.ended_at is None:  # the run closed, and was journaled at once
                await asyncio.sleep(0)
            t.metrics["late"] = 1
            t.metadata["late"] = "yes"

        late.append(asyncio.ensure_future(afterwards()))
        return await agent.rollout(example)

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(3))
    trainer.rollout = rollout
    await trainer.step()
    assert all(task.done() for task in late)
    ((groups, _),) = backend.calls
    shipped = {
        (t.metadata["example_id"], t.metadata["rollout"]): t for g in groups for t in g.trajectories
    }
    for line in journaled(tmp_path / "out", 0):
        on_disk = at.Trajectory.from_dict(line["trajectory"]).to_art()
        sent = shipped[on_disk.metadata["example_id"], on_disk.metadata["rollout"]]
        assert sent.metrics == on_disk.metrics and "late" not in sent.metrics
        assert sent.metadata == on_disk.metadata


# -- 4.16: files holding prompts are for the user only ---------------------------------------------


async def test_run_folder_and_files_are_for_the_user_only(tmp_path):
    old = os.umask(0o022)
    try:
        dry = tmp_path / "dry"
        backend = at.DryRunBackend(dry)
        val = [{"id": "v", "q": "val"}]
        trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3), val_dataset=val)
        await trainer.model.register(backend)
        await trainer.train(num_steps=1)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    (trained,) = trained_steps(dry)
    files = [
        out / "metrics.jsonl",
        out / "validation.jsonl",
        out / "state.json",
        out / "journal" / "step-00000" / "rollouts.jsonl",
        trained / "groups.jsonl",
        trained / "report.json",
    ]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (out, out / "journal", out / "journal" / "step-00000", trained):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
