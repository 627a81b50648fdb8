"""The Trainer on ART's own ``ServerlessBackend``, against a local stand-in for its HTTP API.

``ServerlessBackend(base_url=..., api_key=...)`` is the supported way to point it elsewhere than
``https://api.training.wandb.ai/v1``. Its ``train()`` opens a W&B run (provenance) only when
``WANDB_API_KEY`` is set, so the test unsets it: nothing leaves 127.0.0.1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import art
import openai
import pytest

import arttrace as at
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall
from support.art_server import FakeServerlessAPI

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


class RecordingLLM(ScriptedLLM):
    """The scripted vLLM-like model, keeping every response body it sends."""

    def __init__(self) -> None:
        super().__init__(self.reply)
        self.responses: list[dict[str, Any]] = []

    @staticmethod
    def reply(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"It is {last['content']}.")
        return Reply(tool_calls=[ToolCall("lookup", {"q": last["content"]})])

    def respond(self, body: dict[str, Any]) -> Any:
        status, payload, chunks = super().respond(body)
        assert payload is not None
        self.responses.append(payload)
        return status, payload, chunks


@pytest.fixture
def api() -> Iterator[FakeServerlessAPI]:
    server = FakeServerlessAPI(api_key="wandb-key")
    yield server
    server.stop()


def turn(prompt_ids: list[int], choice: dict[str, Any]) -> tuple[Any, ...]:
    """One sampled turn: its prompt and completion token ids and its logprobs."""
    return (
        tuple(prompt_ids),
        tuple(choice["token_ids"]),
        tuple((e["token"], e["logprob"]) for e in choice["logprobs"]["content"]),
    )


async def test_trainer_ships_exactly_the_captured_groups_to_serverless_backend(
    tmp_path: Path,
    instrumented: None,
    server: Callable[[ScriptedLLM], LLMServer],
    api: FakeServerlessAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    llm = RecordingLLM()
    client = openai.AsyncOpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)
    runs: Counter[str] = Counter()

    @at.trainable
    async def agent(question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        first = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message,
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        final = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        return final.choices[0].message.content or ""

    async def rollout(example: dict[str, Any]) -> float:
        k = runs[example["id"]]
        runs[example["id"]] += 1
        answer = await agent(example["q"])
        return float(k % 2) if answer == "It is 42." else -1.0

    model = art.TrainableModel(
        name="agent",
        project="proj",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(tmp_path / ".art"),
    )
    backend = art.ServerlessBackend(base_url=api.base_url, api_key="wandb-key")
    await model.register(backend)
    examples = [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(3)]
    trainer = at.Trainer(
        model,
        backend,
        rollout,
        examples,
        group_size=4,
        groups_per_step=3,
        learning_rate=2e-5,
        train_kwargs={"kl_penalty_coef": 0.05},
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )
    result = await trainer.step()
    await client.close()

    assert api.requests == [
        ("POST", "/v1/preview/models"),
        ("GET", "/v1/preview/models/model-0/checkpoints"),  # the step before shipping it once
        ("POST", "/v1/preview/training-jobs"),
        ("GET", "/v1/preview/training-jobs/job-1/events"),
        ("GET", "/v1/preview/models/model-0/checkpoints"),
    ]
    (job,) = api.jobs
    assert job["model_id"] == model.id == "model-0"
    assert job["experimental_config"]["learning_rate"] == 2e-5
    assert job["experimental_config"]["kl_penalty_coef"] == 0.05

    posted = job["trajectory_groups"]
    assert posted == [g.model_dump(mode="json") for g in result.groups]
    assert sorted(g["metadata"]["example_id"] for g in posted) == ["ex-0", "ex-1", "ex-2"]
    questions = {e["id"]: e["q"] for e in examples}
    sent = Counter(turn(r["prompt_token_ids"], r["choices"][0]) for r in llm.responses)
    shipped: Counter[tuple[Any, ...]] = Counter()
    for group in map(art.TrajectoryGroup.model_validate, posted):  # as the server reads them
        assert group.exceptions == []
        assert sorted(t.reward for t in group.trajectories) == [0.0, 0.0, 1.0, 1.0]
        for t in group.trajectories:
            assert t.metadata["example_id"] == group.metadata["example_id"]
            user, first, tool, final = t.messages_and_choices  # Choices arrive as dicts
            assert user == {"role": "user", "content": questions[group.metadata["example_id"]]}
            assert tool["role"] == "tool"
            assert first["message"]["tool_calls"][0]["function"]["name"] == "lookup"
            assert final["message"]["content"] == "It is 42."
            for choice in (first, final):  # trainable: a Choice with logprobs and vLLM's ids
                assert choice["finish_reason"] and choice["logprobs"]["content"]
                shipped[turn(choice["prompt_token_ids"], choice)] += 1
    assert len(llm.responses) == 24 and shipped == sent  # every call, once, as a trainable turn

    assert isinstance(result.train_result, art.ServerlessTrainResult)
    assert result.train_result.step == 1
    assert result.train_result.artifact_name == "team/proj/r:step1"  # ART names it by run_name
    assert result.metrics["train/loss/train"] == 0.25  # from the job's gradient_step event
    assert result.metrics["groups_kept"] == 3 and result.metrics["trainable_tokens"] == sum(
        len(r["choices"][0]["token_ids"]) for r in llm.responses
    )
    journal = tmp_path / "out" / "journal" / "step-00000" / "rollouts.jsonl"
    assert len(journal.read_text().splitlines()) == 12
