"""The Trainer: grouping, dropping, curriculum, validation, journal and resume, failures."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace._journal import Journal
from arttrace.testing import Reply, ScriptedLLM
from support.trainer import Agent, RecordingBackend, dataset, journaled, make


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


async def test_one_group_per_example_with_trainable_turns(tmp_path):
    backend = RecordingBackend()
    trainer = make(
        tmp_path,
        Agent(),
        backend,
        train_dataset=dataset(6),
        learning_rate=3e-5,
        train_kwargs={"kl_penalty_coef": 0.1},
    )
    result = await trainer.step()
    ((groups, kwargs),) = backend.calls
    assert kwargs == {"learning_rate": 3e-5, "kl_penalty_coef": 0.1}
    assert len(groups) == 3 and groups == result.groups
    for group in groups:
        ids = {t.metadata["example_id"] for t in group.trajectories}
        assert len(ids) == 1 and group.metadata["example_id"] in ids
        assert sorted(t.reward for t in group.trajectories) == [0.0, 0.0, 1.0, 1.0]
        for t in group.trajectories:
            user, choice = t.messages_and_choices
            assert isinstance(choice, Choice) and choice.logprobs is not None
            assert choice.message.content == "answer to " + user["content"]
    assert result.metrics["groups_kept"] == 3 and result.metrics["trainable_tokens"] > 0


async def test_group_size_one_still_never_mixes_examples(tmp_path):
    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3), group_size=1)
    result = await trainer.step()
    assert result.metrics["groups_total"] == 3 and result.metrics["groups_dropped"] == 3
    assert backend.calls == []  # one run per example: no spread, nothing to learn


async def test_groups_without_enough_spread_are_dropped_and_counted(tmp_path):
    def score(example: dict[str, Any], k: int) -> float:
        return {"ex-0": 0.5, "ex-1": 0.1 * (k % 2), "ex-2": float(k % 2)}[example["id"]]

    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(score), backend, train_dataset=dataset(3), min_reward_spread=0.5)
    result = await trainer.step()
    shipped = [g.metadata["example_id"] for g in backend.calls[0][0]]
    assert shipped == ["ex-2"]
    assert result.metrics["groups_dropped"] == 2 and result.metrics["groups_kept"] == 1


async def test_batches_are_seeded_epoch_aware_and_leave_the_global_rng_alone(tmp_path):
    random.seed(1234)
    before = random.getstate()
    trainer = make(tmp_path, Agent(), train_dataset=dataset(7), seed=3)
    epochs: dict[int, list[int]] = {}
    for step in range(trainer.steps_per_epoch * 2):
        epoch, indices = trainer.batch(step)
        epochs.setdefault(epoch, []).extend(indices)
    assert trainer.steps_per_epoch == 3
    assert all(sorted(v) == list(range(7)) for v in epochs.values())
    assert epochs[0] != epochs[1]
    again = make(tmp_path / "again", Agent(), train_dataset=dataset(7), seed=3)
    other = make(tmp_path / "other", Agent(), train_dataset=dataset(7), seed=4)
    assert [again.batch(s) for s in range(6)] == [trainer.batch(s) for s in range(6)]
    assert [other.batch(s) for s in range(6)] != [trainer.batch(s) for s in range(6)]
    assert random.getstate() == before


async def test_curriculum_selects_easy_first_and_expands_over_epochs(tmp_path):
    means = {"ex-0": 0.9, "ex-1": 0.5, "ex-2": 0.2}

    def score(example: dict[str, Any], k: int) -> float:  # spread 0.2 around each mean
        return means[example["id"]] + (0.1 if k % 2 else -0.1)

    backend = RecordingBackend()
    curriculum = at.Curriculum(
        initial_percentile=0.33, increment_percentile=0.33, expansion_interval=2
    )
    trainer = make(tmp_path, Agent(score), backend, train_dataset=dataset(3), curriculum=curriculum)
    results = await trainer.train(num_epochs=5)
    assert [r.epoch for r in results] == [0, 1, 2, 3, 4]
    assert all(r.groups == [] for r in results)  # not kept in memory: they are in the journal
    assert [r.metrics["curriculum_percentile"] for r in results] == pytest.approx(
        [0.33, 0.33, 0.66, 0.66, 0.99]
    )
    shipped = [[g.metadata["example_id"] for g in groups] for groups, _ in backend.calls]
    assert shipped == [
        ["ex-0"],
        ["ex-0"],
        ["ex-0", "ex-1"],
        ["ex-0", "ex-1"],
        ["ex-0", "ex-1", "ex-2"],
    ]
    assert [r.metrics["groups_excluded_by_curriculum"] for r in results] == [2, 2, 1, 1, 0]
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["curriculum"]["percentile"] == pytest.approx(0.99)
    assert state["curriculum"]["last_expansion_epoch"] == 4
    hard = at.Curriculum(initial_percentile=0.33, hard_first=True)
    groups = backend.calls[-1][0]
    assert [g.metadata["example_id"] for g in hard.select(groups)[0]] == ["ex-2"]


def test_curriculum_rejects_bad_settings():
    with pytest.raises(ValueError, match="initial_percentile"):
        at.Curriculum(initial_percentile=0)
    with pytest.raises(ValueError, match="expansion_interval"):
        at.Curriculum(expansion_interval=0)


@pytest.mark.parametrize(("num_steps", "every", "expected"), [(4, 2, [0, 2, 4]), (3, 2, [0, 2, 3])])
async def test_validation_schedule(tmp_path, num_steps, every, expected):
    agent = Agent()
    trainer = make(
        tmp_path, agent, train_dataset=dataset(3), val_dataset=[{"id": "v", "q": "val"}] * 2
    )
    await trainer.train(num_steps=num_steps, validate_every=every)
    lines = (tmp_path / "out" / "validation.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == expected
    assert all(json.loads(line)["examples"] == 2 for line in lines)


async def test_outputs_metrics_plot_and_state(tmp_path):
    trainer = make(tmp_path, Agent(), train_dataset=dataset(3), val_dataset=dataset(1))
    await trainer.train(num_steps=2)
    out = tmp_path / "out"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    for key in (
        "reward_mean",
        "reward_min",
        "reward_max",
        "reward_std",
        "groups_kept",
        "groups_dropped",
        "groups_total",
        "trajectories_scored",
        "exceptions",
        "trainable_tokens",
        "rollout_seconds",
        "train_seconds",
        "train/loss",
    ):
        assert key in metrics[0], key
    assert (out / "reward_plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "state.json").read_text())["completed_steps"] == 2
    with pytest.raises(ValueError, match="resume=True"):
        make(tmp_path, Agent(), train_dataset=dataset(3))


async def test_the_plot_is_redrawn_at_most_every_30_s_and_at_the_end_of_train(tmp_path):
    trainer = make(tmp_path, Agent(), train_dataset=dataset(3))
    plot = tmp_path / "out" / "reward_plot.png"
    await trainer.step()
    await trainer.flush()
    first = plot.read_bytes()
    await trainer.step()
    await trainer.flush()
    assert plot.read_bytes() == first  # a second step within 30 s: not redrawn
    await trainer.train(num_steps=3)
    assert plot.read_bytes() != first  # train() ends with a drawing of all three steps


async def test_journal_lines_read_back_exactly(tmp_path):
    """A NaN metric (which fast JSON encoders write as null) survives the journal."""
    agent = Agent()

    async def rollout(example: dict[str, Any]) -> float:
        at.current_trajectory().metrics["ratio"] = float("nan")
        at.current_trajectory().metrics["tokens"] = 7
        return await agent.rollout(example)

    trainer = make(tmp_path, agent, train_dataset=dataset(1))
    trainer.rollout = rollout
    await trainer.step()
    on_disk = Journal(tmp_path / "out").finished(0)
    assert len(on_disk) == 4
    for t in on_disk.values():
        assert math.isnan(t.metrics["ratio"]) and t.metrics["tokens"] == 7
        assert t.to_art().messages_and_choices[1].logprobs is not None


async def test_resume_after_a_crash_mid_step_loses_and_repeats_nothing(tmp_path):
    agent = Agent()
    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(3), max_concurrency=2)
    step = asyncio.ensure_future(trainer.step())
    while sum(agent.finished.values()) < 5:
        await asyncio.sleep(0.001)
    step.cancel()  # the process dies mid-step (Ctrl-C)
    with pytest.raises(asyncio.CancelledError):
        await step
    lines = journaled(tmp_path / "out", 0)
    assert len(lines) >= 5 and all(line["trajectory"]["reward"] is not None for line in lines)
    assert backend.calls == []
    # the process died while appending one more: the journal ends in a line cut short
    path = tmp_path / "out" / "journal" / "step-00000" / "rollouts.jsonl"
    done = {tuple(line["slot"]) for line in lines}
    torn = next((p, k) for p in range(3) for k in range(4) if (p, k) not in done)
    with path.open("a") as f:
        f.write(json.dumps({"slot": torn, "trajectory": lines[0]["trajectory"]})[:80])

    finished_before = sum(agent.finished.values())
    resumed = make(tmp_path, agent, backend, train_dataset=dataset(3), resume=True)
    result = await resumed.step()
    assert sum(agent.finished.values()) - finished_before == 12 - len(lines)
    ((groups, _),) = backend.calls
    assert sorted(len(g.trajectories) for g in groups) == [4, 4, 4]
    assert result.step == 0 and resumed.completed_steps == 1
    slots = [tuple(line["slot"]) for line in journaled(tmp_path / "out", 0)]  # all lines whole
    assert sorted(slots) == [(p, k) for p in range(3) for k in range(4)]


async def test_cancelling_a_step_cancels_in_flight_runs_and_resume_finishes_it(tmp_path, server):
    """Ctrl-C in step 1 while 5 of its runs have finished and 3 wait on the model over HTTP."""
    release, lock, answered = threading.Event(), threading.Lock(), [0]
    hold_after = 12 + 5  # step 0's 12 calls, then 5 of step 1's

    def reply(request: dict[str, Any]) -> Reply:
        with lock:
            answered[0] += 1
            held = answered[0] > hold_after
        if held:
            release.wait(30)
        return Reply("answer to " + request["messages"][-1]["content"])

    llm = ScriptedLLM(reply)
    agent = Agent(base_url=server(llm).base_url)
    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(6), max_concurrency=3)
    await trainer.step()
    before = asyncio.all_tasks()
    step = asyncio.ensure_future(trainer.step())
    while sum(agent.finished.values()) < hold_after or len(llm.requests) < hold_after + 3:
        await asyncio.sleep(0.001)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    await asyncio.sleep(0)  # let anything the step left behind show itself
    assert asyncio.all_tasks() <= before  # nothing of the step runs on
    assert agent.cancelled == 3  # the held runs saw the cancellation
    release.set()

    out = tmp_path / "out"
    directory = out / "journal" / "step-00001"
    assert sorted(p.name for p in directory.iterdir()) == ["rollouts.jsonl"]
    on_disk = Journal(out).finished(1)
    assert len(on_disk) == 5 and all(
        t.exception is None and t.reward is not None and t.to_art().messages_and_choices
        for t in on_disk.values()
    )
    per_example = Counter(t.example_id for t in on_disk.values())
    step1 = {trainer.example_id(trainer.train_dataset[i], i, "train") for i in trainer.batch(1)[1]}
    assert per_example == {e: n for e, n in agent.finished.items() if e in step1}
    assert len(backend.calls) == 1 and trainer.completed_steps == 1

    resumed = make(tmp_path, agent, backend, train_dataset=dataset(6), resume=True)
    finished_before = agent.finished.copy()
    result = await resumed.step()
    ran = agent.finished - finished_before
    assert ran == {e: 4 - per_example[e] for e in step1 if per_example[e] < 4}
    assert result.step == 1 and len(backend.calls) == 2
    assert sorted(len(g.trajectories) for g in backend.calls[1][0]) == [4, 4, 4]
    assert len(journaled(out, 1)) == 12 and (directory / "shipped.json").exists()
    await resumed.flush()
    await agent.client.close()


async def test_failing_rollouts_are_recorded_and_the_step_goes_on(tmp_path):
    agent = Agent()
    original = agent.rollout

    calls: Counter[str] = Counter()

    async def flaky(example: dict[str, Any]) -> float:
        calls[example["id"]] += 1
        crash = example["id"] == "ex-1" and calls["ex-1"] == 2
        reward = await original(example)
        if crash:
            raise RuntimeError("tool crashed")
        return reward

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(3))
    trainer.rollout = flaky
    result = await trainer.step()
    assert result.metrics["exceptions"] == 1
    (group,) = [g for g in backend.calls[0][0] if g.metadata["example_id"] == "ex-1"]
    assert len(group.trajectories) == 3
    assert (
        group.exceptions[0].type == "RuntimeError" and "tool crashed" in group.exceptions[0].message
    )


async def test_too_many_failures_fail_the_step_with_the_journal_kept(tmp_path):
    async def broken(example: dict[str, Any]) -> float:
        raise RuntimeError("down")

    trainer = make(tmp_path, Agent(), train_dataset=dataset(3), max_exceptions=2)
    trainer.rollout = broken
    with pytest.raises(at.TrainingError, match="12 of 12 rollouts raised") as error:
        await trainer.step()
    assert "most common cause (12 of 12): RuntimeError: down" in str(error.value)
    assert len(journaled(tmp_path / "out", 0)) == 12


async def test_missing_reward_is_a_clear_rollout_error(tmp_path):
    async def no_reward(example: dict[str, Any]) -> None:
        return None

    trainer = make(tmp_path, Agent(), train_dataset=dataset(1), max_exceptions=1.0)
    trainer.rollout = no_reward
    result = await trainer.step()
    assert result.metrics["exceptions"] == 4
    saved = journaled(tmp_path / "out", 0)[0]["trajectory"]
    assert "returned None and set no reward" in saved["exception"]["message"]


async def test_reward_fn_scores_outputs(tmp_path):
    agent = Agent()

    async def answer(example: dict[str, Any]) -> str:
        return await agent._solve(example["q"])

    backend = RecordingBackend()
    trainer = make(
        tmp_path,
        agent,
        backend,
        train_dataset=dataset(2),
        reward_fn=lambda example, output: float(output.endswith("0")),
    )
    trainer.rollout = answer
    result = await trainer.step()
    assert result.metrics["reward_mean"] == 0.5 and result.metrics["groups_dropped"] == 2


async def test_backend_failures_are_retried_then_fail_the_step_and_resume_ships(tmp_path):
    agent = Agent()
    flaky = RecordingBackend(failures=2)
    trainer = make(tmp_path / "a", agent, flaky, train_dataset=dataset(3))
    await trainer.model.register(flaky)
    result = await trainer.step()
    assert len(flaky.calls) == 1 and result.train_result.step == 1

    down = RecordingBackend(failures=10)
    trainer = make(tmp_path / "b", agent, down, train_dataset=dataset(3), train_retries=2)
    await trainer.model.register(down)
    with pytest.raises(at.TrainingError, match=r"failed 3 times.*resume=True"):
        await trainer.step()
    runs = sum(agent.finished.values())
    up = RecordingBackend()
    resumed = make(tmp_path / "b", agent, up, train_dataset=dataset(3), resume=True)
    await resumed.step()
    assert sum(agent.finished.values()) == runs  # nothing re-run
    assert len(up.calls) == 1 and sum(len(g.trajectories) for g in up.calls[0][0]) == 12


async def test_an_unregistered_model_is_a_clear_error_without_retries(tmp_path):
    backend = RecordingBackend(failures=1)  # as ART's backends refuse an unknown model
    trainer = make(
        tmp_path, Agent(), backend, train_dataset=dataset(3), train_retries=5, retry_delay=60
    )
    with pytest.raises(at.TrainingError, match=r"await model.register\(backend\)"):
        await trainer.step()
    assert backend.failures == 0  # asked once, not retried for minutes


def test_one_trainer_serves_several_event_loops(tmp_path):
    """A notebook or script may call asyncio.run once per step."""
    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(6), max_concurrency=2)
    for _ in range(2):
        asyncio.run(trainer.step())
    assert trainer.completed_steps == 2 and len(backend.calls) == 2


async def test_dry_run_backend_writes_what_art_would_train_on(tmp_path):
    def score(example: dict[str, Any], k: int) -> float:
        return 1.0 if example["id"] == "ex-0" else float(k % 2)

    backend = at.DryRunBackend(tmp_path / "dry")
    trainer = make(tmp_path, Agent(score), backend, train_dataset=dataset(3), min_reward_spread=-1)
    await trainer.model.register(backend)
    result = await trainer.step()
    # numbered as the journal and metrics number the step (step 0), not one ahead
    assert result.step == 0 and (tmp_path / "out" / "journal" / "step-00000").is_dir()
    assert sorted(p.name for p in (tmp_path / "dry" / "m").iterdir()) == ["step-00000"]
    report = json.loads((tmp_path / "dry" / "m" / "step-00000" / "report.json").read_text())
    assert report["step"] == 0 and result.train_result.step == 1  # ART: the model's step after
    assert report["groups"] == 2 and report["groups_with_signal"] == 2
    assert report["train_kwargs"] == {"learning_rate": 5e-6}
    assert all(g["trainable_tokens"] > 0 for g in report["per_group"])
    lines = (tmp_path / "dry" / "m" / "step-00000" / "groups.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert await backend._get_step(trainer.model) == 1
    assert await at.DryRunBackend(tmp_path / "dry")._get_step(trainer.model) == 1  # from disk


async def test_the_model_history_keeps_every_trainer_metric(tmp_path):
    """The backend's metrics (here DryRunBackend's `groups`, `trajectories`) go to the model's
    history beside the Trainer's, never over them."""

    def score(example: dict[str, Any], k: int) -> float:  # ex-0 teaches nothing: dropped
        return 1.0 if example["id"] == "ex-0" else float(k % 2)

    backend = at.DryRunBackend(tmp_path / "dry")
    trainer = make(tmp_path, Agent(score), backend, train_dataset=dataset(3), log_to_model=True)
    await trainer.model.register(backend)
    result = await trainer.step()
    await trainer.flush()
    history = Path(trainer.model._get_output_dir()) / "history.jsonl"
    (line,) = [json.loads(line) for line in history.read_text().splitlines()]
    ours = {k: v for k, v in result.metrics.items() if not k.startswith("train/")}
    for key, value in ours.items():
        assert line[f"train/{key}"] == value, key
    assert line["train/groups"] == 2.0 and line["train/trajectories"] == 8.0  # the backend's
    assert result.metrics["groups_total"] == 3 and result.metrics["trajectories_scored"] == 12
