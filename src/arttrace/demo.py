"""``arttrace demo``: a plain OpenAI-SDK agent run against the scripted server, captured.

A calculator agent answers arithmetic questions with a tool. The scripted model sometimes
copies the numbers wrong, so rewards differ between runs of the same question, which is what
GRPO learns from. Every run is captured, converted to ART's form, grouped by question and
written to disk.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import art
import openai

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def scripted_model(seed: int) -> ScriptedLLM:
    """A model that calls ``add`` (with a typo one time in three), then reports the result."""
    rng = random.Random(seed)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        a, b = (int(x) for x in last["content"].removeprefix("What is ").rstrip("?").split("+"))
        if rng.random() < 1 / 3:
            b += 1
        return Reply(tool_calls=[ToolCall("add", {"a": a, "b": b})])

    return ScriptedLLM(respond, seed=seed)


def make_agent(client: openai.AsyncOpenAI) -> Any:
    @at.trainable
    async def calculator(question: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "You are a calculator. Use the add tool."},
            {"role": "user", "content": question},
        ]
        while True:
            response = await client.chat.completions.create(
                model="demo-policy",
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
            )
            message = response.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)  # type: ignore[union-attr]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
                )

    return calculator


async def run_demo(
    out: Path, examples: int = 4, rollouts: int = 4, seed: int = 0
) -> dict[str, Any]:
    """Run the demo; return its summary and write trajectories and ART groups under ``out``."""
    at.instrument()
    rng = random.Random(seed)
    questions = [(f"q-{i}", rng.randint(1, 50), rng.randint(1, 50)) for i in range(examples)]
    with serve(scripted_model(seed)) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="demo")
        agent = make_agent(client)

        async def rollout(example_id: str, a: int, b: int) -> at.Trajectory:
            async with at.trajectory(example_id, metadata={"question": f"{a}+{b}"}) as t:
                answer = await agent(f"What is {a}+{b}?")
                t.reward = 1.0 if answer == f"The answer is {a + b}." else 0.0
            return t

        runs = await asyncio.gather(*(rollout(*q) for q in questions for _ in range(rollouts)))
        await client.close()

    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories").mkdir(exist_ok=True)
    groups: dict[str, list[at.Trajectory]] = {}
    for k, t in enumerate(runs):
        t.save(out / "trajectories" / f"{t.example_id}-{k % rollouts}.json")
        groups.setdefault(t.example_id, []).append(t)
    with (out / "art_groups.jsonl").open("w") as f:
        for runs_of_example in groups.values():
            group = art.TrajectoryGroup([t.to_art() for t in runs_of_example])
            f.write(group.model_dump_json() + "\n")
    rewards = [t.reward or 0.0 for t in runs]
    return {
        "examples": len(groups),
        "runs": len(runs),
        "llm_calls": sum(len(t.calls) for t in runs),
        "trainable_turns": sum(t.trainable_turns for t in runs),
        "completion_tokens": sum(c.completion_tokens for t in runs for c in t.calls),
        "reward_mean": sum(rewards) / len(rewards),
        "groups_with_signal": sum(len({t.reward for t in g}) > 1 for g in groups.values()),
        "output": str(out),
    }
