"""The OpenAI Agents SDK (0.20), written the way its docs write agents, against the scripted
vLLM-like server over loopback HTTP: with its default Responses model and with
``OpenAIChatCompletionsModel``, a tool and a handoff between two agents. Every call is recorded
once (by the OpenAI shim), named with its agent; every policy turn is trainable with the
server's exact tokens, or kept as context with one warning."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import agents
import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_default_openai_responses_transport,
)
from agents.models.openai_provider import OpenAIProvider
from websockets.exceptions import InvalidStatus

import arttrace as at
from arttrace.capture import _warnings
from arttrace.integrations import openai_agents
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall, serve
from support.common import warnings_are_errors

QUESTION = "What is the weather in Paris?"
HANDOFF = Reply(tool_calls=[ToolCall("transfer_to_weather_agent", {})])
LOOKUP = Reply("Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])
ANSWER = Reply("It is sunny in Paris.")


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


def make_agents(model: Any = None) -> Agent[Any]:
    """A triage agent that hands off to a weather agent with a tool."""
    extra = {"model": model} if model is not None else {}
    weather = Agent(
        name="weather_agent", instructions="Answer weather questions.", tools=[get_weather], **extra
    )
    return Agent(name="triage", instructions="Route the user.", handoffs=[weather], **extra)


@pytest.fixture
def agents_sdk() -> Iterator[None]:
    """arttrace instrumented, and the Agents SDK exporting nowhere (its default exporter would
    send traces to OpenAI's backend)."""
    agents.set_trace_processors([])
    at.instrument()
    yield
    at.uninstrument()
    _warnings.reset()
    agents.set_trace_processors([])


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with serve(ScriptedLLM([HANDOFF, LOOKUP, ANSWER])) as running:
        yield running


Setup = Callable[[openai.AsyncOpenAI], tuple[Agent[Any], RunConfig | None]]


def responses_model(client: openai.AsyncOpenAI, **provider: Any) -> tuple[Agent[Any], RunConfig]:
    """The SDK's default model (``OpenAIResponsesModel``) on the scripted server."""
    config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client, **provider), model="policy"
    )
    return make_agents(), config


def chat_model(client: openai.AsyncOpenAI) -> tuple[Agent[Any], None]:
    return make_agents(OpenAIChatCompletionsModel(model="policy", openai_client=client)), None


@at.trainable
async def solve(triage: Agent[Any], config: RunConfig | None, stream: bool) -> Any:
    if stream:
        result = Runner.run_streamed(triage, QUESTION, run_config=config)
        async for _ in result.stream_events():
            pass
        return result.final_output
    return (await Runner.run(triage, QUESTION, run_config=config)).final_output


def run(server: LLMServer, setup: Setup, *, stream: bool = False, wrap: bool = False) -> Any:
    """One agent run on a fresh client (closed after it), inside ``@trainable``."""

    async def go() -> Any:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="test", max_retries=0
        ) as client:
            triage, config = setup(at.wrap_openai(client) if wrap else client)
            return await solve(triage, config, stream)

    return asyncio.run(go())


def tokens(call: at.LLMCall) -> tuple[list[int], list[int], list[float]]:
    (choice,) = call.choices
    assert call.prompt_token_ids is not None and choice.token_ids is not None
    assert choice.logprobs is not None
    return call.prompt_token_ids.tolist(), choice.token_ids.tolist(), choice.logprobs.tolist()


def sent_tokens(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    if "token_generations" in response:
        (generation,) = response["token_generations"]
        logprobs = [p["logprob"] for p in generation["output_tokens"]]
        return generation["prompt_token_ids"], generation["token_ids"], logprobs
    logprobs = [
        e["logprob"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        for e in part["logprobs"] or ()
    ]
    ids = response["output_messages"][0]["tokens"]
    return response["input_messages"][0]["tokens"], ids, logprobs


def names(t: at.Trajectory) -> list[tuple[str | None, str | None, Any]]:
    return [(c.framework, c.step, c.params.get("arttrace_handoff_from")) for c in t.calls]


NAMED = [
    ("openai_agents", "triage", None),
    ("openai_agents", "weather_agent", "triage"),
    ("openai_agents", "weather_agent", "triage"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_the_default_responses_model_is_named_and_trains_where_vllm_returns_ids(
    agents_sdk, server, stream
):
    """Stock vLLM: the turns with text carry the generation's logprobs and raw ids; the handoff
    turn is only a function call, so vLLM sends no logprobs: context, one warning."""
    with (
        pytest.warns(at.UntrainableTurnWarning, match="OpenAIChatCompletionsModel") as caught,
        at.trajectory("q") as t,
    ):
        answer = run(server, responses_model, stream=stream)
    assert answer == "It is sunny in Paris."
    assert len(t.calls) == len(server.responses.requests) == 3  # each call recorded once
    assert names(t) == NAMED
    assert len([w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]) == 1
    handoff, lookup, final = t.calls
    assert handoff.untrainable_reason(handoff.choices[0]) == "no logprobs"
    assert t.trainable_turns == 2
    for call, sent in zip([lookup, final], server.responses.sent[1:], strict=True):
        assert tokens(call) == sent_tokens(sent)
    assert final.messages[-1] == {
        "role": "tool",
        "tool_call_id": lookup.choices[0].message["tool_calls"][0]["id"],
        "content": "sunny in Paris",
    }
    assert [c.streamed for c in t.calls] == [stream] * 3


def test_with_a_server_returning_token_generations_every_turn_trains(agents_sdk, server):
    server.responses.token_generations = True
    with warnings_are_errors(), at.trajectory("q") as t:  # no warning: nothing is lost
        run(server, responses_model)
    assert names(t) == NAMED and t.trainable_turns == 3
    for call, sent in zip(t.calls, server.responses.sent, strict=True):
        assert tokens(call) == sent_tokens(sent)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
def test_openai_chat_completions_model_trains_every_turn(agents_sdk, server, stream):
    with warnings_are_errors():
        with at.trajectory("q") as t:
            answer = run(server, chat_model, stream=stream)
        t.reward = 1.0
    assert answer == "It is sunny in Paris."
    assert len(t.calls) == len(server.llm.requests) == 3
    assert names(t) == NAMED and t.trainable_turns == 3
    assert server.responses.requests == []
    trajectory = t.to_art()
    assert trajectory.reward == 1.0


def test_the_responses_websocket_transport_is_named_as_lost(agents_sdk, server):
    """arttrace cannot see a call sent over the websocket: one warning naming the fix."""

    def websocket(client: openai.AsyncOpenAI) -> tuple[Agent[Any], RunConfig]:
        return responses_model(client, use_responses_websocket=True)

    with (
        pytest.warns(at.UntrainableTurnWarning, match="websocket transport") as caught,
        pytest.warns(at.NothingToTrainWarning),  # and the run, which saw no call, says so too
        at.trajectory("q") as t,
        pytest.raises(InvalidStatus),  # the scripted server speaks no websocket
    ):
        run(server, websocket)
    assert len([w for w in caught if "websocket" in str(w.message)]) == 1
    assert t.calls == [] and server.responses.requests == []


def test_the_default_websocket_transport_warns_when_the_call_starts(agents_sdk, server):
    set_default_openai_responses_transport("websocket")
    try:
        with (
            pytest.warns(at.UntrainableTurnWarning, match="websocket transport"),
            pytest.warns(at.NothingToTrainWarning),
            at.trajectory("q"),
            pytest.raises(InvalidStatus),
        ):
            run(server, responses_model)
    finally:
        set_default_openai_responses_transport("http")


def test_outside_a_run_nothing_is_named_or_warned(agents_sdk, server):
    with warnings_are_errors():
        assert run(server, responses_model) == "It is sunny in Paris."


def test_uninstrument_stops_the_naming(server):
    """A wrapped client is still recorded; the processor stays registered but names nothing."""
    agents.set_trace_processors([])
    at.instrument()
    at.uninstrument()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", at.UntrainableTurnWarning)
            with at.trajectory("q") as t:
                run(server, responses_model, wrap=True)
    finally:
        _warnings.reset()
    assert len(t.calls) == 3
    assert all(c.framework is None and c.step is None for c in t.calls)
    assert openai_agents._processor is not None and not openai_agents._processor.enabled


def test_replacing_the_sdks_processors_keeps_the_naming(agents_sdk, server):
    agents.set_trace_processors([])  # after instrument(): an application exporting elsewhere
    with pytest.warns(at.UntrainableTurnWarning), at.trajectory("q") as t:
        run(server, responses_model)
    assert names(t) == NAMED


def test_with_the_sdks_tracing_off_calls_are_recorded_unnamed(agents_sdk, server):
    agents.set_tracing_disabled(True)
    try:
        with pytest.warns(at.UntrainableTurnWarning), at.trajectory("q") as t:
            run(server, responses_model)
    finally:
        agents.set_tracing_disabled(False)
    assert names(t) == [(None, None, None)] * 3 and t.trainable_turns == 2
