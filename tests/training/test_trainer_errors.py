"""The mistakes a new user makes with the Trainer: each works, or fails at once with the fix."""

from __future__ import annotations

import inspect
import json
import math
import re
import threading
from collections.abc import Iterator
from typing import Any

import art
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM
from support.common import warnings_are_errors
from support.trainer import Agent, RecordingBackend, dataset, make


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


async def test_a_sync_rollout_runs_in_a_thread_in_the_runs_context(tmp_path, clients):
    """A sync agent (sync OpenAI client) is a valid rollout: it runs in a worker thread, at most
    max_concurrency at a time, and its calls and reward belong to its run."""
    client, _ = clients(ScriptedLLM(lambda r: Reply("answer to " + r["messages"][-1]["content"])))
    lock, active, peak, threads = threading.Lock(), [0], [0], set()

    @at.trainable
    def solve(question: str) -> str:
        r = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": question}]
        )
        return r.choices[0].message.content or ""

    def rollout(example: dict[str, Any]) -> str:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            threads.add(threading.current_thread().name)
            k = at.current_trajectory().metadata["rollout"]
        try:
            answer = solve(example["q"])
        finally:
            with lock:
                active[0] -= 1
        at.current_trajectory().reward = float(k) % 2  # type: ignore[arg-type]
        return answer

    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(3), max_concurrency=3)
    trainer.rollout = rollout
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0 and result.metrics["groups_kept"] == 3
    for group in backend.calls[0][0]:
        assert sorted(t.reward for t in group.trajectories) == [0.0, 0.0, 1.0, 1.0]
        for t in group.trajectories:
            user, choice = t.messages_and_choices
            assert choice.logprobs is not None  # type: ignore[union-attr]
            assert choice.message.content == "answer to " + user["content"]  # type: ignore[index,union-attr]
    assert peak[0] <= 3 and all(name.startswith("arttrace-rollout") for name in threads)


async def test_a_sync_function_returning_a_coroutine_is_awaited(tmp_path):
    agent = Agent()
    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(2))
    trainer.rollout = lambda example: agent.rollout(example)
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0 and result.metrics["groups_kept"] == 2


def test_what_cannot_be_a_rollout_is_refused_at_construction(tmp_path):
    async def agen(example: Any) -> Any:
        yield 1.0

    def gen(example: Any) -> Iterator[float]:
        yield 1.0

    for bad, says in [
        (agen, "'agen' is a generator function"),
        (gen, "'gen' is a generator function"),
        ("solve", "rollout must be a function of one example, got str"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            at.Trainer(None, RecordingBackend(), bad, dataset(1), output_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reward_fn must be a function of"):
        at.Trainer(
            None,  # type: ignore[arg-type]
            RecordingBackend(),
            Agent().rollout,
            dataset(1),
            reward_fn=1.0,  # type: ignore[arg-type]
            output_dir=tmp_path,
        )


def test_datasets_are_read_once_and_an_empty_one_is_refused(tmp_path):
    model: Any = None
    with pytest.raises(ValueError, match=r"train_dataset is empty.*generator already consumed"):
        at.Trainer(model, RecordingBackend(), Agent().rollout, iter([]), output_dir=tmp_path)
    examples = (e for e in dataset(5))
    exhausted = list(examples)
    with pytest.raises(ValueError, match="train_dataset is empty"):
        at.Trainer(model, RecordingBackend(), Agent().rollout, examples, output_dir=tmp_path)
    with pytest.raises(ValueError, match="val_dataset must be an iterable of examples"):
        at.Trainer(
            model,
            RecordingBackend(),
            Agent().rollout,
            exhausted,
            val_dataset=3,
            output_dir=tmp_path,
        )
    trainer = make(tmp_path, Agent(), train_dataset=(e for e in exhausted), groups_per_step=2)
    assert trainer.steps_per_epoch == 3
    epoch_of = [trainer.batch(s) for s in range(6)]
    assert sorted(i for epoch, batch in epoch_of if epoch == 1 for i in batch) == list(range(5))


async def test_a_generator_dataset_trains_over_several_epochs(tmp_path):
    backend = RecordingBackend()
    trainer = make(tmp_path, Agent(), backend, train_dataset=(e for e in dataset(2)))
    results = await trainer.train(num_epochs=2)
    assert [r.epoch for r in results] == [0, 1] and len(backend.calls) == 2


async def test_a_rollout_that_opens_its_own_trajectory_is_the_run(tmp_path):
    """The README quickstart's `with at.trajectory(...) as t:` pasted into a rollout trains."""
    agent = Agent()
    rewards = iter([1.0, 0.0, 1.0, 0.0])

    async def rollout(example: dict[str, Any]) -> None:
        with at.trajectory(example["id"], metadata={"source": "script"}) as t:
            await agent._solve(example["q"])
            t.reward = next(rewards)
        assert at.current_trajectory() is t  # the run goes on until the Trainer closes it

    backend = RecordingBackend()
    trainer = make(tmp_path, agent, backend, train_dataset=dataset(1), max_concurrency=1)
    trainer.rollout = rollout
    result = await trainer.step()
    assert result.metrics["exceptions"] == 0
    [(groups, _)] = backend.calls
    [group] = groups
    assert sorted(t.reward for t in group.trajectories) == [0.0, 0.0, 1.0, 1.0]
    for t in group.trajectories:
        assert t.metadata["example_id"] == "ex-0" and t.metadata["source"] == "script"
        assert any(isinstance(m, Choice) for m in t.messages_and_choices)  # trainable turn


def test_a_trajectory_opened_outside_a_trainer_run_stays_its_own(tmp_path):
    with at.trajectory("outer") as outer, at.trajectory("inner") as inner:
        assert at.current_trajectory() is inner is not outer
    assert outer.ended_at is not None and inner.ended_at is not None


def test_an_unknown_keyword_is_refused_with_the_closest_name(tmp_path):
    agent = Agent()
    with pytest.raises(TypeError, match=r"'groups_per_stp' \(did you mean 'groups_per_step'\?\)"):
        make(tmp_path, agent, train_dataset=dataset(1), groups_per_stp=4)
    # backend.train's keywords go in train_kwargs: the old spelling says so
    with pytest.raises(TypeError, match=r"train_kwargs=\{'kl_penalty_coef': \.\.\.\}"):
        make(tmp_path, agent, train_dataset=dataset(1), kl_penalty_coef=0.1)
    with pytest.raises(ValueError, match="learning_rate is the Trainer's own argument"):
        make(tmp_path, agent, train_dataset=dataset(1), train_kwargs={"learning_rate": 1e-5})
    with pytest.raises(ValueError, match="train_kwargs must be a mapping"):
        make(tmp_path, agent, train_dataset=dataset(1), train_kwargs=["kl_penalty_coef"])

    serverless = art.ServerlessBackend(base_url="http://127.0.0.1:9/v1", api_key="k")
    # checked against the backend's own train signature, naming the closest keyword
    with pytest.raises(ValueError, match=r"'kl_penalty_coeff' \(did you mean 'kl_penalty_coef'"):
        make(
            tmp_path,
            agent,
            serverless,
            train_dataset=dataset(1),
            train_kwargs={"kl_penalty_coeff": 0.1},
        )
    # LocalBackend takes it, ServerlessBackend does not
    with pytest.raises(ValueError, match=r"ServerlessBackend.train\(\) does not accept"):
        make(
            tmp_path,
            agent,
            serverless,
            train_dataset=dataset(1),
            train_kwargs={"grad_accumulation_sequences": 2},
        )
    lag = {"kl_penalty_step_lag": 1}
    trainer = make(tmp_path, agent, serverless, train_dataset=dataset(1), train_kwargs=lag)
    assert trainer.config.train_kwargs == lag and trainer.config.train_kwargs is not lag


class ClosingExecutor(at.InProcessExecutor):
    """The default executor, counting its closes."""

    closes = 0

    def close(self) -> None:
        self.closes += 1
        super().close()


async def test_async_with_flushes_the_last_report_and_closes_the_executor(tmp_path):
    executor = ClosingExecutor()
    async with make(tmp_path, Agent(), train_dataset=dataset(3), executor=executor) as trainer:
        await trainer.step()
        assert executor.closes == 0
    assert executor.closes == 1
    assert (tmp_path / "out" / "reward_plot.png").exists()  # drawn in the background, awaited


def test_with_closes_the_executor_when_its_block_raises(tmp_path):
    executor = ClosingExecutor()
    with (
        pytest.raises(RuntimeError, match="boom"),
        make(tmp_path, Agent(), train_dataset=dataset(3), executor=executor) as trainer,
    ):
        assert isinstance(trainer, at.Trainer)
        raise RuntimeError("boom")
    assert executor.closes == 1


def test_every_trainer_parameter_is_documented_in_its_docstring():
    doc = inspect.getdoc(at.Trainer) or ""
    documented = set(re.findall(r"^ {4}\**(\w+):", doc, re.MULTILINE))
    parameters = {
        p.name
        for p in inspect.signature(at.Trainer).parameters.values()
        if p.kind is not p.VAR_KEYWORD  # **unexpected: a TypeError naming the keyword
    }
    assert parameters <= documented, parameters - documented


class OddMetricsBackend(RecordingBackend):
    """A backend whose TrainResult.metrics hold more than floats (ART types them as floats but
    does not check them)."""

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        import numpy
        import torch

        result = await super().train(model, groups, **kwargs)
        result.metrics = {
            "loss": "abc",
            "entropy": None,
            "grad_norm": numpy.float32(0.5),
            "probs_corr": torch.tensor(0.25),
            "kl": "0.125",
            "nan": math.nan,
            "per_layer": torch.ones(3),
            "policy": {"loss": 2, "tag": [1, 2]},
        }
        return result


async def test_metrics_that_are_not_numbers_are_left_out_and_the_step_is_shipped(tmp_path):
    """The step trained: it is recorded as shipped (shipped.json) whatever the backend reports;
    numbers of any kind are kept, the rest named once in a warning."""
    backend = OddMetricsBackend()
    trainer = make(tmp_path, Agent(), backend, train_dataset=dataset(6))
    with pytest.warns(UserWarning, match="not numbers") as caught:
        result = await trainer.step()
    [warning] = [w for w in caught if "not numbers" in str(w.message)]
    message = str(warning.message)
    for named in ("train/loss (str", "train/entropy (NoneType", "train/per_layer (Tensor"):
        assert named in message
    assert "train/policy/tag (list" in message and "grad_norm" not in message
    kept = {k: v for k, v in result.metrics.items() if k.startswith("train/")}
    assert {k: v for k, v in kept.items() if k != "train/nan"} == {
        "train/grad_norm": 0.5,
        "train/probs_corr": 0.25,
        "train/kl": 0.125,
        "train/policy/loss": 2.0,
    }
    assert math.isnan(kept["train/nan"])
    assert trainer._journal.shipped(0) and trainer.completed_steps == 1
    summary = trainer._journal.shipped_summary(0)
    assert summary is not None and summary["metrics"]["train/grad_norm"] == 0.5
    line = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["train/probs_corr"] == 0.25 and "train/loss" not in line

    with warnings_are_errors():  # the same metrics again: already reported
        await trainer.step()
    assert trainer._journal.shipped(1) and len(backend.calls) == 2
