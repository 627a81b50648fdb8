"""LlamaIndex: real agents, chats and streams over loopback HTTP to the scripted vLLM-like server.

Every LLM call is kept once (the shim's exact tokens, LlamaIndex's names), every policy turn is
a trainable Choice, tool calls and results keep their ids, runs stay in their own trajectories,
and the handler alone (without the shim) records LlamaIndex's view and says how to fix it.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable
from typing import Any

import openai
import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.workflow import Event, StartEvent, StopEvent, Workflow, step
from llama_index.llms.openai import OpenAI
from openai.types.chat.chat_completion import Choice
from opentelemetry.sdk.trace import ReadableSpan

import arttrace as at
from arttrace.capture import _warnings
from arttrace.integrations import llama_index as li
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall

MODEL = "gpt-4o-mini"  # llama_index.llms.openai.OpenAI accepts only model names it knows
ServerFactory = Callable[[ScriptedLLM], LLMServer]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two numbers."""
    return a * b


def make_llm(server: LLMServer, **kwargs: Any) -> OpenAI:
    return OpenAI(model=MODEL, api_base=server.base_url, api_key="test", max_retries=0, **kwargs)


def kinds(items: list[Any]) -> list[str]:
    return ["Choice" if isinstance(i, Choice) else i["role"] for i in items]


def assert_trainable(choice: Any) -> None:
    assert isinstance(choice, Choice) and choice.logprobs is not None
    assert choice.logprobs.content, "a trainable turn carries its sampled tokens' logprobs"
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] and len(extra["token_ids"]) == len(choice.logprobs.content)


def our_handlers() -> tuple[list[Any], list[Any]]:
    root = get_dispatcher()
    return (
        [h for h in root.event_handlers if isinstance(h, li.ArttraceEventHandler)],
        [h for h in root.span_handlers if isinstance(h, li.ArttraceSpanHandler)],
    )


def assert_nothing_left_open() -> None:
    (handler,), _ = our_handlers()
    assert len(handler._state.pending) == 0 and len(handler._state.nodes) == 0


# -- agents ---------------------------------------------------------------------------------


async def test_function_agent_tool_loop_is_one_trainable_conversation(instrumented, server):
    llm_server = server(
        ScriptedLLM(
            [
                Reply(
                    tool_calls=[
                        ToolCall("add", {"a": 1, "b": 2}),
                        ToolCall("mul", {"a": 3, "b": 4}),
                    ]
                ),
                Reply(tool_calls=[ToolCall("add", {"a": 3, "b": 12})]),
                Reply("It is 15."),
            ]
        )
    )
    agent = FunctionAgent(
        name="calculator",
        tools=[add, mul],
        llm=make_llm(llm_server, logprobs=True),
        system_prompt="Use the tools.",
    )

    @at.trainable
    async def solve(question: str) -> str:
        return str(await agent.run(question))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with at.trajectory("q-1") as t:
            answer = await solve("What is 1+2 + 3*4?")
            t.reward = 1.0
    assert answer == "It is 15."
    assert not [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]

    # FunctionAgent streams, and sends tool_choice and parallel_tool_calls (top_logprobs only
    # because the LLM was made with logprobs=True); the shim added return_token_ids.
    requests = llm_server.llm.requests
    assert all(r["stream"] is True for r in requests)
    assert all(r["tool_choice"] == "auto" and r["parallel_tool_calls"] is True for r in requests)
    assert all(r["top_logprobs"] == 0 and r["return_token_ids"] is True for r in requests)

    # One record per call (each was seen by LlamaIndex and by the shim), named by LlamaIndex.
    assert len(t.call_log.records) == 6 and len(t.calls) == 3
    assert {(c.source, c.framework, c.step, c.streamed, c.trainable) for c in t.calls} == {
        ("openai", "llama_index", "calculator", True, True)
    }

    result = t.to_art()
    items = result.messages_and_choices
    assert kinds(items) == ["system", "user", "Choice", "tool", "tool", "Choice", "tool", "Choice"]
    for choice in (items[2], items[5], items[7]):
        assert_trainable(choice)
    first_calls = items[2].message.tool_calls
    assert [tc.function.name for tc in first_calls] == ["add", "mul"]
    # Both tools ran in parallel; their results carry the ids of the calls they answer.
    results = {m["tool_call_id"]: m["content"] for m in items[3:5]}
    assert results == {first_calls[0].id: "3", first_calls[1].id: "12"}
    assert items[6] == {
        "role": "tool",
        "content": "15",
        "tool_call_id": items[5].message.tool_calls[0].id,
    }
    assert items[7].message.content == "It is 15."
    assert [tool["function"]["name"] for tool in result.tools] == ["add", "mul"]
    assert result.additional_histories == []
    assert t.trainable_turns == 3
    assert_nothing_left_open()


async def test_function_agent_without_streaming(instrumented, server):
    llm_server = server(
        ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 2})]), Reply("4")])
    )
    agent = FunctionAgent(tools=[add], llm=make_llm(llm_server), streaming=False)

    @at.trainable(name="solver")
    async def solve() -> str:
        return str(await agent.run("2+2?"))

    async with at.trajectory("q") as t:
        assert await solve() == "4"
        t.reward = 0.5
    assert [r["stream"] for r in llm_server.llm.requests] == [False, False]
    assert [(c.framework, c.step, c.streamed, c.agent) for c in t.calls] == [
        ("llama_index", "Agent", False, "solver")
    ] * 2
    items = t.to_art().messages_and_choices
    assert kinds(items) == ["user", "Choice", "tool", "Choice"]
    assert_trainable(items[1])
    assert_trainable(items[3])
    assert items[2]["tool_call_id"] == items[1].message.tool_calls[0].id


async def test_react_agent_turns_are_trainable(instrumented, server):
    llm_server = server(
        ScriptedLLM(
            [
                'Thought: I need a tool.\nAction: add\nAction Input: {"a": 5, "b": 6}',
                "Thought: I can answer.\nAnswer: 11",
            ]
        )
    )
    agent = ReActAgent(name="reasoner", tools=[add], llm=make_llm(llm_server))

    @at.trainable
    async def solve() -> str:
        return str(await agent.run("5+6?"))

    async with at.trajectory("q") as t:
        assert await solve() == "11"
        t.reward = 1.0
    assert [(c.framework, c.step) for c in t.calls] == [("llama_index", "reasoner")] * 2
    # ReActAgent re-renders its own turn before sending it back (the action input as a Python
    # dict), so the second call does not extend the first: it is an additional history, and
    # both sampled turns stay trainable.
    sampled = t.calls[0].choices[0].message["content"]
    sent_back = t.calls[1].messages[-2]["content"]
    assert '{"a": 5, "b": 6}' in sampled and "{'a': 5, 'b': 6}" in sent_back
    assert t.calls[1].messages[-1] == {"role": "user", "content": "Observation: 11"}
    result = t.to_art()
    (other,) = result.additional_histories
    for history in (result.messages_and_choices, other.messages_and_choices):
        assert kinds(history)[-1] == "Choice"
        assert_trainable(history[-1])
    assert t.trainable_turns == 2


async def test_agent_workflow_names_each_call_by_the_agent_that_made_it(instrumented, server):
    llm = make_llm(
        server(
            ScriptedLLM(
                [
                    Reply(
                        tool_calls=[ToolCall("handoff", {"to_agent": "math", "reason": "a sum"})]
                    ),
                    Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]),
                    "3",
                ]
            )
        )
    )
    triage = FunctionAgent(
        name="triage", description="Routes questions.", llm=llm, can_handoff_to=["math"]
    )
    math = FunctionAgent(name="math", description="Does sums.", tools=[add], llm=llm)
    workflow = AgentWorkflow(agents=[triage, math], root_agent="triage")

    @at.trainable
    async def solve() -> str:
        return str(await workflow.run(user_msg="1+2?"))

    async with at.trajectory("q") as t:
        assert await solve() == "3"
        t.reward = 1.0
    assert [(c.framework, c.step) for c in t.calls] == [
        ("llama_index", "triage"),
        ("llama_index", "math"),
        ("llama_index", "math"),
    ]
    items = t.to_art().messages_and_choices
    assert kinds(items) == ["user", "Choice", "tool", "Choice", "tool", "Choice"]
    assert items[2]["tool_call_id"] == items[1].message.tool_calls[0].id
    assert t.trainable_turns == 3


async def test_fifty_concurrent_agents_stay_in_their_own_trajectories(instrumented, server):
    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "user":  # "task <n>"
            n = int(last["content"].split()[-1])
            return Reply(tool_calls=[ToolCall("add", {"a": n, "b": 1000})])
        return Reply(f"result {last['content']}")

    llm_server = server(ScriptedLLM(respond))
    agent = FunctionAgent(tools=[add], llm=make_llm(llm_server))  # one agent, 50 runs

    @at.trainable
    async def solve(n: int) -> str:
        return str(await agent.run(f"task {n}"))

    async def rollout(n: int) -> at.Trajectory:
        async with at.trajectory(f"task-{n}") as t:
            assert await solve(n) == f"result {n + 1000}"
            t.reward = float(n)
        return t

    runs = await asyncio.gather(*(rollout(n) for n in range(50)))
    seen_ids: set[str] = set()
    for n, t in enumerate(runs):
        assert len(t.calls) == 2, f"trajectory {n} has {len(t.calls)} calls"
        assert all(c.framework == "llama_index" and c.trainable for c in t.calls)
        items = t.to_art().messages_and_choices
        assert kinds(items) == ["user", "Choice", "tool", "Choice"]
        assert items[0]["content"] == f"task {n}"
        call_id = items[1].message.tool_calls[0].id
        assert json.loads(items[1].message.tool_calls[0].function.arguments) == {
            "a": n,
            "b": 1000,
        }
        assert items[2] == {"role": "tool", "content": str(n + 1000), "tool_call_id": call_id}
        assert items[3].message.content == f"result {n + 1000}"
        assert call_id not in seen_ids
        seen_ids.add(call_id)
    assert len(llm_server.llm.requests) == 100
    assert_nothing_left_open()


# -- plain chats, streams, workflows, threads ------------------------------------------------


def test_sync_chat_and_stream_chat(instrumented, server):
    llm = make_llm(server(ScriptedLLM(["plain answer", "streamed answer"])))
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi"),
    ]

    @at.trainable
    def chat() -> list[str]:
        whole = llm.chat(messages)
        # LlamaIndex builds ChatResponse.logprobs from top_logprobs only: none were asked for.
        assert whole.logprobs == []
        streamed = [r.delta for r in llm.stream_chat(messages)]
        return [whole.message.content or "", "".join(d or "" for d in streamed)]

    with at.trajectory("q") as t:
        assert chat() == ["plain answer", "streamed answer"]
        t.reward = 1.0
    assert [(c.framework, c.streamed, c.trainable, c.step) for c in t.calls] == [
        ("llama_index", False, True, None),
        ("llama_index", True, True, None),
    ]
    assert t.calls[0].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    # LlamaIndex's own record of each call (merged away) holds the same sampled tokens as the
    # shim's: read from the raw completion and from every raw chunk, not from ChatResponse.
    ours = sorted((c for c in t.call_log.records if c.source == "llama_index"), key=lambda c: c.seq)
    shims = sorted((c for c in t.call_log.records if c.source == "openai"), key=lambda c: c.seq)
    for mine, shim in zip(ours, shims, strict=True):
        assert mine.response_id == shim.response_id
        assert mine.choices[0].logprobs == shim.choices[0].logprobs
        assert mine.choices[0].token_ids == shim.choices[0].token_ids
        assert mine.prompt_token_ids == shim.prompt_token_ids
    main, branch = t.to_art(), t.to_art().additional_histories[0]  # same prompt: two histories
    assert_trainable(main.messages_and_choices[-1])
    assert_trainable(branch.messages_and_choices[-1])


async def test_async_chat_and_stream_chat(instrumented, server):
    llm = make_llm(server(ScriptedLLM(["first", "second"])))

    @at.trainable
    async def chat() -> str:
        first = await llm.achat([ChatMessage(role="user", content="one")])
        history = [ChatMessage(role="user", content="one"), first.message]
        history.append(ChatMessage(role="user", content="two"))
        text = ""
        async for part in await llm.astream_chat(history):
            text = part.message.content or ""
        return text

    async with at.trajectory("q") as t:
        assert await chat() == "second"
        t.reward = 1.0
    assert [(c.framework, c.streamed) for c in t.calls] == [
        ("llama_index", False),
        ("llama_index", True),
    ]
    items = t.to_art().messages_and_choices
    assert kinds(items) == ["user", "Choice", "user", "Choice"]
    assert_trainable(items[1])
    assert_trainable(items[3])


class _Middle(Event):
    text: str


class _SyncThenAsync(Workflow):
    """A sync step (LlamaIndex runs it in an executor thread), then an async one (a task)."""

    def __init__(self, llm: OpenAI) -> None:
        super().__init__(timeout=30)
        self.llm = llm

    @step
    def sync_step(self, ev: StartEvent) -> _Middle:
        return _Middle(
            text=self.llm.chat([ChatMessage(role="user", content="sync")]).message.content
        )

    @step
    async def async_step(self, ev: _Middle) -> StopEvent:
        reply = await self.llm.achat([ChatMessage(role="user", content=f"async after {ev.text}")])
        return StopEvent(result=reply.message.content)


async def test_workflow_steps_in_threads_and_tasks_keep_the_run(instrumented, server):
    llm = make_llm(server(ScriptedLLM()))  # echoes
    workflow = _SyncThenAsync(llm)

    @at.trainable(name="pipeline")
    async def run() -> str:
        return str(await workflow.run())

    async with at.trajectory("wf") as t:
        assert await run() == "You said: async after You said: sync"
        t.reward = 1.0
    assert [(c.agent, c.trainable, c.framework) for c in t.calls] == [
        ("pipeline", True, "llama_index")
    ] * 2
    assert t.trainable_turns == 2


def test_sync_entry_points_with_internal_threads(instrumented, server):
    """A chat engine streams in a thread of its own; asyncio.run runs an agent in a new loop."""
    llm_server = server(
        ScriptedLLM(
            [
                "engine reply",
                Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 1})]),
                "2",
            ]
        )
    )
    llm = make_llm(llm_server)
    engine = SimpleChatEngine.from_defaults(llm=llm)
    agent = FunctionAgent(tools=[add], llm=llm)

    async def run_agent() -> str:
        return str(await agent.run("1+1?"))

    @at.trainable
    def run() -> list[str]:
        streamed = engine.stream_chat("hello")
        text = "".join(streamed.response_gen)
        return [text, asyncio.run(run_agent())]

    with at.trajectory("sync") as t:
        assert run() == ["engine reply", "2"]
        t.reward = 1.0
    assert len(t.calls) == 3
    assert all(c.trainable and c.framework == "llama_index" for c in t.calls)
    assert t.trainable_turns == 3


# -- failures ----------------------------------------------------------------------------------


def test_failed_cut_and_abandoned_calls_are_kept_once(instrumented, server):
    failing = make_llm(server(ScriptedLLM([])))  # no reply left: HTTP 500
    cut = make_llm(server(ScriptedLLM(["a long streamed answer"], cut_stream_after=3)))
    dropped = make_llm(server(ScriptedLLM(["never read to its end"])))
    question = [ChatMessage(role="user", content="q")]

    @at.trainable
    def run() -> None:
        with pytest.raises(Exception, match="no reply left"):
            failing.chat(question)
        with pytest.raises(Exception, match="peer closed connection"):
            list(cut.stream_chat(question))
        stream = dropped.stream_chat(question)
        next(stream)
        stream.close()

    with at.trajectory("q") as t:
        run()
    failed, cut_call, abandoned = t.calls
    assert all(c.framework == "llama_index" for c in t.calls)
    assert "InternalServerError" in (failed.error or "")
    assert cut_call.partial and "peer closed connection" in (cut_call.error or "")
    assert abandoned.partial
    assert t.trainable_turns == 0
    assert_nothing_left_open()


# -- spans -----------------------------------------------------------------------------------


async def test_agent_and_tool_steps_are_spans(instrumented, server, spans):
    llm_server = server(
        ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2}, id="call-7")]), "3"])
    )
    agent = FunctionAgent(name="adder", tools=[add], llm=make_llm(llm_server))

    @at.trainable(name="solve")
    async def solve() -> None:
        await agent.run("1+2?")

    async with at.trajectory("spans"):
        await solve()
    finished = spans.get_finished_spans()

    def named(name: str) -> list[ReadableSpan]:
        return [s for s in finished if s.name == name]

    (agent_span,) = named("invoke_agent adder")
    (tool_span,) = named("execute_tool add")
    (trainable_span,) = named("trainable solve")
    chats = [s for s in named(f"chat {MODEL}") if s.parent == agent_span.context]
    assert len(chats) == 2  # LlamaIndex's view of both calls, under the agent
    assert (
        agent_span.parent is not None
        and agent_span.parent.span_id == trainable_span.context.span_id
    )
    assert tool_span.parent is not None and tool_span.parent.span_id == agent_span.context.span_id
    assert tool_span.attributes is not None and agent_span.attributes is not None
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call-7"
    assert tool_span.attributes["arttrace.framework"] == "llama_index"
    assert agent_span.attributes["gen_ai.agent.name"] == "adder"
    assert agent_span.attributes["arttrace.example_id"] == "spans"
    assert_nothing_left_open()


# -- without the shim ------------------------------------------------------------------------


async def test_handler_alone_records_llama_index_view_and_warns_once(server):
    """No at.instrument(): LlamaIndex's own records, each message separate with its role (the
    NeMo harness collapsed the prompt into one system message), and one warning saying what
    to do."""
    _warnings.reset()
    llm_server = server(
        ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]), Reply("It is 3.")])
    )
    agent = FunctionAgent(
        tools=[add],
        llm=make_llm(llm_server, logprobs=True),
        system_prompt="Use tools.",
        streaming=False,
    )
    history = [
        ChatMessage(role="user", content="Earlier question"),
        ChatMessage(role="assistant", content="Earlier answer"),
    ]
    question = ChatMessage(
        role="user",
        blocks=[
            TextBlock(text="What is 1+2? "),
            ImageBlock(url="https://example.com/sum.png"),
        ],
    )

    @at.trainable
    async def solve() -> str:
        return str(await agent.run(question, chat_history=history))

    li.install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with at.trajectory("alone") as t:
                assert await solve() == "It is 3."
                t.reward = 1.0
    finally:
        li.uninstall()
        _warnings.reset()

    first, second = t.calls
    assert {(c.source, c.framework, c.step, c.trainable) for c in t.calls} == {
        ("llama_index", "llama_index", "Agent", True)
    }
    assert first.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Earlier question"},
        {"role": "assistant", "content": "Earlier answer"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is 1+2? "},
                {"type": "image_url", "image_url": {"url": "https://example.com/sum.png"}},
            ],
        },
    ]
    # What LlamaIndex sent is what was recorded, message for message.
    sent = llm_server.llm.requests[0]["messages"]
    assert [m["role"] for m in sent] == [m["role"] for m in first.messages]
    assert first.tools == llm_server.llm.requests[0]["tools"]
    call_id = first.choices[0].message["tool_calls"][0]["id"]
    assert second.messages[-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                }
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": call_id},
    ]
    # LlamaIndex's ChatResponse.logprobs holds only top_logprobs (none were asked for); the
    # sampled tokens' logprobs come from the raw completion, one per completion token.
    for call in t.calls:
        (choice,) = call.choices
        assert choice.logprobs is not None and call.usage is not None
        assert len(choice.logprobs) == call.usage["completion_tokens"]
        assert call.prompt_token_ids is None  # nobody asked vLLM for them

    result = t.to_art()
    assert kinds(result.messages_and_choices) == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert result.additional_histories == [] and t.trainable_turns == 0
    untrainable = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(untrainable) == 1
    assert "arttrace.instrument()" in str(untrainable[0].message)
    assert "no token ids" in str(untrainable[0].message)

    async with at.trajectory("after") as after:  # detached: nothing is recorded
        await make_llm(server(ScriptedLLM())).achat([ChatMessage(role="user", content="x")])
    assert after.calls == []


async def test_handler_alone_with_token_ids_requested_is_trainable(server):
    """LlamaIndex passes the raw completion up: when the LLM itself asks vLLM for token ids,
    the handler alone has everything ART needs."""
    llm = make_llm(
        server(ScriptedLLM(["exact"])),
        logprobs=True,
        additional_kwargs={"extra_body": {"return_token_ids": True}},
    )

    @at.trainable
    async def ask() -> None:
        async for _ in await llm.astream_chat([ChatMessage(role="user", content="q")]):
            pass

    li.install()
    try:
        async with at.trajectory("exact") as t:
            await ask()
            t.reward = 1.0
    finally:
        li.uninstall()
    (call,) = t.calls
    assert call.source == "llama_index" and call.streamed
    assert_trainable(t.to_art().messages_and_choices[-1])


async def test_headers_in_additional_kwargs_are_never_recorded(server):
    """extra_headers given through additional_kwargs reach the server but never the record,
    which the journal and saved trajectories are written from."""
    secret = "sk-journal-must-never-hold-this"
    headers = {"Authorization": f"Bearer {secret}", "X-Trace": "t-1"}
    llm = make_llm(
        server(ScriptedLLM(["Hi."])),
        temperature=0.5,
        default_headers=headers,
        additional_kwargs={"extra_headers": headers},
    )
    li.install()
    try:
        async with at.trajectory("headers") as t:
            await llm.achat([ChatMessage(role="user", content="Hello")])
            t.reward = 1.0
    finally:
        li.uninstall()
    (call,) = t.calls
    assert call.source == "llama_index" and call.params["temperature"] == 0.5
    assert not {"extra_headers", "default_headers"} & set(call.params)
    assert secret not in json.dumps(call.to_dict())
    assert secret not in t.to_art().model_dump_json()


async def test_a_failure_inside_the_handler_never_reaches_the_caller(server, monkeypatch):
    """Fault injection into arttrace's own code: a handler that fails is logged and swallowed;
    the call it was recording is kept, marked."""

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(li, "_finish", broken)
    llm = make_llm(server(ScriptedLLM(["Hi."])))
    li.install()
    try:
        async with at.trajectory("fault") as t:
            response = await llm.achat([ChatMessage(role="user", content="Hello")])
    finally:
        li.uninstall()
    assert response.message.content == "Hi."
    (call,) = t.calls
    assert call.source == "llama_index" and "injected" in (call.capture_error or "")


async def test_handler_with_wrapped_clients_is_trainable_without_instrument(server):
    """The fix the warning gives: clients wrapped with at.wrap_openai, no global patch."""
    url = server(ScriptedLLM(["wrapped"])).base_url
    llm = OpenAI(
        model=MODEL,
        api_key="test",
        openai_client=at.wrap_openai(openai.OpenAI(base_url=url, api_key="test")),
        async_openai_client=at.wrap_openai(openai.AsyncOpenAI(base_url=url, api_key="test")),
    )

    @at.trainable
    async def ask() -> None:
        await llm.achat([ChatMessage(role="user", content="q")])

    li.install()
    try:
        async with at.trajectory("wrapped") as t:
            await ask()
            t.reward = 1.0
    finally:
        li.uninstall()
    (call,) = t.calls
    assert (call.source, call.framework) == ("openai", "llama_index")
    assert_trainable(t.to_art().messages_and_choices[-1])


def test_install_and_uninstall_are_idempotent_and_uninstall_stops_recording(server):
    llm = make_llm(server(ScriptedLLM(["one", "two"])))
    li.install()
    at.instrument()
    at.instrument()
    try:
        assert [len(hs) for hs in our_handlers()] == [1, 1]
    finally:
        at.uninstrument()
        at.uninstrument()
    assert our_handlers() == ([], [])
    li.uninstall()

    @at.trainable
    def ask() -> None:
        llm.chat([ChatMessage(role="user", content="q")])

    _warnings.reset()  # once per process: this test asserts it
    with (
        pytest.warns(at.NothingToTrainWarning, match=r"instrument\(\) was not called"),
        at.trajectory("off") as t,
    ):
        ask()
    assert t.calls == []


def test_attach_and_detach_still_work_and_say_they_are_deprecated():
    with pytest.warns(DeprecationWarning, match=r"attach .* use .*\.install"):
        handler = li.attach()
    try:
        assert handler is li.install()
        assert [len(hs) for hs in our_handlers()] == [1, 1]
    finally:
        with pytest.warns(DeprecationWarning, match=r"detach .* use .*\.uninstall"):
            li.detach()
    assert our_handlers() == ([], [])
