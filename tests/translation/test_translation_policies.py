"""A translated turn is its policy's: a planner speaking the Anthropic Messages API and an
executor speaking the Responses API, both served in-process through the upstream's Chat
Completions, train as two policies of one Trainer, each on its own turns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, Reply, serve
from support.common import warnings_are_errors
from support.policy_runs import (
    ModelsBackend,
    check_policies,
    journaled_policies,
    kept_answers,
    model,
)
from support.served import KeptLLM
from support.trainer import dataset


@pytest.fixture
def translating() -> Iterator[None]:
    at.instrument(translate="responses,messages")
    yield
    at.uninstrument()
    _warnings.reset()


def planner_executor() -> KeptLLM:
    def respond(request: dict[str, Any]) -> Reply:
        task = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if request["model"] == "planner-001":
            return Reply(f"Plan for {task}: look, then answer.")
        return Reply(f"Done: {task}.")

    return KeptLLM(respond)


def rollout_on(server: LLMServer) -> Any:
    @at.trainable
    async def solve(task: str) -> str:
        async with anthropic.AsyncAnthropic(
            base_url=server.base_url.removesuffix("/v1"), api_key="test", max_retries=0
        ) as planner:
            plan = await planner.messages.create(
                model="planner-001",
                max_tokens=200,
                messages=[{"role": "user", "content": task}],
            )
        said = plan.content[0].text  # type: ignore[union-attr]
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="test", max_retries=0
        ) as executor:
            done = await executor.responses.create(
                model="executor-001",
                input=[
                    {"role": "user", "content": task},
                    {"role": "assistant", "content": said},
                    {"role": "user", "content": "Now do it."},
                ],
            )
        return done.output_text

    async def rollout(example: dict[str, Any]) -> dict[str, float]:
        k = int(at.current_trajectory().metadata["rollout"] or 0)
        task = f"{example['q']}, run {k}"
        assert await solve(task) == f"Done: {task}."
        return {"planner": float(k % 2), "executor": float(1 - k % 2)}

    return rollout


def test_translated_messages_and_responses_turns_are_claimed_by_their_policies(
    translating, tmp_path: Path
):
    llm = planner_executor()
    backend = ModelsBackend()
    with serve(llm) as server, warnings_are_errors():
        trainer = at.Trainer(
            [
                at.Policy(model("planner-001", tmp_path), name="planner"),
                at.Policy(model("executor-001", tmp_path), name="executor"),
            ],
            backend,
            rollout_on(server),
            dataset(2),
            group_size=2,
            groups_per_step=2,
            output_dir=tmp_path / "out",
            progress=False,
            log_to_model=False,
        )
        result = asyncio.run(trainer.step())
    assert server.responses.requests == []  # every call went through Chat Completions
    assert len(llm.requests) == 8
    check_policies(
        backend,
        kept_answers(llm.requests, llm.answers),
        {"planner-001": 1, "executor-001": 1},
        groups=2,
        group_size=2,
    )
    assert journaled_policies(tmp_path / "out") == {
        ("planner-001", "planner"),
        ("executor-001", "executor"),
    }
    assert result.metrics["planner/groups_kept"] == result.metrics["executor/groups_kept"] == 2
