"""LangChain / LangGraph: real agents over loopback HTTP to the scripted vLLM-like server."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from langchain_core.tracers.context import _configure_hooks
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.types import interrupt
from openai.types.chat.chat_completion import Choice
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

import arttrace as at
from arttrace.capture import _warnings
from arttrace.integrations import langchain as lc
from arttrace.integrations.langchain import ArttraceCallbackHandler
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def mul(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{verb} two numbers.",
            "parameters": {
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "type": "object",
            },
        },
    }
    for name, verb in (("add", "Add"), ("mul", "Multiply"))
]


def react_replies(request: dict[str, Any]) -> Reply:
    """Turn 1: add and mul in parallel; turn 2: mul of the sum; turn 3: the answer.
    The numbers come from the user's "agent <k>", so each run's calls are its own."""
    messages = request["messages"]
    k = int(re.findall(r"agent (\d+)", messages[1]["content"])[0])
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return Reply(
            "Let me compute.",
            tool_calls=[ToolCall("add", {"a": k, "b": 1}), ToolCall("mul", {"a": k, "b": 2})],
        )
    if len(results) == 2:
        return Reply(tool_calls=[ToolCall("mul", {"a": float(results[0]), "b": 10})])
    return Reply(f"agent {k}: {results[-1]}")


def model(server: LLMServer, name: str = "policy", **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.base_url, api_key="test", model=name, max_retries=0, **kwargs)


def react_agent(server: LLMServer, **kwargs: Any) -> Any:
    return create_react_agent(model(server, **kwargs), [add, mul], prompt="You compute.")


def kinds(items: list[Any]) -> list[str]:
    return [type(i).__name__ if isinstance(i, Choice) else i["role"] for i in items]


def assert_react_run(t: at.Trajectory, k: int) -> None:
    """The ReAct run for "agent <k>": three policy turns, each a trainable Choice carrying
    vLLM's tokens, with its tool calls answered by tool results of the same ids, in order."""
    assert len(t.calls) == 3
    assert all(
        c.framework == "langchain" and c.source == "openai" and c.step == "agent" and c.trainable
        for c in t.calls
    )
    result = t.to_art()
    items = result.messages_and_choices
    assert kinds(items) == ["system", "user", "Choice", "tool", "tool", "Choice", "tool", "Choice"]
    assert items[1] == {"role": "user", "content": f"agent {k}"}
    for choice in (items[2], items[5], items[7]):
        assert choice.logprobs is not None and len(choice.logprobs.content) > 0
        extra = choice.model_extra or {}
        assert extra["prompt_token_ids"] and len(extra["token_ids"]) == len(choice.logprobs.content)
    first, second = items[2].message, items[5].message
    # The trap of NeMo's parser: tool results folded into assistant text, tool calls dropped.
    assert first.content == "Let me compute."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in first.tool_calls] == [
        ("add", {"a": k, "b": 1}),
        ("mul", {"a": k, "b": 2}),
    ]
    assert [(m["tool_call_id"], m["content"]) for m in items[3:5]] == [
        (first.tool_calls[0].id, str(float(k + 1))),
        (first.tool_calls[1].id, str(float(2 * k))),
    ]
    assert items[6]["tool_call_id"] == second.tool_calls[0].id
    assert items[6]["content"] == str(float((k + 1) * 10))
    assert items[7].message.content == f"agent {k}: {float((k + 1) * 10)}"
    assert not items[7].message.tool_calls
    assert result.tools == TOOL_SCHEMAS
    assert result.additional_histories == []
    assert t.trainable_turns == 3


@pytest.fixture
def llm_server(server: Callable[[ScriptedLLM], LLMServer]) -> Callable[..., LLMServer]:
    return lambda replies=react_replies, **kw: server(ScriptedLLM(replies, **kw))


@pytest.fixture(autouse=True)
def no_leaked_runs() -> Iterator[None]:
    yield
    assert len(lc._runs) == 0, "the handler kept state for runs that ended"


# -- the ReAct agent ----------------------------------------------------------------------


def test_react_agent_sync_invoke_runs_nodes_in_threads_and_keeps_each_turn_once(
    instrumented, llm_server
):
    s = llm_server()
    agent = react_agent(s)

    @at.trainable
    def solve(k: int) -> Any:
        return agent.invoke({"messages": [("user", f"agent {k}")]})

    with at.trajectory("ex") as t:
        out = solve(7)
        t.reward = 1.0
    assert out["messages"][-1].content == "agent 7: 80.0"
    assert len(s.llm.requests) == 3
    assert_react_run(t, 7)


async def test_react_agent_ainvoke(instrumented, llm_server):
    s = llm_server()
    agent = react_agent(s)

    @at.trainable
    async def solve(k: int) -> Any:
        return await agent.ainvoke({"messages": [("user", f"agent {k}")]})

    async with at.trajectory("ex") as t:
        await solve(3)
        t.reward = 1.0
    assert_react_run(t, 3)


async def test_fifty_concurrent_agents_each_keep_only_their_own_calls(instrumented, llm_server):
    s = llm_server()
    agent = react_agent(s)

    @at.trainable
    async def solve(k: int) -> Any:
        return await agent.ainvoke({"messages": [("user", f"agent {k}")]})

    async def rollout(k: int) -> at.Trajectory:
        async with at.trajectory(f"ex-{k}") as t:
            await solve(k)
            t.reward = float(k)
        return t

    trajectories = await asyncio.gather(*(rollout(k) for k in range(50)))
    assert len(s.llm.requests) == 150
    for k, t in enumerate(trajectories):
        assert_react_run(t, k)
        assert {c.response_id for c in t.calls}.isdisjoint(
            c.response_id for other in trajectories if other is not t for c in other.calls
        )


def test_react_agent_streaming_model_keeps_tool_calls_and_tokens(instrumented, llm_server):
    s = llm_server()
    agent = react_agent(s, streaming=True)

    @at.trainable
    def solve(k: int) -> list[Any]:
        inputs = {"messages": [("user", f"agent {k}")]}
        return list(agent.stream(inputs, stream_mode="messages"))

    with at.trajectory("ex") as t:
        chunks = solve(5)
        t.reward = 1.0
    assert any(getattr(m, "tool_call_chunks", None) for m, _ in chunks)
    assert all(s.llm.requests[i]["stream"] for i in range(3))
    assert all(c.streamed for c in t.calls)
    assert_react_run(t, 5)


async def test_astream_of_a_model(instrumented, llm_server):
    s = llm_server(["Hello there, friend."])
    chat = model(s)

    @at.trainable
    async def greet() -> str:
        return "".join([str(chunk.content) async for chunk in chat.astream("hi")])

    async with at.trajectory("ex") as t:
        assert await greet() == "Hello there, friend."
        t.reward = 1.0
    (call,) = t.calls
    assert call.framework == "langchain" and call.streamed and call.trainable
    (choice,) = [i for i in t.to_art().messages_and_choices if isinstance(i, Choice)]
    assert choice.message.content == "Hello there, friend." and choice.logprobs is not None


# -- structured output --------------------------------------------------------------------


class Answer(BaseModel):
    value: int
    reason: str


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_chain(instrumented, llm_server, method):
    arguments = {"value": 42, "reason": "it is"}
    reply = (
        Reply(json.dumps(arguments))
        if method == "json_schema"
        else Reply(tool_calls=[ToolCall("Answer", arguments)])
    )
    s = llm_server([reply])
    prompt = ChatPromptTemplate.from_messages([("system", "Answer in JSON."), ("user", "{q}")])
    chain = prompt | model(s).with_structured_output(Answer, method=method)

    @at.trainable
    def ask(q: str) -> Answer:
        return chain.invoke({"q": q})

    with at.trajectory("ex") as t:
        assert ask("what is it?") == Answer(value=42, reason="it is")
        t.reward = 1.0
    (call,) = t.calls
    assert call.framework == "langchain" and call.source == "openai" and call.trainable
    items = t.to_art().messages_and_choices
    assert kinds(items) == ["system", "user", "Choice"]
    assert items[1] == {"role": "user", "content": "what is it?"}
    choice = items[2]
    assert choice.logprobs is not None and choice.model_extra["token_ids"]
    if method == "json_schema":
        assert json.loads(choice.message.content) == arguments
    else:
        assert json.loads(choice.message.tool_calls[0].function.arguments) == arguments


# -- a graph of two agents ----------------------------------------------------------------


class Plan(TypedDict):
    task: str
    plan: str
    summary: str


def two_agent_graph(s: LLMServer) -> Any:
    chat = model(s)

    @at.trainable(name="planner")
    def planner(state: Plan) -> dict[str, str]:
        reply = chat.invoke(
            [SystemMessage("You plan."), HumanMessage(state["task"])],
        )
        return {"plan": str(reply.content)}

    def summariser(state: Plan) -> dict[str, str]:
        reply = chat.invoke(
            [SystemMessage("You summarise."), HumanMessage(f"Summarise: {state['plan']}")]
        )
        return {"summary": str(reply.content)}

    graph = StateGraph(Plan)
    graph.add_node("planner", planner)
    graph.add_node("summariser", summariser)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "summariser")
    graph.add_edge("summariser", END)
    return graph.compile()


@pytest.mark.parametrize("entry", ["invoke", "ainvoke"])
def test_only_the_trainable_node_gives_policy_turns(instrumented, llm_server, entry):
    s = llm_server(["1. think 2. act", "think, then act"])
    graph = two_agent_graph(s)

    with at.trajectory("ex") as t:
        inputs = {"task": "make a plan"}
        out = graph.invoke(inputs) if entry == "invoke" else asyncio.run(graph.ainvoke(inputs))
        t.reward = 1.0
    assert out["summary"] == "think, then act"
    assert [(c.step, c.trainable, c.agent, c.framework) for c in t.calls] == [
        ("planner", True, "planner", "langchain"),
        ("summariser", False, None, "langchain"),
    ]
    result = t.to_art()
    assert kinds(result.messages_and_choices) == ["system", "user", "Choice"]
    assert result.messages_and_choices[2].message.content == "1. think 2. act"
    (summary,) = result.additional_histories
    assert summary.messages_and_choices == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "Summarise: 1. think 2. act"},
        {"role": "assistant", "content": "think, then act"},
    ]


def test_react_agent_as_a_subgraph_node_names_its_calls_by_path(instrumented, llm_server):
    s = llm_server()
    outer = StateGraph(MessagesState)
    outer.add_node("research", react_agent(s))
    outer.add_edge(START, "research")
    outer.add_edge("research", END)
    app = outer.compile()

    @at.trainable
    def solve(k: int) -> Any:
        return app.invoke({"messages": [("user", f"agent {k}")]})

    with at.trajectory("ex") as t:
        solve(8)
        t.reward = 1.0
    assert [c.step for c in t.calls] == ["research/agent"] * 3
    assert t.trainable_turns == 3


# -- the handler on its own ---------------------------------------------------------------


def test_explicit_handler_without_instrument_keeps_logprobs_and_warns_once(llm_server):
    _warnings.reset()
    assert not at.is_instrumented()
    s = llm_server()
    agent = create_react_agent(
        model(s, "policy-explicit", logprobs=True), [add, mul], prompt="You compute."
    )
    handler = ArttraceCallbackHandler()

    @at.trainable
    def solve(k: int) -> Any:
        return agent.invoke({"messages": [("user", f"agent {k}")]}, {"callbacks": [handler]})

    with warnings.catch_warnings(record=True) as caught, at.trajectory("ex") as t:
        warnings.simplefilter("always")
        solve(4)
        t.reward = 1.0
    untrainable = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(untrainable) == 1
    message = str(untrainable[0].message)
    assert "no token ids" in message and "arttrace.instrument()" in message

    assert len(t.calls) == 3
    for call, request in zip(t.calls, s.llm.requests, strict=True):
        assert call.source == "langchain" and call.trainable and call.step == "agent"
        # What LangChain sent, in OpenAI form: tool calls with their ids, tool results with
        # tool_call_id, assistant tool-call turns with content None.
        assert call.messages == request["messages"]
        assert call.tools == request["tools"] == TOOL_SCHEMAS
        assert call.response_id is not None and call.prompt_token_ids is None
        (choice,) = call.choices
        assert choice.logprobs is not None
        assert len(choice.logprobs) == len(choice.token_ids or ()) > 0
        assert call.untrainable_reason(choice) == "no token ids"
    items = t.to_art().messages_and_choices
    assert kinds(items) == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert items[2]["tool_calls"][0]["id"] == items[3]["tool_call_id"]
    assert items[2]["tool_calls"][1]["id"] == items[4]["tool_call_id"]
    assert items[5]["tool_calls"][0]["id"] == items[6]["tool_call_id"]
    assert t.trainable_turns == 0


def test_handler_records_messages_as_chatopenai_sends_them(llm_server):
    s = llm_server(["Seen."])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages: list[BaseMessage] = [
        SystemMessage("You look at pictures."),
        HumanMessage([{"type": "text", "text": "What is"}, {"type": "text", "text": " this?"}]),
        HumanMessage([{"type": "text", "text": "And this?"}, image]),
        AIMessage(
            "",
            tool_calls=[
                {"name": "add", "args": {"a": 1, "b": 2}, "id": "call_a", "type": "tool_call"}
            ],
        ),
        ToolMessage("3", tool_call_id="call_a", name="add"),
        AIMessage("It is 3, and a cat.", name="looker"),
        HumanMessage("Thanks."),
    ]
    with at.trajectory("ex") as t:
        model(s).bind_tools([add]).invoke(messages, {"callbacks": [ArttraceCallbackHandler()]})
    (call,) = t.calls
    assert call.messages == s.llm.requests[0]["messages"]
    assert call.messages[1]["content"][1] == {"type": "text", "text": " this?"}
    assert call.messages[3]["content"] is None
    assert call.messages[4] == {"role": "tool", "tool_call_id": "call_a", "content": "3"}
    assert call.choices[0].message == {"role": "assistant", "content": "Seen."}


def test_headers_in_model_kwargs_are_never_recorded(llm_server):
    """extra_headers given through model_kwargs reach the server but never the record, which
    the journal and saved trajectories are written from."""
    secret = "sk-journal-must-never-hold-this"
    s = llm_server(["Hi."])
    chat = model(
        s,
        temperature=0.5,
        model_kwargs={"extra_headers": {"Authorization": f"Bearer {secret}", "X-Trace": "t-1"}},
    )
    with at.trajectory("headers") as t:
        chat.invoke("Hello", {"callbacks": [ArttraceCallbackHandler()]})
        t.reward = 1.0
    (call,) = t.calls
    assert call.source == "langchain" and call.params["temperature"] == 0.5
    assert "extra_headers" not in call.params
    assert secret not in json.dumps(call.to_dict())
    assert secret not in t.to_art().model_dump_json()


def test_a_failure_inside_the_handler_never_reaches_the_caller(llm_server, monkeypatch):
    """Fault injection into arttrace's own code: a callback that fails is logged and swallowed;
    the call it was recording is kept, marked."""

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(lc, "_choice", broken)
    s = llm_server(["Hi."])
    with at.trajectory("fault") as t:
        answer = model(s).invoke("Hello", {"callbacks": [ArttraceCallbackHandler()]})
    assert answer.content == "Hi."
    (call,) = t.calls
    assert call.source == "langchain" and "injected" in (call.capture_error or "")


async def test_explicit_handler_with_wrapped_clients_is_trainable_without_a_global_patch(
    llm_server,
):
    s = llm_server(["sync answer", "async answer"])
    chat = model(s)
    at.wrap_openai(chat.root_client)
    at.wrap_openai(chat.root_async_client)
    config = {"callbacks": [ArttraceCallbackHandler()]}

    @at.trainable
    async def ask() -> None:
        await asyncio.to_thread(chat.invoke, "sync question", config)
        await chat.ainvoke("async question", config)

    with warnings.catch_warnings(record=True) as caught, at.trajectory("ex") as t:
        warnings.simplefilter("always")
        await ask()
        t.reward = 1.0
    assert not [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert [(c.source, c.framework, c.trainable) for c in t.calls] == [
        ("openai", "langchain", True)
    ] * 2
    assert t.trainable_turns == 2


def test_explicit_handler_under_instrument_is_not_doubled(instrumented, llm_server):
    s = llm_server()
    agent = react_agent(s)

    @at.trainable
    def solve(k: int) -> Any:
        config = {"callbacks": [ArttraceCallbackHandler()]}
        return agent.invoke({"messages": [("user", f"agent {k}")]}, config)

    with at.trajectory("ex") as t:
        solve(2)
        t.reward = 1.0
    assert_react_run(t, 2)


def test_install_is_idempotent_and_uninstall_makes_the_handler_inert(llm_server):
    s = llm_server()
    agent = react_agent(s)
    at.instrument()
    at.instrument()
    lc.install()
    at.uninstrument()
    at.uninstrument()
    assert sum(1 for var, *_ in _configure_hooks if var is lc._handler_var) == 1

    @at.trainable
    def solve(k: int) -> Any:
        return agent.invoke({"messages": [("user", f"agent {k}")]})

    _warnings.reset()  # once per process: this test asserts it
    with (
        pytest.warns(at.NothingToTrainWarning, match=r"instrument\(\) was not called"),
        at.trajectory("ex") as t,
    ):
        solve(1)
    assert len(s.llm.requests) == 3 and t.calls == []


def test_failed_call_is_kept_once_with_its_error(instrumented, llm_server):
    s = llm_server([])  # no reply: the server answers 500
    chat = model(s)

    @at.trainable
    def ask() -> None:
        chat.invoke("hi")

    with pytest.raises(Exception, match="no reply left"), at.trajectory("ex") as t:
        ask()
    (call,) = t.calls
    assert call.framework == "langchain" and call.error and not call.choices


# -- spans --------------------------------------------------------------------------------


def test_spans_have_the_graph_shape(instrumented, llm_server, spans):
    exporter = spans
    s = llm_server()
    agent = react_agent(s)

    @at.trainable(name="solver")
    def solve(k: int) -> Any:
        return agent.invoke({"messages": [("user", f"agent {k}")]})

    with at.trajectory("ex"):
        solve(6)
    spans = [s for s in exporter.get_finished_spans() if s.attributes is not None]
    by_id = {s.context.span_id: s for s in spans}

    def parent(span: ReadableSpan) -> str:
        return by_id[span.parent.span_id].name if span.parent else ""

    steps = [s for s in spans if s.attributes.get("arttrace.framework") == "langchain"]
    assert sorted({s.name for s in steps}) == [
        "chat policy",
        "execute_tool add",
        "execute_tool mul",
        "invoke_agent LangGraph",
        "invoke_agent agent",
        "invoke_agent tools",
    ]
    named = {s.name: s for s in steps}
    assert parent(named["invoke_agent LangGraph"]) == "trainable solver"
    assert {parent(s) for s in steps if s.name == "invoke_agent agent"} == {
        "invoke_agent LangGraph"
    }
    assert {parent(s) for s in steps if s.name == "chat policy"} == {"invoke_agent agent"}
    assert {parent(s) for s in steps if s.name.startswith("execute_tool")} == {"invoke_agent tools"}
    tool_ids = [s.attributes["gen_ai.tool.call.id"] for s in steps if s.name == "execute_tool add"]
    assert len(tool_ids) == 1 and tool_ids[0].startswith("call_")
    assert sum(1 for s in steps if s.name == "chat policy") == 3
    assert named["invoke_agent agent"].attributes["arttrace.langgraph.node"] == "agent"


def test_a_failing_tool_fails_its_span_and_an_interrupt_fails_nothing(
    instrumented, llm_server, spans
):
    exporter = spans

    @tool
    def broken(a: float, b: float) -> float:
        """Always fails."""
        raise ValueError("broken tool")

    s = llm_server([Reply(tool_calls=[ToolCall("broken", {"a": 1, "b": 2})]), Reply("gave up")])
    agent = create_react_agent(model(s), ToolNode([broken], handle_tool_errors=True))

    class Question(TypedDict):
        answer: str

    def ask_human(state: Question) -> dict[str, str]:
        return {"answer": interrupt("need input")}

    graph = StateGraph(Question)
    graph.add_node("ask_human", ask_human)
    graph.add_edge(START, "ask_human")
    graph.add_edge("ask_human", END)
    app = graph.compile(checkpointer=InMemorySaver())

    with at.trajectory("ex") as t:
        out = agent.invoke({"messages": [("user", "try it")]})
        paused = app.invoke({"answer": ""}, {"configurable": {"thread_id": "1"}})
    assert "broken tool" in str(out["messages"][2].content)  # ToolNode reports it to the model
    assert "__interrupt__" in paused
    assert len(t.calls) == 2
    spans = {s.name: s for s in exporter.get_finished_spans()}
    failed = spans["execute_tool broken"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"
    assert spans["invoke_agent ask_human"].status.status_code is StatusCode.UNSET
    assert not spans["invoke_agent ask_human"].events
