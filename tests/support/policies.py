"""A run folder of two roles in one agent, made by the real Trainer: a planner and an executor
that share one conversation on a scripted OpenAI-protocol server over loopback HTTP, each
``@trainable(policy=...)`` naming its policy. ``several=True`` trains them as two policies of
one Trainer (``at.Policy``), each with its own reward (``policy_rewards``)."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import art
import openai

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import Reply, ScriptedLLM, serve

SYSTEM = "You plan, then you carry the plan out."
EXECUTE = "Carry out the plan."
DATASET = [{"id": f"task-{i}", "task": f"tidy room {i}"} for i in range(2)]
VALIDATION = [{"id": "val-0", "task": "tidy the hall"}]


def respond(request: dict[str, Any]) -> Reply:
    last = request["messages"][-1]["content"]
    if last == EXECUTE:
        plan = request["messages"][-2]["content"]
        return Reply(f"Done: {plan.removeprefix('Plan: ')}")
    return Reply(f"Plan: {last}, then rest")


@at.trainable(policy="planner")
async def plan(client: openai.AsyncOpenAI, messages: list[Any]) -> str:
    reply = await client.chat.completions.create(model="planner", messages=messages)
    return reply.choices[0].message.content or ""


@at.trainable(policy="executor")
async def execute(client: openai.AsyncOpenAI, messages: list[Any]) -> str:
    reply = await client.chat.completions.create(model="executor", messages=messages)
    return reply.choices[0].message.content or ""


def rewards(rollout: int) -> dict[str, float]:
    """Each role's reward for run ``rollout`` of a group (each varies within the group)."""
    return {"planner": float(rollout % 2), "executor": float(rollout == 3)}


def agent(base_url: str, several: bool) -> Any:
    async def rollout(example: dict[str, Any]) -> float:
        k = int(at.current_trajectory().metadata.get("rollout") or 0)
        async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as client:
            messages: list[Any] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": example["task"]},
            ]
            planned = await plan(client, messages)
            messages += [
                {"role": "assistant", "content": planned},
                {"role": "user", "content": EXECUTE},
            ]
            await execute(client, messages)
        if several:
            at.current_trajectory().policy_rewards = rewards(k)
            return at.current_trajectory().reward  # type: ignore[return-value]
        return rewards(k)["planner"]

    return rollout


def model(name: str, out: Path) -> Any:
    return art.TrainableModel(
        name=name,
        project="roles",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name=name,
        base_path=str(out.parent / f"{out.name}-art"),
    )


def judged(rollout: int) -> dict[str, float]:
    """A group judge's reward per policy for run ``rollout`` (``two_roles(judge=True)``)."""
    return {"planner": float(rollout == 0), "executor": float(rollout == 1)}


def judge(group: Any) -> list[dict[str, float]]:
    return [judged(run.rollout) for run in group.runs]


def two_roles(
    out: Path,
    *,
    several: bool = False,
    steps: int = 2,
    frozen: str | None = None,
    judge_groups: bool = False,
) -> Path:
    """Train the two roles for ``steps`` steps on DryRunBackend into ``out``; ``out``.
    ``several``: as two policies (``frozen``: that one frozen; ``judge_groups``: a group
    reward gives each policy its own reward, :func:`judged`)."""
    _warnings.reset()
    at.instrument()
    try:
        with serve(ScriptedLLM(respond)) as server, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the capture's and Trainer's warnings

            async def train() -> None:
                backend = at.DryRunBackend(out.parent / f"{out.name}-dry-run")
                if several:
                    planner, executor = model("planner", out), model("executor", out)
                    for m in (planner, executor):
                        await m.register(backend)
                    models: Any = [
                        at.Policy(m, frozen=m.name == frozen) for m in (planner, executor)
                    ]
                else:
                    models = model("roles", out)
                    await models.register(backend)
                trainer = at.Trainer(
                    models,
                    backend,
                    agent(server.base_url, several),
                    DATASET,
                    val_dataset=VALIDATION,
                    group_size=4,
                    groups_per_step=len(DATASET),
                    output_dir=out,
                    progress=False,
                    log_to_model=False,
                    group_reward=judge if judge_groups else None,
                )
                await trainer.train(num_steps=steps)

            asyncio.run(train())
    finally:
        at.uninstrument()
        _warnings.reset()
    return out
