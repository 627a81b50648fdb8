"""Never silent, in the Trainer: trainable tokens per group, a warning for each step that
would ship groups with none, and a step with nothing to train is an error, not a success."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import art
import openai
import pytest

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, Reply, ScriptedLLM

Serve = Callable[[ScriptedLLM], LLMServer]


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    _warnings.reset()
    yield
    _warnings.reset()


class Backend:
    """ART's Backend protocol, in process: records what each train() call got."""

    def __init__(self) -> None:
        self.shipped: list[list[art.TrajectoryGroup]] = []

    async def register(self, model: Any) -> None:
        pass

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        self.shipped.append(list(groups))
        return art.TrainResult(step=len(self.shipped), metrics={"loss": 0.1})


class Agent:
    """Answers each question on the scripted server over real HTTP; ``outside`` names the
    examples whose call it makes outside @trainable (a common mistake)."""

    def __init__(self, llm: ScriptedLLM, server: Serve, outside: frozenset[str] = frozenset()):
        self.client = openai.AsyncOpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)
        self.outside = outside
        self.runs = 0

    async def rollout(self, example: dict[str, str]) -> float:
        self.runs += 1
        reward = float(self.runs % 2)  # rollouts alternate: every group has learning signal
        if example["id"] in self.outside:
            await self._ask(example["q"])
        else:
            await self._policy(example["q"])
        return reward

    async def _ask(self, question: str) -> None:
        await self.client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": question}]
        )

    @at.trainable
    async def _policy(self, question: str) -> None:
        await self._ask(question)


def trainer(tmp_path: Path, agent: Agent, backend: Backend, **kw: Any) -> at.Trainer[Any]:
    model = art.TrainableModel(
        name="m", project="p", base_model="Qwen/Qwen2.5-0.5B-Instruct", run_name="r",
        base_path=str(tmp_path / ".art"),
    )  # fmt: skip
    settings: dict[str, Any] = {
        "train_dataset": [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(3)],
        "group_size": 2,
        "groups_per_step": 3,
        "output_dir": tmp_path / "out",
        "progress": False,
        "log_to_model": False,
        **kw,
    }
    return at.Trainer(model, backend, agent.rollout, **settings)


def llm() -> ScriptedLLM:
    return ScriptedLLM(lambda request: Reply("the answer is four"))


async def test_tokens_per_group_are_reported(tmp_path: Path, server: Serve) -> None:
    at.instrument()
    try:
        backend = Backend()
        result = await trainer(tmp_path, Agent(llm(), server), backend).step()
    finally:
        at.uninstrument()
    per_group = result.trainable_tokens
    assert sorted(per_group) == ["ex-0", "ex-1", "ex-2"] and min(per_group.values()) > 0
    shipped = backend.shipped[0]
    assert result.metrics["trainable_tokens"] == sum(per_group.values())
    assert result.metrics["trainable_tokens_group_min"] == min(per_group.values())
    assert result.metrics["groups_without_trainable_tokens"] == 0 and len(shipped) == 3
    summary = json.loads((tmp_path / "out/journal/step-00000/shipped.json").read_text())
    assert summary["trainable_tokens"] == per_group


async def test_groups_without_trainable_tokens_warn_once_per_step_and_do_not_ship(
    tmp_path: Path, server: Serve
) -> None:
    at.instrument()
    try:
        backend = Backend()
        t = trainer(tmp_path, Agent(llm(), server, outside=frozenset({"ex-1"})), backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = [await t.step(), await t.step()]
    finally:
        at.uninstrument()
    step_warnings = [
        str(w.message)
        for w in caught
        if issubclass(w.category, at.NothingToTrainWarning) and "step" in str(w.message)
    ]
    assert len(step_warnings) == 2  # one per step
    for number, message in enumerate(step_warnings):
        assert f"step {number}: 1 of the 3 groups with learning signal" in message
        assert "its LLM calls ran outside every @trainable function" in message
        assert "Decorate the agent function" in message  # the fix
    for result, shipped in zip(results, backend.shipped, strict=True):
        assert sorted(g.metadata["example_id"] for g in shipped) == ["ex-0", "ex-2"]
        assert result.trainable_tokens["ex-1"] == 0
        assert result.metrics["groups_without_trainable_tokens"] == 1
        assert result.metrics["groups_kept"] == 2
        assert result.metrics["trainable_tokens_group_min"] == 0


async def test_a_step_with_nothing_to_train_fails_and_resume_runs_it_again(
    tmp_path: Path, server: Serve
) -> None:
    at.instrument()
    try:
        backend = Backend()
        model = llm()
        model.token_ids = False  # a server that does not return vLLM's token ids
        agent = Agent(model, server)
        with (
            pytest.warns(at.UntrainableTurnWarning, match="no token ids"),
            pytest.raises(at.TrainingError) as error,
        ):
            await trainer(tmp_path, agent, backend).step()
        message = str(error.value)
        assert "step 0: 3 of the 3 groups with learning signal hold no trainable token" in message
        assert "no token ids" in message and "return_token_ids" in message  # cause and fix
        assert "resume=True" in message
        assert backend.shipped == []  # nothing shipped, nothing recorded as a step
        step_dir = tmp_path / "out/journal/step-00000"
        assert not (step_dir / "shipped.json").exists()
        assert len((step_dir / "rollouts-nothing-to-train.jsonl").read_text().splitlines()) == 6

        model.token_ids = True  # the cause fixed
        resumed = trainer(tmp_path, agent, backend, resume=True)
        result = await resumed.step()
    finally:
        at.uninstrument()
    assert agent.runs == 12  # the step ran again, not read back
    assert result.step == 0 and len(backend.shipped) == 1
    assert min(result.trainable_tokens.values()) > 0


async def test_without_instrument_the_step_error_names_it(tmp_path: Path, server: Serve) -> None:
    with (
        pytest.warns(at.NothingToTrainWarning, match=r"instrument\(\) was not called"),
        pytest.raises(at.TrainingError, match=r"arttrace.instrument\(\) was not called"),
    ):
        await trainer(tmp_path, Agent(llm(), server), Backend()).step()
