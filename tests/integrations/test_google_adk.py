"""Google ADK: agents run by ADK's runner, with LiteLLM over real HTTP to the scripted server,
recorded once per model call (exact tokens from the OpenAI shim, names from ArttracePlugin)."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
import urllib3
import wrapt
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.lite_llm import LiteLlm, LiteLLMClient
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner, Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.agent_tool import AgentTool
from google.genai import types
from openai.types.chat.chat_completion import Choice
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import Field

import arttrace as at
from arttrace.capture import _warnings
from arttrace.integrations.google_adk import ArttracePlugin, request_messages, request_tools
from arttrace.testing import LLMServer, Reply, ScriptedLLM, SimpleChatTokenizer, ToolCall

# LiteLLM's own logging serializes responses that carry vLLM's extra fields (token_ids, ...).
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

Serve = Callable[[ScriptedLLM], LLMServer]
SYSTEM = 'Use tools.\n\nYou are an agent. Your internal name is "calc".'  # ADK adds the 2nd line


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "temp_c": 21, "sky": "clear"}


def calc_agent(url: str, *, model: str = "openai/policy", **kw: Any) -> LlmAgent:
    return LlmAgent(
        name="calc",
        model=LiteLlm(model=model, api_base=url, api_key="test"),
        instruction="Use tools.",
        tools=[add, weather],
        **kw,
    )


async def ask(
    runner: Runner, session_id: str, text: str, mode: StreamingMode = StreamingMode.NONE
) -> list[Any]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner.run_async(
            user_id="u",
            session_id=session_id,
            new_message=message,
            run_config=RunConfig(streaming_mode=mode),
        )
    ]


async def new_session(runner: Runner) -> str:
    session = await runner.session_service.create_session(app_name=runner.app_name, user_id="u")
    return session.id


def kinds(items: list[Any]) -> list[str]:
    return ["Choice" if isinstance(i, Choice) else i["role"] for i in items]


def assert_trainable(choice: Any) -> None:
    """What ART 0.5.23 trains on: a Choice with logprobs and vLLM's token ids as extras."""
    assert isinstance(choice, Choice) and choice.logprobs is not None
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] and len(extra["token_ids"]) == len(choice.logprobs.content)


def assert_tool_results_answer_calls(items: list[Any]) -> None:
    """Every tool result follows the turn that called it, in the order of its calls."""
    pending: list[str] = []
    for item in items:
        if isinstance(item, Choice):
            assert not pending, f"tool calls {pending} got no result"
            pending = [tc.id for tc in item.message.tool_calls or ()]
        elif item["role"] == "tool":
            assert item["tool_call_id"] == pending.pop(0)
    assert not pending


# -- the agent, both runner modes --------------------------------------------------------------


@pytest.mark.parametrize("mode", [StreamingMode.NONE, StreamingMode.SSE])
async def test_adk_turns_are_trainable_choices_with_tool_results_in_order(
    instrumented: None, server: Serve, mode: StreamingMode
) -> None:
    """The NeMo harness's ADK parser read dict payloads as objects and dropped every ADK turn;
    here each policy turn is a trainable Choice, tool results (dicts and numbers) included."""
    llm = ScriptedLLM(
        [
            Reply(
                "Let me check.",
                tool_calls=[
                    ToolCall("add", {"a": 1, "b": 2}),
                    ToolCall("weather", {"city": "Zürich"}),
                ],
            ),
            Reply("3, and 21 °C in Zürich."),
            Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 2})]),
            Reply("4."),
        ]
    )
    runner = InMemoryRunner(agent=calc_agent(server(llm).base_url), app_name="app")

    @at.trainable
    async def chat(session_id: str) -> None:
        await ask(runner, session_id, "What is 1+2, and how warm is Zürich?", mode)
        await ask(runner, session_id, "And 2+2?", mode)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with at.trajectory("q-1") as t:
            await chat(await new_session(runner))
            t.reward = 1.0
    assert not [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]

    assert len(llm.requests) == 4 and len(t.calls) == 4  # each call once
    assert all(
        (c.source, c.framework, c.step, c.model, c.trainable, c.streamed)
        == ("openai", "google_adk", "calc", "policy", True, mode == StreamingMode.SSE)
        for c in t.calls
    )
    result = t.to_art()
    items = result.messages_and_choices
    assert kinds(items) == [
        "system", "user", "Choice", "tool", "tool", "Choice",
        "user", "Choice", "tool", "Choice",
    ]  # fmt: skip
    assert items[0]["content"] == SYSTEM
    for choice in (i for i in items if isinstance(i, Choice)):
        assert_trainable(choice)
    assert_tool_results_answer_calls(items)
    first = items[2].message
    assert first.content == "Let me check."
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in first.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("weather", {"city": "Zürich"}),
    ]
    results = [
        json.loads(i["content"]) for i in items if isinstance(i, dict) and i["role"] == "tool"
    ]
    assert results == [
        {"result": 3},
        {"city": "Zürich", "temp_c": 21, "sky": "clear"},
        {"result": 4},
    ]
    assert items[-1].message.content == "4."
    assert [tool["function"]["name"] for tool in result.tools or ()] == ["add", "weather"]
    assert result.additional_histories == []


async def test_the_plugin_writes_adk_requests_as_litellm_sends_them(server: Serve) -> None:
    """The plugin's OpenAI form of each LlmRequest (as genai objects, or as the plain dicts they
    dump to) is what LiteLLM sent: messages, tool calls with ids, tool results, images, tools."""
    llm = ScriptedLLM(
        [Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"})]), Reply("It is clear.")]
    )
    seen: list[LlmRequest] = []

    def keep(callback_context: Any, llm_request: LlmRequest) -> None:
        seen.append(llm_request.model_copy(deep=True))

    agent = calc_agent(server(llm).base_url, before_model_callback=keep)
    runner = InMemoryRunner(agent=agent, app_name="app")
    photo = types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG-bytes"))
    message = types.Content(
        role="user", parts=[types.Part(text="Weather where I took this?"), photo]
    )
    async for _ in runner.run_async(
        user_id="u", session_id=await new_session(runner), new_message=message
    ):
        pass

    assert len(seen) == len(llm.requests) == 2
    for request, body in zip(seen, llm.requests, strict=True):
        assert request_messages(request) == body["messages"]
        assert request_messages(request.model_dump()) == body["messages"]
        assert request_tools(request) == request_tools(request.model_dump()) == body["tools"]
    assert body["messages"][1]["content"][1]["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )


# -- context: threads, tasks, concurrent runs ----------------------------------------------------


def test_sync_runner_run_keeps_the_trajectory_in_adks_thread(
    instrumented: None, server: Serve
) -> None:
    """Runner.run drives the async runner in a thread of its own; the calls made there still
    belong to the caller's trajectory and @trainable scope."""
    llm = ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]), Reply("3.")])
    runner = Runner(
        app_name="app",
        agent=calc_agent(server(llm).base_url),
        session_service=InMemorySessionService(),
        auto_create_session=True,
    )

    @at.trainable
    def solve() -> list[Any]:
        message = types.Content(role="user", parts=[types.Part(text="1+2?")])
        return list(runner.run(user_id="u", session_id="s-1", new_message=message))

    with at.trajectory("sync") as t:
        events = solve()
        t.reward = 1.0
    assert events[-1].content.parts[0].text == "3."
    assert [(c.framework, c.trainable) for c in t.calls] == [("google_adk", True)] * 2
    assert t.trainable_turns == 2


async def test_fifty_concurrent_agents_each_keep_only_their_own_calls(
    instrumented: None, server: Serve
) -> None:
    """50 agents run at once in 50 trajectories: each has its own two calls, nothing else."""

    def respond(request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        n = int(messages[1]["content"].removeprefix("task-"))
        if messages[-1]["role"] == "tool":
            return Reply(f"answer-{n}")
        return Reply(tool_calls=[ToolCall("add", {"a": n, "b": 1})])

    url = server(ScriptedLLM(respond)).base_url
    shared = InMemoryRunner(agent=calc_agent(url), app_name="app")

    @at.trainable
    async def solve(n: int) -> None:  # half the agents share a runner, half have their own
        runner = shared if n % 2 else InMemoryRunner(agent=calc_agent(url), app_name="app")
        await ask(runner, await new_session(runner), f"task-{n}")

    async def rollout(n: int) -> at.Trajectory:
        async with at.trajectory(f"task-{n}") as t:
            await solve(n)
            t.reward = float(n)
        return t

    trajectories = await asyncio.gather(*(rollout(n) for n in range(50)))
    for n, t in enumerate(trajectories):
        assert len(t.calls) == 2 and all(c.framework == "google_adk" for c in t.calls)
        items = t.to_art().messages_and_choices
        assert kinds(items) == ["system", "user", "Choice", "tool", "Choice"]
        assert items[1]["content"] == f"task-{n}"
        assert json.loads(items[2].message.tool_calls[0].function.arguments) == {"a": n, "b": 1}
        assert json.loads(items[3]["content"]) == {"result": n + 1}
        assert items[4].message.content == f"answer-{n}"
        assert_tool_results_answer_calls(items)


async def test_a_sub_agent_called_as_a_tool_shares_the_plugin(
    instrumented: None, server: Serve
) -> None:
    """AgentTool runs its agent in a child Runner that inherits the parent's plugins (a second
    plugin of the same name would make ADK raise): the helper's calls are recorded once, as an
    additional history of the same run."""
    llm = ScriptedLLM(
        [
            Reply(tool_calls=[ToolCall("helper", {"request": "What is 6*7?"})]),
            Reply("42"),
            Reply("The helper says 42."),
        ]
    )
    url = server(llm).base_url
    helper = LlmAgent(
        name="helper",
        description="Answers arithmetic questions.",
        model=LiteLlm(model="openai/policy", api_base=url, api_key="test"),
        instruction="Answer briefly.",
    )
    boss = LlmAgent(
        name="boss",
        model=LiteLlm(model="openai/policy", api_base=url, api_key="test"),
        instruction="Delegate arithmetic.",
        tools=[AgentTool(agent=helper)],
    )
    runner = InMemoryRunner(agent=boss, app_name="app")

    @at.trainable
    async def solve() -> None:
        await ask(runner, await new_session(runner), "Ask the helper for 6*7.")

    async with at.trajectory("delegate") as t:
        await solve()
        t.reward = 1.0
    assert [(c.framework, c.step) for c in t.calls] == [
        ("google_adk", "boss"),
        ("google_adk", "helper"),
        ("google_adk", "boss"),
    ]
    result = t.to_art()
    assert kinds(result.messages_and_choices) == ["system", "user", "Choice", "tool", "Choice"]
    (helper_history,) = result.additional_histories
    assert kinds(helper_history.messages_and_choices) == ["system", "user", "Choice"]
    assert t.trainable_turns == 3


# -- traps -------------------------------------------------------------------------------------


class LenientTokenizer(SimpleChatTokenizer):
    """Tokenizes tool-call arguments that are not JSON, as a real model can emit them."""

    def _tool_call(self, tool_call: dict[str, Any]) -> list[int]:
        function = tool_call["function"]
        return self.encode(json.dumps({"name": function["name"], "args": function["arguments"]}))


@pytest.mark.parametrize("mode", [StreamingMode.NONE, StreamingMode.SSE])
@pytest.mark.parametrize("arguments", ["{a: 1, b: 2}", '{"a": 1, "b": 2'])
async def test_a_turn_adk_repaired_or_dropped_is_kept_once_as_sampled(
    instrumented: None, server: Serve, mode: StreamingMode, arguments: str
) -> None:
    """ADK repairs tool-call arguments it can (unquoted keys) and drops those it cannot
    (MALFORMED_FUNCTION_CALL), so its response differs from the server's; the call is still
    kept once, with the arguments the model sampled, paired by the server's completion id.
    (A repaired turn sent back is an edit: the next call continues the conversation in a
    history of its own, the main one, and the sampled turn trains in the first.)"""
    llm = ScriptedLLM(
        [Reply(tool_calls=[ToolCall("add", arguments)]), Reply("3.")], tokenizer=LenientTokenizer()
    )
    runner = InMemoryRunner(agent=calc_agent(server(llm).base_url), app_name="app")

    @at.trainable
    async def solve() -> None:
        await ask(runner, await new_session(runner), "1+2?", mode)

    async with at.trajectory("bad-args") as t:
        await solve()
        t.reward = 0.0
    assert len(t.calls) == len(llm.requests) and all(c.framework == "google_adk" for c in t.calls)
    result = t.to_art()
    histories = [
        result.messages_and_choices,
        *(h.messages_and_choices for h in result.additional_histories),
    ]
    (turn,) = [h[2] for h in histories if isinstance(h[2], Choice)]
    assert_trainable(turn)
    assert turn.message.tool_calls[0].function.arguments == arguments


async def test_a_callback_answering_for_the_model_leaves_no_call(
    instrumented: None, server: Serve
) -> None:
    """An agent's before_model_callback that answers (a cache, a guardrail) means no model
    call: nothing is recorded for it, and the next real call continues the conversation."""
    llm = ScriptedLLM([Reply("From the model.")])

    def cached(callback_context: Any, llm_request: LlmRequest) -> LlmResponse | None:
        if llm_request.contents[-1].parts[0].text == "cached?":
            return LlmResponse(content=types.Content(role="model", parts=[types.Part(text="hit")]))
        return None

    agent = calc_agent(server(llm).base_url, before_model_callback=cached)
    runner = InMemoryRunner(agent=agent, app_name="app")

    @at.trainable
    async def chat(session_id: str) -> None:
        await ask(runner, session_id, "cached?")
        await ask(runner, session_id, "fresh?")

    async with at.trajectory("cache") as t:
        await chat(await new_session(runner))
        t.reward = 1.0
    assert len(t.calls) == len(llm.requests) == 1 and not t.call_log.in_flight
    items = t.to_art().messages_and_choices
    assert kinds(items) == ["system", "user", "assistant", "user", "Choice"]
    assert items[2] == {"role": "assistant", "content": "hit"}


async def test_a_failed_model_call_is_recorded_once_with_its_error(
    instrumented: None, server: Serve
) -> None:
    llm = ScriptedLLM([])  # an exhausted script answers 500 (the OpenAI SDK retries twice)
    agent = calc_agent(server(llm).base_url)
    runner = Runner(
        app=App(name="app", root_agent=agent, plugins=[ArttracePlugin()]),
        session_service=InMemorySessionService(),
    )
    session_id = await new_session(runner)
    async with at.trajectory("fails") as t:
        with pytest.raises(Exception, match="no reply left"):
            await ask(runner, session_id, "1+2?")
    assert len(llm.requests) == 3
    (call,) = t.calls
    assert (call.source, call.framework) == ("openai", "google_adk")
    assert "no reply left" in (call.error or "") and not call.choices


async def test_a_failure_inside_the_plugin_never_reaches_the_agent(
    server: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection into arttrace's own code: a plugin callback that fails is logged and
    swallowed (ADK would fail the run); the call it was recording is kept, marked."""
    from arttrace.integrations import google_adk

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(google_adk, "_finish", broken)
    llm = ScriptedLLM([Reply("3.")])
    agent = calc_agent(server(llm).base_url)
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[ArttracePlugin()]))
    async with at.trajectory("fault") as t:
        events = await ask(runner, await new_session(runner), "1+2?")
    assert events[-1].content.parts[0].text == "3."
    (call,) = t.calls
    assert call.source == "google_adk" and "injected" in (call.capture_error or "")


# -- without exact tokens: one warning that says what to do ------------------------------------


async def test_the_plugin_alone_records_untrainable_turns_and_warns_once(server: Serve) -> None:
    """Without arttrace.instrument() nothing below ADK is recorded: the turns are captured as
    context (ADK keeps no token ids), with one warning saying how to get exact tokens."""
    _warnings.reset()
    llm = ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]), Reply("3.")])
    agent = calc_agent(server(llm).base_url)
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[ArttracePlugin()]))

    @at.trainable
    async def solve() -> None:
        await ask(runner, await new_session(runner), "1+2?")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with at.trajectory("explicit") as t:
            await solve()
            t.reward = 1.0
    _warnings.reset()
    (warning,) = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert "call arttrace.instrument()" in str(warning.message)
    assert "'openai/<served name>'" in str(warning.message)
    assert [(c.source, c.trainable, c.prompt_token_ids) for c in t.calls] == [
        ("google_adk", True, None)
    ] * 2
    assert t.trainable_turns == 0
    items = t.to_art().messages_and_choices
    assert items == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "1+2?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1_0_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1_0_0", "content": '{"result": 3}'},
        {"role": "assistant", "content": "3."},
    ]
    assert t.to_art().tools == llm.requests[0]["tools"]


class UnseenModel(BaseLlm):
    """A model provider arttrace cannot see below ADK (it posts with urllib3 directly, a client
    arttrace does not hook) that reports logprobs the way ADK's Gemini model does
    (``LlmResponse.logprobs_result``)."""

    base_url: str = ""
    served: list[dict[str, Any]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        text = llm_request.contents[-1].parts[0].text
        body = {"model": self.model, "messages": [{"role": "user", "content": text}]}
        reply = await asyncio.to_thread(
            urllib3.PoolManager().request,
            "POST",
            f"{self.base_url}/chat/completions",
            json=body | {"logprobs": True},
        )
        choice = reply.json()["choices"][0]
        self.served = choice["logprobs"]["content"]
        yield LlmResponse(
            content=types.Content(
                role="model", parts=[types.Part(text=choice["message"]["content"])]
            ),
            finish_reason=types.FinishReason.STOP,
            logprobs_result=types.LogprobsResult(
                chosen_candidates=[
                    types.LogprobsResultCandidate(
                        token=t["token"],
                        token_id=int(t["token"].removeprefix("token_id:")),
                        log_probability=t["logprob"],
                    )
                    for t in self.served
                ]
            ),
        )


async def test_logprobs_adk_keeps_are_recorded_and_the_missing_token_ids_warned(
    instrumented: None, server: Serve
) -> None:
    """A model outside the OpenAI SDK: its logprobs (Gemini's logprobs_result) are kept, the
    turn is context only (no prompt token ids), and the warning says which route works."""
    model = UnseenModel(
        model="policy", base_url=server(ScriptedLLM([Reply("Hello there.")])).base_url
    )
    runner = InMemoryRunner(agent=LlmAgent(name="greeter", model=model), app_name="app")

    @at.trainable
    async def greet() -> None:
        await ask(runner, await new_session(runner), "hi")

    with pytest.warns(at.UntrainableTurnWarning, match=r"no token ids.*does not see this ADK"):
        async with at.trajectory("gemini-like") as t:
            await greet()
    (call,) = t.calls
    assert (call.source, call.model, call.trainable) == ("google_adk", "policy", True)
    (choice,) = call.choices
    assert choice.message == {"role": "assistant", "content": "Hello there."}
    assert choice.logprobs is not None and choice.token_ids is not None
    assert choice.logprobs.tolist() == [t["logprob"] for t in model.served]
    assert [f"token_id:{i}" for i in choice.token_ids] == [t["token"] for t in model.served]


# -- install / uninstall, spans ----------------------------------------------------------------


async def test_instrument_adds_one_plugin_and_uninstrument_removes_every_hook(
    server: Serve,
) -> None:
    llm = ScriptedLLM([Reply("one"), Reply("two")])
    url = server(llm).base_url
    mine = ArttracePlugin()
    explicit = InMemoryRunner(app=App(name="app", root_agent=calc_agent(url), plugins=[mine]))
    auto = InMemoryRunner(agent=calc_agent(url), app_name="app")
    at.instrument()
    at.instrument()  # idempotent
    try:
        async with at.trajectory("on") as t:
            await ask(auto, await new_session(auto), "hi")
            await ask(explicit, await new_session(explicit), "hi")
        assert [(c.source, c.framework) for c in t.calls] == [("openai", "google_adk")] * 2
        assert [type(p) for p in auto.plugin_manager.plugins] == [ArttracePlugin]
        assert explicit.plugin_manager.plugins == [mine]
    finally:
        at.uninstrument()
        at.uninstrument()
        _warnings.reset()
    assert auto.plugin_manager.plugins == [] and explicit.plugin_manager.plugins == [mine]
    assert "acompletion" in LiteLLMClient.__dict__ and not hasattr(
        LiteLLMClient.__dict__["acompletion"], "__wrapped__"
    )
    assert not hasattr(Runner.__dict__["run_async"], "__wrapped__")
    llm2 = ScriptedLLM([Reply("three")])
    quiet = InMemoryRunner(agent=calc_agent(server(llm2).base_url), app_name="app")
    async with at.trajectory("off") as t:
        await ask(quiet, await new_session(quiet), "hi")
    assert t.calls == [] and quiet.plugin_manager.plugins == []


async def test_uninstrument_removes_only_arttraces_own_wrappers(server: Serve) -> None:
    """Another library (an APM agent, ART's capture) wraps ADK's Runner and LiteLLM's client,
    before and after arttrace: instrument() still hooks ADK, and uninstrument() removes
    arttrace's wrappers only, wherever they sit in the chain; the other library's stay."""
    originals = [
        (Runner, "run_async", Runner.__dict__["run_async"]),
        (LiteLLMClient, "acompletion", LiteLLMClient.__dict__["acompletion"]),
    ]
    seen: list[str] = []

    def theirs(label: str) -> Callable[..., Any]:
        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            seen.append(label)
            return wrapped(*args, **kwargs)

        return wrapper

    llm = ScriptedLLM([Reply("one"), Reply("two")])
    runner = InMemoryRunner(agent=calc_agent(server(llm).base_url), app_name="app")
    try:
        wrapt.wrap_function_wrapper(Runner, "run_async", theirs("runner, inside"))
        at.instrument()
        wrapt.wrap_function_wrapper(Runner, "run_async", theirs("runner, outside"))
        wrapt.wrap_function_wrapper(LiteLLMClient, "acompletion", theirs("litellm, outside"))
        async with at.trajectory("on") as t:
            await ask(runner, await new_session(runner), "hi")
        assert [(c.source, c.framework) for c in t.calls] == [("openai", "google_adk")]
        assert [type(p) for p in runner.plugin_manager.plugins] == [ArttracePlugin]
        at.uninstrument()
        assert runner.plugin_manager.plugins == []
        seen.clear()
        async with at.trajectory("off") as t:
            await ask(runner, await new_session(runner), "hi")
        assert t.calls == [] and runner.plugin_manager.plugins == []
        assert sorted(seen) == ["litellm, outside", "runner, inside", "runner, outside"]
    finally:
        at.uninstrument()
        _warnings.reset()
        for owner, name, original in originals:
            setattr(owner, name, original)


async def test_agent_and_tool_steps_are_spans_around_the_model_calls(
    instrumented: None, server: Serve, spans: InMemorySpanExporter
) -> None:
    exporter = spans
    llm = ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]), Reply("3.")])
    runner = InMemoryRunner(agent=calc_agent(server(llm).base_url), app_name="app")
    async with at.trajectory("spans") as t:
        await ask(runner, await new_session(runner), "1+2?")
    ours = [
        s for s in exporter.get_finished_spans() if (s.attributes or {}).get("arttrace.framework")
    ]
    (agent,) = [s for s in ours if s.name == "invoke_agent calc"]
    (tool,) = [s for s in ours if s.name == "execute_tool add"]
    assert tool.parent is not None and tool.parent.span_id == agent.context.span_id
    assert (
        tool.attributes["gen_ai.tool.call.id"]
        == t.calls[0].choices[0].message["tool_calls"][0]["id"]
    )
    framework_chats = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "chat policy" and s.parent and s.parent.span_id == agent.context.span_id
    ]
    assert len(framework_chats) == 2
    assert agent.attributes["arttrace.example_id"] == "spans"
