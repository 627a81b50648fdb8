"""Two policies of one agent system, trained by one Trainer through real frameworks over
loopback HTTP to the scripted vLLM-like server: an OpenAI Agents SDK triage agent handing off
to a specialist on another model, and a LangGraph planner node and executor node on two
models. Each policy's trajectories hold exactly its own turns as trainable Choices with the
server's tokens and the other's turns as context, and each ships to its own model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import openai
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.models.openai_provider import OpenAIProvider
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, Reply, ToolCall, serve
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

GROUP_SIZE, GROUPS = 2, 2


def question(example: dict[str, Any]) -> str:
    """The run's question: its own in its group (each answer then has its own tokens)."""
    return f"{example['q']}, run {at.current_trajectory().metadata['rollout']}"


def rewards() -> dict[str, float]:
    """Each policy's reward for the run, spread within the group in opposite ways."""
    k = int(at.current_trajectory().metadata["rollout"] or 0)
    return {"first": float(k % 2), "second": float(1 - k % 2)}


def train(tmp_path: Path, rollout: Any, first: str, second: str) -> tuple[Any, ModelsBackend]:
    """One step of a Trainer of two policies, ``first`` and ``second`` (their models' names)."""
    backend = ModelsBackend()
    trainer = at.Trainer(
        [
            at.Policy(model(first, tmp_path), name="first"),
            at.Policy(model(second, tmp_path), name="second"),
        ],
        backend,
        rollout,
        dataset(GROUPS),
        group_size=GROUP_SIZE,
        groups_per_step=GROUPS,
        output_dir=tmp_path / "out",
        progress=False,
        log_to_model=False,
    )

    async def step() -> Any:
        async with trainer:
            return await trainer.step()

    return asyncio.run(step()), backend


# -- the OpenAI Agents SDK: triage hands off to a specialist on another model ---------------


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


def weather_llm() -> KeptLLM:
    """``triage-001`` routes; ``weather-001`` looks the weather up, then answers."""

    def respond(request: dict[str, Any]) -> Reply:
        asked = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if request["model"] == "triage-001":
            return Reply(
                f"Routing {asked}.", tool_calls=[ToolCall("transfer_to_weather_agent", {})]
            )
        looked_up = [
            m
            for m in request["messages"]
            if m["role"] == "tool" and str(m["content"]).startswith("sunny")
        ]
        if not looked_up:
            return Reply(
                f"Checking for {asked}.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})]
            )
        return Reply(f"It is {looked_up[0]['content']} ({asked}).")

    return KeptLLM(respond)


@pytest.fixture
def agents_sdk() -> Iterator[None]:
    """arttrace instrumented, and the Agents SDK exporting its traces nowhere."""
    agents.set_trace_processors([])
    at.instrument()
    yield
    at.uninstrument()
    _warnings.reset()
    agents.set_trace_processors([])


def triage_rollout(server: LLMServer, stream: bool) -> Any:
    @at.trainable
    async def solve(asked: str) -> str:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="test", max_retries=0
        ) as client:
            weather = Agent(
                name="weather_agent",
                instructions="Answer weather questions.",
                tools=[get_weather],
                model="weather-001",
            )
            triage = Agent(
                name="triage",
                instructions="Route the user.",
                handoffs=[weather],
                model="triage-001",
            )
            config = RunConfig(
                model_provider=OpenAIProvider(openai_client=client, use_responses=False)
            )
            if stream:
                streamed = Runner.run_streamed(triage, asked, run_config=config)
                async for _ in streamed.stream_events():
                    pass
                return str(streamed.final_output)
            return str((await Runner.run(triage, asked, run_config=config)).final_output)

    async def rollout(example: dict[str, Any]) -> dict[str, float]:
        answer = await solve(question(example))
        assert answer.startswith("It is sunny in Paris")
        return rewards()

    return rollout


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_an_agents_sdk_triage_and_its_specialist_train_as_two_policies(
    agents_sdk, tmp_path, stream
):
    llm = weather_llm()
    with serve(llm) as server, warnings_are_errors():
        rollout = triage_rollout(server, stream)
        result, backend = train(tmp_path, rollout, "triage-001", "weather-001")
    assert len(llm.requests) == GROUPS * GROUP_SIZE * 3
    assert {bool(r.get("stream")) for r in llm.requests} == {stream}
    check_policies(
        backend,
        kept_answers(llm.requests, llm.answers),
        {"triage-001": 1, "weather-001": 2},
        groups=GROUPS,
        group_size=GROUP_SIZE,
    )
    assert journaled_policies(tmp_path / "out") == {
        ("triage-001", "first"),
        ("weather-001", "second"),
    }
    assert set(result.policy_groups) == {"first", "second"}
    assert result.metrics["first/groups_kept"] == result.metrics["second/groups_kept"] == GROUPS
    for g in backend.groups("triage-001"):
        assert [t.reward for t in g.trajectories] == [0.0, 1.0]
    for g in backend.groups("weather-001"):
        assert [t.reward for t in g.trajectories] == [1.0, 0.0]


# -- LangGraph: a planner node and an executor node on two models ----------------------------


def plan_llm() -> KeptLLM:
    """``planner-001`` plans the user's task; ``executor-001`` carries the plan out."""

    def respond(request: dict[str, Any]) -> Reply:
        asked = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if request["model"] == "planner-001":
            return Reply(f"Plan for {asked}: look, then answer.")
        return Reply(f"Done: {asked}.")

    return KeptLLM(respond)


def graph_rollout(server: LLMServer) -> Any:
    planner_llm = ChatOpenAI(
        model="planner-001", base_url=server.base_url, api_key="test", max_retries=0
    )
    executor_llm = ChatOpenAI(
        model="executor-001",
        base_url=server.base_url,
        api_key="test",
        max_retries=0,
        streaming=True,
    )

    async def planner(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await planner_llm.ainvoke(state["messages"])]}

    async def executor(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await executor_llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("planner", planner)
    builder.add_node("executor", executor)
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "executor")
    graph = builder.compile()

    @at.trainable
    async def solve(asked: str) -> str:
        state = await graph.ainvoke({"messages": [("user", asked)]})
        return str(state["messages"][-1].content)

    async def rollout(example: dict[str, Any]) -> dict[str, float]:
        asked = question(example)
        assert await solve(asked) == f"Done: {asked}."
        return rewards()

    return rollout


def test_a_langgraph_planner_and_executor_train_as_two_policies(instrumented, tmp_path):
    llm = plan_llm()
    with serve(llm) as server, warnings_are_errors():
        result, backend = train(tmp_path, graph_rollout(server), "planner-001", "executor-001")
    assert len(llm.requests) == GROUPS * GROUP_SIZE * 2
    assert [r["stream"] for r in llm.requests if r["model"] == "executor-001"] == [True] * 4
    check_policies(
        backend,
        kept_answers(llm.requests, llm.answers),
        {"planner-001": 1, "executor-001": 1},
        groups=GROUPS,
        group_size=GROUP_SIZE,
    )
    assert journaled_policies(tmp_path / "out") == {
        ("planner-001", "first"),
        ("executor-001", "second"),
    }
    assert result.metrics["first/groups_kept"] == result.metrics["second/groups_kept"] == GROUPS
    for g in backend.groups("executor-001"):
        assert [t.reward for t in g.trajectories] == [1.0, 0.0]
