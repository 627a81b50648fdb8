"""Frameworks and SDKs that send without the OpenAI SDK, or through it, over real HTTP to the
scripted server: LiteLLM (``hosted_vllm/`` posts with its own httpx/aiohttp clients,
``openai/`` through the OpenAI SDK), DSPy's default engine (lm15's socket transports), with its
cache on and off, PydanticAI and smolagents (OpenAI SDK), and Google ADK over LiteLLM's
``hosted_vllm/`` route (framework hook + HTTP layer, merged). Every policy turn is trainable with
the server's exact tokens, and recorded once."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import dspy
import litellm
import pytest
import smolagents
from dspy.clients.backend_selection import select_backend
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import arttrace as at
from arttrace.capture._layers import merge_layers
from arttrace.capture._records import ChoiceRecord, LLMCall
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall
from support.served import KeptLLM

Serve = Callable[[ScriptedLLM], LLMServer]
USER = [{"role": "user", "content": "add 1 and 2"}]

# LiteLLM's own logging serialises responses that carry vLLM's extra fields (token_ids, ...).
pytestmark = [
    pytest.mark.usefixtures("instrumented"),
    pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning"),
]


def assert_exact(call: LLMCall, llm: KeptLLM, index: int = -1) -> None:
    """``call`` is a whole policy turn with the ids and logprobs the server sent."""
    prompt, ids, logprobs = llm.tokens(index)
    (choice,) = call.choices
    assert call.trainable and (call.error, call.partial, call.capture_error) == (None, False, None)
    assert call.prompt_token_ids is not None and call.prompt_token_ids.tolist() == prompt
    assert choice.token_ids is not None and choice.token_ids.tolist() == ids
    assert choice.logprobs is not None and choice.logprobs.tolist() == logprobs


# -- LiteLLM -----------------------------------------------------------------------------------


async def litellm_call(model: str, url: str, mode: str) -> str:
    kwargs: dict[str, Any] = {"model": model, "api_base": url, "api_key": "k", "messages": USER}
    if mode == "sync":
        return litellm.completion(**kwargs).choices[0].message.content  # type: ignore[no-any-return]
    if mode == "async":
        reply = await litellm.acompletion(**kwargs)
        return reply.choices[0].message.content  # type: ignore[no-any-return]
    if mode == "stream":
        chunks = litellm.completion(stream=True, **kwargs)
        return "".join(c.choices[0].delta.content or "" for c in chunks)
    chunks = await litellm.acompletion(stream=True, **kwargs)
    return "".join([c.choices[0].delta.content or "" async for c in chunks])


@pytest.mark.parametrize("mode", ["sync", "async", "stream", "async-stream"])
@pytest.mark.parametrize(("route", "layer"), [("hosted_vllm", "http"), ("openai", "openai")])
async def test_litellm_routes_are_recorded_once_with_exact_tokens(
    server: Serve, route: str, layer: str, mode: str
) -> None:
    """``hosted_vllm/`` (what ART's ``litellm_completion_params()`` returns for trainable
    models) posts with LiteLLM's httpx client (aiohttp below it when async): this layer records
    it. ``openai/`` goes through the OpenAI SDK: the shim records it, this layer stands aside."""
    llm = KeptLLM()
    url = server(llm).base_url

    @at.trainable
    async def agent() -> str:
        return await litellm_call(f"{route}/policy", url, mode)

    async with at.trajectory("litellm") as t:
        assert await agent() == "You said: add 1 and 2"
    (call,) = t.calls
    assert (call.source, call.model, call.streamed) == (layer, "policy", "stream" in mode)
    assert_exact(call, llm)
    assert t.trainable_turns == 1


# -- DSPy --------------------------------------------------------------------------------------

ANSWER = "[[ ## answer ## ]]\n3\n\n[[ ## completed ## ]]"


@pytest.fixture
def dspy_cache() -> Any:
    """DSPy's cache in memory only (its disk cache would outlive the test run)."""
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    yield
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def dspy_lm(url: str, *, cache: bool) -> dspy.LM:
    lm = dspy.LM("openai/policy", api_base=url, api_key="k", cache=cache)
    assert select_backend(lm).native  # DSPy's default engine, not LiteLLM
    return lm


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_dspys_default_engine_is_recorded_with_exact_tokens(
    server: Serve, is_async: bool
) -> None:
    llm = KeptLLM(lambda request: ANSWER)
    lm = dspy_lm(server(llm).base_url, cache=False)
    predict = dspy.Predict("question -> answer")

    @at.trainable(name="solver")
    async def solve(question: str) -> str:
        with dspy.context(lm=lm):
            if is_async:
                return (await predict.acall(question=question)).answer  # type: ignore[no-any-return]
            return predict(question=question).answer  # type: ignore[no-any-return]

    for attempt in range(2):  # no cache: each rollout calls the model
        async with at.trajectory(f"dspy-{attempt}") as t:
            assert await solve("What is 1 + 2?") == "3"
        (call,) = t.calls
        assert (call.source, call.agent, call.model) == ("http", "solver", "policy")
        assert call.messages[-1]["role"] == "user" and "1 + 2" in call.messages[-1]["content"]
        assert_exact(call, llm)
        assert t.trainable_turns == 1
    assert len(llm.requests) == 2


async def test_a_rollout_answered_by_dspys_cache_records_nothing_and_warns(
    server: Serve, dspy_cache: None
) -> None:
    llm = KeptLLM(lambda request: ANSWER)
    lm = dspy_lm(server(llm).base_url, cache=True)
    predict = dspy.Predict("question -> answer")

    @at.trainable
    def solve() -> str:
        with dspy.context(lm=lm):
            return predict(question="What is 1 + 2, cached?").answer  # type: ignore[no-any-return]

    with at.trajectory("first") as first:
        assert solve() == "3"
    assert first.trainable_turns == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("repeat") as repeat:
            assert solve() == "3"  # the same prompt: DSPy's cache answers
    assert repeat.calls == [] and len(llm.requests) == 1
    (warning,) = [w for w in caught if issubclass(w.category, at.NothingToTrainWarning)]
    assert "(DSPy's cache answered)" in str(warning.message)
    assert "dspy.LM(..., cache=False)" in str(warning.message)


# -- SDKs built on the OpenAI SDK --------------------------------------------------------------


async def test_pydantic_ai_is_recorded_once_by_the_shim(server: Serve) -> None:
    llm = KeptLLM()
    model = OpenAIChatModel("policy", provider=OpenAIProvider(base_url=server(llm).base_url))
    agent = Agent(model)

    @at.trainable
    async def run() -> tuple[str, str]:
        whole = (await agent.run("add 1 and 2")).output
        async with agent.run_stream("add 3 and 4") as streamed:
            return whole, await streamed.get_output()

    async with at.trajectory("pydantic-ai") as t:
        assert await run() == ("You said: add 1 and 2", "You said: add 3 and 4")
    assert [(c.source, c.streamed) for c in t.calls] == [("openai", False), ("openai", True)]
    for index, call in enumerate(t.calls):
        assert_exact(call, llm, index)


def test_smolagents_is_recorded_once_by_the_shim(server: Serve) -> None:
    llm = KeptLLM([Reply(tool_calls=[ToolCall("final_answer", {"answer": "3"})])])
    model = smolagents.OpenAIServerModel(
        model_id="policy", api_base=server(llm).base_url, api_key="k"
    )
    agent = smolagents.ToolCallingAgent(tools=[], model=model, max_steps=2, verbosity_level=0)

    @at.trainable
    def run() -> Any:
        return agent.run("add 1 and 2")

    with at.trajectory("smolagents") as t:
        assert str(run()) == "3"
    (call,) = t.calls
    assert call.source == "openai" and call.choices[0].finish_reason == "tool_calls"
    assert_exact(call, llm)


# -- a framework over a client arttrace does not wrap: merged ----------------------------------


@pytest.mark.parametrize("mode", [StreamingMode.NONE, StreamingMode.SSE], ids=["whole", "sse"])
async def test_adk_over_litellms_hosted_vllm_route_is_one_call_with_names_and_tokens(
    server: Serve, mode: StreamingMode
) -> None:
    """ADK's hook names the call, the HTTP layer reads its tokens: one record, both kept."""
    llm = KeptLLM([Reply("3.")])
    agent = LlmAgent(
        name="calc",
        model=LiteLlm(model="hosted_vllm/policy", api_base=server(llm).base_url, api_key="k"),
        instruction="Be brief.",
    )
    runner = InMemoryRunner(agent=agent, app_name="app")

    @at.trainable
    async def solve() -> None:
        session = await runner.session_service.create_session(app_name="app", user_id="u")
        message = types.Content(role="user", parts=[types.Part(text="1+2?")])
        async for _ in runner.run_async(
            user_id="u",
            session_id=session.id,
            new_message=message,
            run_config=RunConfig(streaming_mode=mode),
        ):
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("error", at.UntrainableTurnWarning)  # the hook's record is paired
        async with at.trajectory("adk") as t:
            await solve()
    (call,) = t.calls
    assert (call.source, call.framework, call.model) == ("http", "google_adk", "policy")
    assert call.step == "calc"
    assert call.choices[0].message["content"] == "3."
    assert_exact(call, llm)
    assert len(t.call_log.records) == 2  # both layers saw it; the trajectory keeps it once


def test_the_merge_keeps_the_lower_layers_tokens_and_the_frameworks_names() -> None:
    message = {"role": "assistant", "content": "3."}
    framework = LLMCall(
        "policy", [], source="langchain", step="node", agent="agent", trainable=True
    )
    framework.choices = [ChoiceRecord(0, dict(message), "stop")]
    lower = [LLMCall("policy", [], source=source) for source in ("http", "openai")]
    for call in lower:
        call.choices = [ChoiceRecord(0, dict(message), "stop")]
    framework.ended_at = lower[-1].started_at + 1
    kept = merge_layers([framework, lower[0]])
    assert kept == [lower[0]]
    assert (lower[0].framework, lower[0].step, lower[0].trainable) == ("langchain", "node", True)
    # a framework record pairs with one lower record only: the other stays its own call
    assert merge_layers([framework, *lower]) == lower
