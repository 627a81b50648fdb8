"""The agents the Ray tests run on the cluster's workers.

A module of its own, kept light: a worker imports it to load a rollout (the test module would
bring pytest, ART and the fixtures). Each agent is an ordinary instrumented agent talking to a
scripted server over HTTP; the server of a run is ``example["urls"][rollout]``, so every run
has its own server and its replies (ids, logprobs) do not depend on which runs came first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import openai

import arttrace as at

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def _slot() -> int:
    return int(at.current_trajectory().metadata["rollout"] or 0)


def _where(example: dict[str, Any], slot: int) -> None:
    """Note the node and process that ran the run (when the test asks), for the test."""
    if example.get("nodes"):
        import ray

        node = ray.get_runtime_context().get_node_id()
        (Path(example["nodes"]) / f"{example['id']}-{slot}").write_text(f"{node} {os.getpid()}")


def _reward(answer: str, slot: int) -> float:
    return (slot % 3) / 2 + (0.25 if "5" in answer else 0.0)


def _tool_turn(message: Any) -> list[dict[str, Any]]:
    call = message.tool_calls[0]
    return [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]


@at.trainable
async def _solve_async(client: openai.AsyncOpenAI, question: str) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    messages += _tool_turn(first.choices[0].message)
    second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return second.choices[0].message.content or ""


async def solve_async(example: dict[str, Any]) -> float:
    """An async agent: a tool call, then the answer."""
    slot = _slot()
    client = openai.AsyncOpenAI(base_url=example["urls"][slot], api_key="k", max_retries=0)
    async with client:
        answer = await _solve_async(client, example["q"])
    _where(example, slot)
    return _reward(answer, slot)


@at.trainable
def _solve_sync(client: openai.OpenAI, question: str) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    messages += _tool_turn(first.choices[0].message)
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return second.choices[0].message.content or ""


def solve_sync(example: dict[str, Any]) -> float:
    """The same agent, sync (the Trainer runs it in a worker thread)."""
    slot = _slot()
    with openai.OpenAI(base_url=example["urls"][slot], api_key="k", max_retries=0) as client:
        answer = _solve_sync(client, example["q"])
    _where(example, slot)
    return _reward(answer, slot)


def killed_until_retried(example: dict[str, Any]) -> float:
    """Writes its worker's PID to ``example["pids"]``, then waits to be killed while the
    file holds no more than ``example["hang"]`` PIDs; a later try returns 1.0."""
    pids = Path(example["pids"])
    with pids.open("a") as file:
        file.write(f"{os.getpid()}\n")
    if len(pids.read_text().split()) <= example["hang"]:
        time.sleep(120)  # the test kills this process long before
        raise AssertionError("the worker was not killed")
    return 1.0


def queued(example: dict[str, Any]) -> float:
    """Notes its example id and worker PID in ``example["log"]``; the first run of an example
    with ``"hang"`` then waits to be killed."""
    log = Path(example["log"])
    first = example["id"] not in (log.read_text().split() if log.exists() else ())
    with log.open("a") as file:
        file.write(f"{example['id']} {os.getpid()}\n")
    if example.get("hang") and first:
        time.sleep(120)  # the test kills this process long before
        raise AssertionError("the worker was not killed")
    return 1.0


def stuck_on_doomed_node(example: dict[str, Any]) -> float:
    """Notes its node and PID in ``example["log"]``. On the node ``example["doomed"]`` it then
    waits to be lost with it; elsewhere it returns 1.0 once a run has reached that node (so
    that a run does)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    log = Path(example["log"])
    with log.open("a") as file:
        file.write(f"{node} {os.getpid()}\n")
    deadline = time.monotonic() + 120  # the test removes the node long before
    while time.monotonic() < deadline:
        if node != example["doomed"] and example["doomed"] in log.read_text():
            return 1.0
        time.sleep(0.05)
    raise AssertionError("the doomed node was not removed, or no run reached it")


async def constant(example: Any) -> float:
    """No LLM call: what the executor itself costs per rollout."""
    return 1.0


@at.trainable
async def _plan_and_execute(client: openai.AsyncOpenAI, question: str) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    plan = await client.chat.completions.create(model="planner-001", messages=messages, tools=TOOLS)
    messages += _tool_turn(plan.choices[0].message)
    done = await client.chat.completions.create(
        model="executor-001", messages=messages, tools=TOOLS
    )
    return done.choices[0].message.content or ""


async def two_policies(example: dict[str, Any]) -> dict[str, float]:
    """A planner (``planner-001``: the tool call) and an executor (``executor-001``: the
    answer); returns each policy's reward."""
    slot = _slot()
    client = openai.AsyncOpenAI(base_url=example["urls"][slot], api_key="k", max_retries=0)
    async with client:
        answer = await _plan_and_execute(client, example["q"])
    return {"planner": float(slot % 2), "executor": _reward(answer, slot)}
