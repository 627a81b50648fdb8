"""One run URL serves every policy of the run: an agent in another process calls a planner
model and an executor model through its run's gateway URL, and a Trainer of two policies
trains each on its own turns, with the tokens the upstream sent."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import arttrace as at
from arttrace.capture import _warnings
from arttrace.gateway import Gateway
from arttrace.testing import Reply, ScriptedLLM
from support.common import warnings_are_errors
from support.gateway import RecordingUpstream
from support.policy_runs import (
    ModelsBackend,
    answer,
    check_policies,
    journaled_policies,
    model,
)
from support.trainer import dataset

AGENT = """
import sys
from openai import OpenAI

client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": sys.argv[1]}]
plan = client.chat.completions.create(model="planner-001", messages=messages)
messages.append({"role": "assistant", "content": plan.choices[0].message.content})
messages.append({"role": "user", "content": "Now do it."})
stream = client.chat.completions.create(model="executor-001", messages=messages, stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"""


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Any:
    yield
    _warnings.reset()


def planner_executor() -> ScriptedLLM:
    def respond(request: dict[str, Any]) -> Reply:
        task = request["messages"][0]["content"]
        if request["model"] == "planner-001":
            return Reply(f"Plan for {task}: look, then answer.")
        return Reply(f"Done: {task}.")

    return ScriptedLLM(respond)


def test_one_run_url_serves_both_policies_of_a_subprocess_agent(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    backend = ModelsBackend()
    with (
        RecordingUpstream(planner_executor()) as upstream,
        Gateway(upstream.base_url) as gateway,
        warnings_are_errors(),
    ):

        async def rollout(example: dict[str, Any]) -> dict[str, float]:
            """One run: the agent, in its own process, calls both models at its run's URL."""
            k = int(at.current_trajectory().metadata["rollout"] or 0)
            task = f"{example['q']}, run {k}"
            agent = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                task,
                env={
                    **os.environ,
                    "OPENAI_BASE_URL": gateway.url(at.current_trajectory()),
                    "OPENAI_API_KEY": "local",
                },
                stdout=asyncio.subprocess.PIPE,
            )
            said = (await agent.communicate())[0].decode().strip()
            assert agent.returncode == 0 and said == f"Done: {task}."
            return {"planner": float(k % 2), "executor": float(1 - k % 2)}

        trainer = at.Trainer(
            [
                at.Policy(model("planner-001", tmp_path), name="planner"),
                at.Policy(model("executor-001", tmp_path), name="executor"),
            ],
            backend,
            rollout,
            dataset(2),
            group_size=2,
            groups_per_step=2,
            output_dir=tmp_path / "out",
            progress=False,
            log_to_model=False,
        )
        result = asyncio.run(trainer.step())

    calls = [e for e in upstream.exchanges if e.path.endswith("/chat/completions")]
    assert len(calls) == 8
    for e in calls:  # a policy call of either model: the gateway asked for the tokens
        assert e.body["logprobs"] is True and e.body["return_token_ids"] is True
    check_policies(
        backend,
        [answer(e.body["model"], e.answered, bool(e.body.get("stream"))) for e in calls],
        {"planner-001": 1, "executor-001": 1},
        groups=2,
        group_size=2,
    )
    assert journaled_policies(tmp_path / "out") == {
        ("planner-001", "planner"),
        ("executor-001", "executor"),
    }
    assert result.metrics["planner/groups_kept"] == result.metrics["executor/groups_kept"] == 2
    for g in backend.groups("planner-001"):
        assert [t.reward for t in g.trajectories] == [0.0, 1.0]


def test_runs_opened_over_http_with_a_reward_per_policy_train_both(tmp_path: Path) -> None:
    """An agent that drives the gateway's run API itself: each run calls both models at its
    URL and is closed with one reward per policy; a Trainer of two policies on the folder
    ships each policy's groups from those runs without running a rollout."""
    out = tmp_path / "out"
    with (
        RecordingUpstream(planner_executor()) as upstream,
        Gateway(upstream.base_url, out=out) as gateway,
        httpx.Client() as client,
    ):
        for k in range(4):
            opened = client.post(f"{gateway.base_url}/runs", json={"example_id": "ex-0"})
            assert opened.status_code == 201, opened.text
            run = opened.json()
            task = f"question 0, run {k}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            for name in ("planner-001", "executor-001"):
                said = client.post(
                    f"{run['url']}/chat/completions", json={"model": name, "messages": messages}
                )
                assert said.status_code == 200, said.text
                messages.append(said.json()["choices"][0]["message"])
                messages.append({"role": "user", "content": "Now do it."})
            rewards = {"planner": float(k % 2), "executor": float(k // 2)}
            wrong = client.put(
                f"{gateway.base_url}/runs/{run['run_id']}/reward",
                json={"reward": {"planner": "high"}},
            )
            assert wrong.status_code == 400 and "the reward of policy 'planner'" in wrong.text
            closed = client.post(
                f"{gateway.base_url}/runs/{run['run_id']}/close", json={"reward": rewards}
            )
            assert closed.status_code == 200, closed.text
            assert closed.json()["reward"] == sum(rewards.values()) / 2
            assert closed.json()["policy_rewards"] == rewards

    def never(example: Any) -> float:
        raise AssertionError("every run of the step is in the journal")

    store = at.open_run(out)  # indexed as a gateway's journal: no policy declared yet
    assert store.count(policy="planner") == 0

    backend = ModelsBackend()
    trainer = at.Trainer(
        [
            at.Policy(model("planner-001", tmp_path), name="planner"),
            at.Policy(model("executor-001", tmp_path), name="executor"),
        ],
        backend,
        never,
        dataset(1),
        group_size=4,
        groups_per_step=1,
        output_dir=out,
        resume=True,
        progress=False,
        log_to_model=False,
    )
    with warnings_are_errors():
        result = asyncio.run(trainer.step())
    calls = [e for e in upstream.exchanges if e.path.endswith("/chat/completions")]
    check_policies(
        backend,
        [answer(e.body["model"], e.answered, bool(e.body.get("stream"))) for e in calls],
        {"planner-001": 1, "executor-001": 1},
        groups=1,
        group_size=4,
    )
    [planner] = backend.groups("planner-001")
    [executor] = backend.groups("executor-001")
    assert [t.reward for t in planner.trajectories] == [0.0, 1.0, 0.0, 1.0]
    assert [t.reward for t in executor.trajectories] == [0.0, 0.0, 1.0, 1.0]
    assert result.metrics["planner/groups_kept"] == result.metrics["executor/groups_kept"] == 1

    # The journal keeps the gateway's lines (no policy on their calls); the store reads them as
    # the Trainer assigned them, once its state.json declares the policies.
    store.refresh()
    assert store.policies() == ["planner", "executor"]
    assert store.count(policy="planner") == store.count(policy="executor") == 4
    for row in store.trajectories():
        assert {(c.model, c.policy) for c in store.trajectory(row.id).calls} == {
            ("planner-001", "planner"),
            ("executor-001", "executor"),
        }
    store.close()
