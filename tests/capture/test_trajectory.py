"""Trajectories: scoping, isolation, assembly into conversations, ART form, bad input."""

from __future__ import annotations

import asyncio
import math
import threading
import warnings
from typing import Any

import art
import httpx
import openai
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall
from support.common import TOOLS


def ask(
    client: openai.OpenAI, messages: list[dict[str, Any]], model: str = "policy", **kw: Any
) -> Any:
    return client.chat.completions.create(model=model, messages=messages, **kw).choices[0].message


# -- conversations ------------------------------------------------------------------------


def test_tool_loop_is_one_conversation_and_side_calls_are_additional_histories(
    instrumented, clients
):
    llm = ScriptedLLM(
        [
            Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]),
            Reply("It is 3."),
            Reply("Summary: 3"),
        ]
    )
    client, _ = clients(llm)

    @at.trainable
    def agent(question: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": question},
        ]
        first = ask(client, messages, tools=TOOLS)
        messages.append(first)  # the SDK object, as many agents do
        messages.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "3"})
        return ask(client, messages, tools=TOOLS).content or ""

    with at.trajectory("q-1") as t:
        answer = agent("What is 1+2?")
        ask(client, [{"role": "user", "content": f"Summarise: {answer}"}], model="summariser")
        t.reward = 1.0
        t.metrics["turns"] = 2

    result = t.to_art()
    assert isinstance(result, art.Trajectory)
    items = result.messages_and_choices
    assert [type(i).__name__ if isinstance(i, Choice) else i["role"] for i in items] == [
        "system",
        "user",
        "Choice",
        "tool",
        "Choice",
    ]
    assert items[2].message.tool_calls[0].function.name == "add"
    assert items[4].message.content == "It is 3."
    assert all(i.logprobs is not None for i in items if isinstance(i, Choice))
    assert (
        items[4].model_extra["prompt_token_ids"][: len(items[2].model_extra["prompt_token_ids"])]
        == (items[2].model_extra["prompt_token_ids"])
    )
    assert result.tools == TOOLS
    (summary,) = result.additional_histories
    assert summary.messages_and_choices[-1] == {"role": "assistant", "content": "Summary: 3"}
    assert result.reward == 1.0 and result.metrics == {"turns": 2}
    assert result.metadata == {
        "continuity_boundaries": 1,
        "continuity_breaks": 0,
        "continuity_breaks_template": 0,
        "continuity_breaks_retokenized": 0,
        "continuity_breaks_other": 0,
        "continuity_breaks_guessed": 0,
        "continuity_edits_system": 0,
        "continuity_edits_user": 0,
        "continuity_edits_assistant": 0,
        "continuity_edits_tool": 0,
        "continuity_edits_trimmed": 0,
        "continuity_unknown_turns": 0,
        "continuity_conversations": 1,
        "art_sequences": 1,
        "example_id": "q-1",
    }
    assert t.trainable_turns == 2


def test_model_filter_and_nesting(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("p1"), Reply("judge says yes"), Reply("p2")]))

    @at.trainable(name="inner")
    def inner() -> None:
        ask(client, [{"role": "user", "content": "inner"}])

    @at.trainable(name="outer", model="policy")
    def outer() -> None:
        ask(client, [{"role": "user", "content": "outer"}])
        ask(client, [{"role": "user", "content": "judge this"}], model="judge")
        inner()

    with at.trajectory("ex") as t:
        outer()
    assert [(c.model, c.trainable, c.agent) for c in t.calls] == [
        ("policy", True, "outer"),
        ("judge", False, None),
        ("policy", True, "inner"),
    ]


def test_calls_outside_trainable_are_context_only(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("plain")]))
    with at.trajectory("ex") as t:
        ask(client, [{"role": "user", "content": "hi"}])
        t.reward = 0.5
    assert t.calls[0].trainable is False and t.trainable_turns == 0
    assert t.to_art().messages_and_choices[-1] == {"role": "assistant", "content": "plain"}


def test_generators_are_trainable_only_while_they_run(instrumented, clients):
    client, _ = clients(
        ScriptedLLM([Reply("g1"), Reply("between"), Reply("g2"), Reply("a1"), Reply("a2")])
    )

    @at.trainable
    def steps():
        yield ask(client, [{"role": "user", "content": "1"}])
        yield ask(client, [{"role": "user", "content": "2"}])

    @at.trainable
    async def async_steps():
        for n in ("3", "4"):
            yield ask(client, [{"role": "user", "content": n}])

    async def consume() -> list[Any]:
        return [m async for m in async_steps()]

    with at.trajectory("ex") as t:
        gen = steps()
        next(gen)
        ask(client, [{"role": "user", "content": "between yields"}])
        next(gen)
        assert next(gen, None) is None
        asyncio.run(consume())
    assert [c.trainable for c in t.calls] == [True, False, True, True, True]


# -- scoping and isolation ---------------------------------------------------------------


def test_exception_is_recorded_and_reraised(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("before the crash")]))
    with pytest.raises(KeyError, match="boom"), at.trajectory("ex") as t:
        ask(client, [{"role": "user", "content": "x"}])
        raise KeyError("boom")
    assert t.exception["type"] == "KeyError" and "boom" in t.exception["traceback"]
    assert len(t.calls) == 1
    t.reward = 0.0
    assert "KeyError" in t.to_art().logs[0]


def test_current_trajectory(instrumented):
    with pytest.raises(RuntimeError, match="no trajectory is active"):
        at.current_trajectory()
    with at.trajectory("outer") as outer:
        at.current_trajectory().reward = 2
        with at.trajectory("inner") as inner:
            assert at.current_trajectory() is inner
        assert at.current_trajectory() is outer
    assert outer.reward == 2.0


async def test_thousand_concurrent_rollouts_stay_separate(instrumented):
    def reply(request: dict[str, Any]) -> Reply:
        return Reply("answer to " + request["messages"][-1]["content"])

    llm = ScriptedLLM(reply)
    client = openai.AsyncOpenAI(
        base_url="http://scripted/v1",
        api_key="k",
        http_client=httpx.AsyncClient(transport=llm.transport()),
    )

    @at.trainable
    async def agent(i: int) -> None:
        for turn in range(2):
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"rollout {i} turn {turn}"}]
            )
            await asyncio.sleep(0)

    async def rollout(i: int) -> at.Trajectory:
        async with at.trajectory(f"ex-{i}") as t:
            await agent(i)
        return t

    trajectories = await asyncio.gather(*(rollout(i) for i in range(1000)))
    for i, t in enumerate(trajectories):
        assert [c.messages[0]["content"] for c in t.calls] == [
            f"rollout {i} turn 0",
            f"rollout {i} turn 1",
        ]
        assert [c.choices[0].message["content"] for c in t.calls] == [
            f"answer to rollout {i} turn 0",
            f"answer to rollout {i} turn 1",
        ]


def test_threads_stay_separate(instrumented, clients):
    client, _ = clients(ScriptedLLM(lambda r: Reply("re: " + r["messages"][-1]["content"])))
    results: dict[int, at.Trajectory] = {}

    @at.trainable
    def agent(i: int) -> None:
        for turn in range(5):
            messages = [{"role": "user", "content": f"thread {i} turn {turn}"}]
            if turn % 2:
                list(client.chat.completions.create(model="policy", messages=messages, stream=True))
            else:
                ask(client, messages)

    def worker(i: int) -> None:
        with at.trajectory(f"t{i}") as t:
            agent(i)
        results[i] = t

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results) == list(range(8))
    for i, t in results.items():
        assert {c.messages[0]["content"].split()[1] for c in t.calls} == {str(i)}
        assert len(t.calls) == 5


# -- bad input ---------------------------------------------------------------------------


def test_server_without_logprobs_warns_once_and_keeps_the_turn(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("one"), Reply("two")], logprobs=False, token_ids=False))

    @at.trainable
    def agent() -> None:
        messages: list[Any] = [{"role": "user", "content": "q"}]
        messages.append(ask(client, messages, model="Qwen/Qwen2.5-7B-Instruct"))
        messages.append({"role": "user", "content": "again"})
        ask(client, messages, model="Qwen/Qwen2.5-7B-Instruct")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            agent()
    relevant = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(relevant) == 1
    text = str(relevant[0].message)
    assert "Qwen/Qwen2.5-7B-Instruct" in text and "logprobs=True" in text
    assert "vLLM >= 0.10.2" in text  # the server that returns them with the token ids
    assert relevant[0].filename == __file__
    t.reward = 1.0
    items = t.to_art().messages_and_choices
    assert [i["role"] for i in items] == ["user", "assistant", "user", "assistant"]
    assert items[-1]["content"] == "two"


def test_logprobs_without_token_ids_are_not_shipped_as_trainable(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("x")], token_ids=False, tokens_as_ids=False))
    with pytest.warns(at.UntrainableTurnWarning, match="no token ids"), at.trajectory("ex") as t:
        at.trainable(ask)(client, [{"role": "user", "content": "q"}])
    (choice,) = t.calls[0].choices
    assert choice.logprobs is not None and choice.tokens == ["x", "<|im_end|>"]
    assert t.trainable_turns == 0


def test_an_aborted_generation_is_context_and_still_converts(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("half an ans", finish_reason="abort")]))
    with pytest.warns(at.UntrainableTurnWarning, match="aborted"), at.trajectory("ex") as t:
        at.trainable(ask)(client, [{"role": "user", "content": "q"}])
    t.reward = 0.0
    assert t.to_art().messages_and_choices[-1] == {
        "role": "assistant",
        "content": "half an ans",
    }


@pytest.mark.parametrize("use_async", [False, True])
def test_cut_stream_raises_the_sdk_error_and_marks_the_call(instrumented, clients, use_async):
    def run(client_pair: Any) -> type[BaseException]:
        sync_client, async_client = client_pair
        kwargs = {"model": "policy", "messages": [{"role": "user", "content": "q"}], "stream": True}

        async def consume_async() -> None:
            async for _ in await async_client.chat.completions.create(**kwargs):
                pass

        try:
            if use_async:
                asyncio.run(consume_async())
            else:
                for _ in sync_client.chat.completions.create(**kwargs):
                    pass
        except Exception as error:
            return type(error)
        raise AssertionError("the cut stream did not fail")

    at.uninstrument()
    plain_error = run(
        clients(ScriptedLLM([Reply("a long answer that is cut")], cut_stream_after=4))
    )
    at.instrument()
    with at.trajectory("ex") as t:
        error = at.trainable(run)(
            clients(ScriptedLLM([Reply("a long answer that is cut")], cut_stream_after=4))
        )
    assert error is plain_error and issubclass(error, httpx.RemoteProtocolError)
    (call,) = t.calls
    assert call.partial and "RemoteProtocolError" in call.error
    assert call.choices[0].message["content"] == "a long"  # what arrived before the cut
    assert t.trainable_turns == 0


def test_abandoned_stream_is_marked_partial_when_the_trajectory_ends(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("never read to the end")]))
    with at.trajectory("ex") as t:
        stream = at.trainable(client.chat.completions.create)(
            model="policy", messages=[{"role": "user", "content": "q"}], stream=True
        )
        next(iter(stream))
    (call,) = t.calls
    assert call.partial and "trajectory ended" in call.error


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", None, True, [1.0]])
def test_bad_reward_is_refused_at_assignment(bad):
    t = at.trajectory("ex")
    with pytest.raises(ValueError, match="reward must be a finite number"):
        t.reward = bad
    assert t.reward is None


def test_missing_reward_and_bad_metadata_are_clear_errors():
    with pytest.raises(ValueError, match="no reward"):
        at.trajectory("ex").to_art()
    with pytest.raises(ValueError, match="metadata"):
        at.trajectory("ex", metadata={"nested": {"a": 1}})  # type: ignore[dict-item]


# -- saving ------------------------------------------------------------------------------


def test_save_and_load_keep_trainable_turns(instrumented, clients, tmp_path):
    client, _ = clients(
        ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 1})]), Reply("2")])
    )

    @at.trainable
    def agent() -> None:
        messages: list[Any] = [{"role": "user", "content": "1+1"}]
        messages.append(ask(client, messages, tools=TOOLS))
        messages.append(
            {"role": "tool", "tool_call_id": messages[-1].tool_calls[0].id, "content": "2"}
        )
        list(
            client.chat.completions.create(
                model="policy",
                messages=messages,
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    with at.trajectory("ex", metadata={"split": "val"}) as t:
        agent()
        t.reward = 0.25
    t.save(tmp_path / "t.json")
    loaded = at.Trajectory.load(tmp_path / "t.json")
    before, after = t.to_art(), loaded.to_art()
    assert after.model_dump() == before.model_dump()
    assert (
        sum(isinstance(i, Choice) and i.logprobs is not None for i in after.messages_and_choices)
        == 2
    )


# -- living next to ART's own capture ----------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_art_capture_scope_does_not_double_count(instrumented, clients, stream):
    client, _ = clients(ScriptedLLM([Reply("once")]))
    with art.Trajectory() as art_scope, at.trajectory("ex") as t:
        message = (
            at.trainable(ask)(client, [{"role": "user", "content": "q"}], stream=False)
            if not stream
            else None
        )
        if stream:
            chunks = list(
                at.trainable(client.chat.completions.create)(
                    model="policy", messages=[{"role": "user", "content": "q"}], stream=True
                )
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "once"
        else:
            assert message.content == "once"
    assert len(t.calls) == 1
    t.reward = 1.0
    converted = t.to_art()
    assert sum(isinstance(i, Choice) for i in converted.messages_and_choices) == 1
    assert converted.additional_histories == []
    assert len(art_scope.exchanges.chat_completions) == 1  # ART's own capture still works


def test_malformed_stream_raises_the_sdk_error_and_marks_the_call(respx_mock):
    good = ScriptedLLM([Reply("fine")])
    _, _, chunks = good.respond(
        {"model": "policy", "messages": [{"role": "user", "content": "q"}], "stream": True}
    )
    body = b"".join(list(chunks)[:2]) + b'data: {"id": "chatcmpl-1", "choices": [\n\n'
    respx_mock.post("http://bad.test/v1/chat/completions").mock(
        return_value=httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body
        )
    )
    client = openai.OpenAI(base_url="http://bad.test/v1", api_key="k", max_retries=0)

    def consume() -> type[BaseException]:
        try:
            for _ in client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "q"}], stream=True
            ):
                pass
        except Exception as error:
            return type(error)
        raise AssertionError("the malformed stream did not fail")

    plain = consume()
    at.instrument()
    try:
        with at.trajectory("ex") as t:
            captured = at.trainable(consume)()
    finally:
        at.uninstrument()
    assert captured is plain
    (call,) = t.calls
    assert call.partial and plain.__name__ in call.error
    assert call.choices[0].message["content"] == "fine"  # the token that arrived whole


# -- a trajectory that has ended is frozen ------------------------------------------------------


async def test_a_task_that_outlives_its_trajectory_adds_nothing_to_it(
    instrumented, clients, spans, caplog
):
    _, client = clients(ScriptedLLM(lambda request: Reply("late")))
    gate = asyncio.Event()

    async def later() -> None:
        await gate.wait()
        for _ in range(2):
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "q"}]
            )

    async with at.trajectory("ex-late") as t:
        task = asyncio.create_task(at.trainable(later)())
    gate.set()
    await task
    assert t.calls == [] and t.to_dict()["calls"] == []
    (dropped,) = [r for r in caplog.records if "had ended" in r.getMessage()]  # logged once
    assert "'ex-late'" in dropped.getMessage() and "await it" in dropped.getMessage()
    chat = [s for s in spans.get_finished_spans() if s.name == "chat policy"]
    assert len(chat) == 2  # their spans still end


async def test_a_call_in_flight_at_exit_stays_as_abandoned_when_its_response_arrives(
    instrumented, clients
):
    release = threading.Event()

    def slow(request: dict[str, Any]) -> Reply:
        release.wait(10)
        return Reply("arrived after the end")

    llm = ScriptedLLM(slow)
    _, client = clients(llm)
    async with at.trajectory("ex") as t:
        task = asyncio.create_task(
            at.trainable(client.chat.completions.create)(
                model="policy", messages=[{"role": "user", "content": "q"}]
            )
        )
        while not llm.requests:
            await asyncio.sleep(0.01)
    frozen = t.to_dict()
    release.set()
    reply = await task  # the fire-and-forget call itself still succeeds
    assert reply.choices[0].message.content == "arrived after the end"
    assert t.to_dict() == frozen
    (call,) = t.calls
    assert call.partial and call.choices == [] and "trajectory ended" in (call.error or "")
