"""The OpenAI shim captures exactly what the server sent, in every way the SDK can be called."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.resources.chat.completions import AsyncCompletions, Completions

import arttrace as at
from arttrace import ChoiceRecord, LLMCall
from arttrace.capture import _warnings
from arttrace.testing import Reply, ScriptedLLM, ToolCall
from support.common import TOOLS

PARALLEL = Reply(
    "Let me add both.",
    tool_calls=[ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})],
)


def expected_choices(completion: Any) -> list[dict[str, Any]]:
    """What the SDK returned, per choice, in the form arttrace records it."""
    out = []
    for choice in completion.choices:
        message = {"role": "assistant", "content": choice.message.content}
        if choice.message.tool_calls:
            message["tool_calls"] = [tc.model_dump() for tc in choice.message.tool_calls]
        out.append(
            {
                "index": choice.index,
                "message": message,
                "finish_reason": choice.finish_reason,
                "logprobs": [t.logprob for t in choice.logprobs.content],
                "token_ids": choice.model_extra["token_ids"],
            }
        )
    return out


def recorded(choice: ChoiceRecord) -> dict[str, Any]:
    return {
        "index": choice.index,
        "message": choice.message,
        "finish_reason": choice.finish_reason,
        "logprobs": choice.logprobs.tolist() if choice.logprobs is not None else None,
        "token_ids": choice.token_ids.tolist() if choice.token_ids is not None else None,
    }


def policy(client: openai.OpenAI, **kwargs: Any) -> Any:
    @at.trainable
    def agent() -> Any:
        return client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "add 1+2 and 3+4"}], **kwargs
        )

    return agent()


@pytest.mark.parametrize(
    "reply", [Reply("The sum is 3."), PARALLEL], ids=["text", "parallel-tools"]
)
def test_non_streaming_call_is_captured_exactly(instrumented, clients, reply):
    client, _ = clients(ScriptedLLM([reply]))
    with at.trajectory("ex") as t:
        completion = policy(client, tools=TOOLS, temperature=0.7)
    (call,) = t.calls
    assert call.messages == [{"role": "user", "content": "add 1+2 and 3+4"}]
    assert call.tools == TOOLS
    assert call.params["temperature"] == 0.7
    assert call.trainable and call.agent.endswith("agent") and not call.partial
    assert call.prompt_token_ids.tolist() == completion.model_extra["prompt_token_ids"]
    assert [recorded(c) for c in call.choices] == expected_choices(completion)
    assert call.usage["completion_tokens"] == len(call.choices[0].token_ids)
    if reply.tool_calls:
        names = [tc["function"]["name"] for tc in call.choices[0].message["tool_calls"]]
        assert names == ["add", "add"] and call.choices[0].finish_reason == "tool_calls"


def test_n_greater_than_one_keeps_every_choice(instrumented, clients):
    client, _ = clients(ScriptedLLM([[Reply("one"), Reply("two"), Reply("three")]]))
    with at.trajectory("ex") as t:
        completion = policy(client, n=3)
    (call,) = t.calls
    assert [recorded(c) for c in call.choices] == expected_choices(completion)
    assert [c.message["content"] for c in call.choices] == ["one", "two", "three"]
    t.reward = 1.0
    art_t = t.to_art()
    histories = [art_t.messages_and_choices] + [
        h.messages_and_choices for h in art_t.additional_histories
    ]
    assert [h[-1].message.content for h in histories] == ["one", "two", "three"]


def _stream_arms(clients, reply: Reply, *, use_async: bool, include_usage: bool):
    """Run the same streamed request against twin servers, without and with arttrace."""
    kwargs: dict[str, Any] = {
        "model": "policy",
        "messages": [{"role": "user", "content": "go"}],
        "tools": TOOLS,
        "stream": True,
        "logprobs": True,
        "extra_body": {"return_token_ids": True},
    }
    if include_usage:
        kwargs["stream_options"] = {"include_usage": True}
    results = []
    for instrumented_arm in (False, True):
        sync_client, async_client = clients(ScriptedLLM([reply]))
        if instrumented_arm:
            at.instrument()

        @at.trainable
        async def run_async() -> list[Any]:
            async with async_client:  # closed inside the loop that opened its connections
                stream = await async_client.chat.completions.create(**kwargs)
                return [chunk async for chunk in stream]

        @at.trainable
        def run_sync() -> list[Any]:
            with sync_client.chat.completions.create(**kwargs) as stream:
                return list(stream)

        _warnings.reset()  # once per process: the plain arm asserts it
        told = (
            contextlib.nullcontext()
            if instrumented_arm
            else pytest.warns(at.NothingToTrainWarning, match=r"instrument\(\) was not called")
        )
        with told, at.trajectory("ex") as t:
            chunks = asyncio.run(run_async()) if use_async else run_sync()
        at.uninstrument()
        results.append((chunks, t))
    return results


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "reply", [Reply("Streaming is fun."), PARALLEL], ids=["text", "parallel-tools"]
)
def test_stream_passes_through_untouched_and_is_reassembled(clients, reply, use_async):
    (plain, _), (chunks, t) = _stream_arms(clients, reply, use_async=use_async, include_usage=True)

    def dump(chunk: Any) -> dict[str, Any]:
        return chunk.model_dump(exclude={"created"})

    assert [dump(c) for c in chunks] == [dump(c) for c in plain]
    (call,) = t.calls
    assert call.streamed and not call.partial and call.error is None
    # Rebuild from the chunks the caller saw, independently of arttrace.
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    logprobs = [
        lp.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for lp in c.choices[0].logprobs.content
    ]
    token_ids = [
        i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids") or []
    ]
    (choice,) = call.choices
    assert (choice.message["content"] or "") == content == (reply.content or "")
    assert choice.logprobs.tolist() == logprobs and choice.token_ids.tolist() == token_ids
    assert len(token_ids) == call.usage["completion_tokens"]
    assert call.prompt_token_ids.tolist() == chunks[0].model_extra["prompt_token_ids"]
    expected_calls = [
        {"name": tc.name, "arguments": json.dumps(tc.arguments)} for tc in reply.tool_calls
    ]
    assert [tc["function"] for tc in choice.message.get("tool_calls", [])] == expected_calls
    assert all(tc["id"] for tc in choice.message.get("tool_calls", []))
    assert choice.finish_reason == ("tool_calls" if reply.tool_calls else "stop")


def test_stream_and_whole_response_record_the_same_call(instrumented, clients):
    records = []
    for stream in (False, True):
        client, _ = clients(ScriptedLLM([PARALLEL]))
        with at.trajectory("ex") as t:
            result = policy(client, tools=TOOLS, stream=stream)
            if stream:
                list(result)
        records.append(t.calls[0])
    whole, streamed = records
    assert [recorded(c) for c in streamed.choices] == [recorded(c) for c in whole.choices]
    assert streamed.prompt_token_ids == whole.prompt_token_ids


@pytest.mark.parametrize("stream", [False, True])
def test_with_raw_response_sync(instrumented, clients, stream):
    client, _ = clients(ScriptedLLM([Reply("raw!")]))

    @at.trainable
    def agent() -> Any:
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], stream=stream
        )
        assert raw.headers["content-type"].startswith(
            "text/event-stream" if stream else "application/json"
        )
        parsed = raw.parse()
        return list(parsed) if stream else parsed

    with at.trajectory("ex") as t:
        result = agent()
    (call,) = t.calls
    assert call.choices[0].message["content"] == "raw!"
    assert call.choices[0].token_ids is not None and call.prompt_token_ids is not None
    if not stream:
        assert [recorded(c) for c in call.choices] == expected_choices(result)


@pytest.mark.parametrize("stream", [False, True])
async def test_with_raw_response_async(instrumented, clients, stream):
    _, client = clients(ScriptedLLM([Reply("raw async")]))

    @at.trainable
    async def agent() -> Any:
        raw = await client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": "hi"}], stream=stream
        )
        parsed = raw.parse()
        return [c async for c in parsed] if stream else parsed

    async with client, at.trajectory("ex") as t:
        await agent()
    (call,) = t.calls
    assert call.choices[0].message["content"] == "raw async" and not call.partial
    assert len(call.choices[0].token_ids) == len(call.choices[0].logprobs) > 0


class Answer(pydantic.BaseModel):
    value: int


@pytest.mark.parametrize("how", ["parse", "raw parse", "async parse", "stream helper"])
async def test_structured_output_helpers_are_captured(instrumented, clients, how):
    """``parse`` posts on its own (not through ``create``); ``stream()`` goes through it."""
    sync_client, async_client = clients(ScriptedLLM([Reply('{"value": 3}')]))
    kwargs: dict[str, Any] = {
        "model": "policy",
        "messages": [{"role": "user", "content": "1+2?"}],
        "response_format": Answer,
    }

    @at.trainable
    async def agent() -> Answer | None:
        completions = sync_client.chat.completions
        if how == "parse":
            return completions.parse(**kwargs).choices[0].message.parsed
        if how == "raw parse":
            return completions.with_raw_response.parse(**kwargs).parse().choices[0].message.parsed
        if how == "async parse":
            parsed = await async_client.chat.completions.parse(**kwargs)
            return parsed.choices[0].message.parsed
        with completions.stream(**kwargs) as stream:
            for _ in stream:
                pass
            return stream.get_final_completion().choices[0].message.parsed

    async with at.trajectory("ex") as t:
        answer = await agent()
    assert answer == Answer(value=3)  # the caller's parsed result is untouched
    (call,) = t.calls
    assert call.choices[0].message["content"] == '{"value": 3}'
    assert call.trainable and call.prompt_token_ids is not None
    assert len(call.choices[0].token_ids) == len(call.choices[0].logprobs) > 0


def test_training_fields_requested_only_for_policy_calls(instrumented, clients):
    llm = ScriptedLLM([Reply("a"), Reply("b"), Reply("c")])
    client, _ = clients(llm)
    with at.trajectory("ex"):
        policy(client, temperature=0.3, top_p=0.9, extra_body={"top_k": 5})
        with pytest.warns(at.UntrainableTurnWarning, match="no logprobs"):
            policy(client, logprobs=False)
        client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "x"}])
    first, second, judge = llm.requests
    assert first["logprobs"] is True and first["return_token_ids"] is True
    assert (first["temperature"], first["top_p"], first["top_k"]) == (0.3, 0.9, 5)
    assert second["logprobs"] is False  # the caller's explicit choice stands
    assert "logprobs" not in judge and "return_token_ids" not in judge


def test_training_fields_can_be_left_alone(clients):
    llm = ScriptedLLM([Reply("a")])
    client, _ = clients(llm)
    at.instrument(request_training_data=False)
    try:
        with pytest.warns(at.UntrainableTurnWarning), at.trajectory("ex"):
            policy(client)
    finally:
        at.uninstrument()
    assert "logprobs" not in llm.requests[0] and "return_token_ids" not in llm.requests[0]


def test_wrap_openai_instruments_one_client_and_never_twice(clients):
    wrapped, _ = clients(ScriptedLLM([Reply("w1"), Reply("w2")]))
    other, _ = clients(ScriptedLLM([Reply("o1")]))
    assert at.wrap_openai(wrapped) is wrapped
    assert not at.is_instrumented()
    with at.trajectory("ex") as t:
        policy(wrapped)
        policy(other)
        at.instrument()  # global patch on top of the wrapped client: still one record per call
        try:
            policy(wrapped)
        finally:
            at.uninstrument()
    assert [c.choices[0].message["content"] for c in t.calls] == ["w1", "w2"]


def test_instrument_is_idempotent_and_reversible():
    original_sync, original_async = Completions.create, AsyncCompletions.create
    at.instrument()
    at.instrument()
    assert Completions.create is not original_sync
    assert Completions.create.__wrapped__ is original_sync
    at.uninstrument()
    at.uninstrument()
    assert Completions.create is original_sync and AsyncCompletions.create is original_async


def test_calls_outside_a_trajectory_are_not_recorded(instrumented, clients):
    client, _ = clients(ScriptedLLM([Reply("free")]))
    assert policy(client).choices[0].message.content == "free"


async def test_respx_at_the_httpx_layer(instrumented, respx_mock):
    llm = ScriptedLLM([Reply("via respx")])
    respx_mock.post("http://llm.test/v1/chat/completions").mock(side_effect=llm.handle)
    client = openai.AsyncOpenAI(base_url="http://llm.test/v1", api_key="k", max_retries=0)

    @at.trainable(name="solver")
    async def solve() -> str:
        r = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "q"}]
        )
        return r.choices[0].message.content or ""

    async with at.trajectory(7, metadata={"split": "train"}) as t:
        assert await solve() == "via respx"
    (call,) = t.calls
    assert call.agent == "solver" and call.trainable
    assert t.example_id == "7" and t.metadata == {"split": "train"}


def test_in_process_transport():
    llm = ScriptedLLM([Reply("in process")])
    client = at.wrap_openai(
        openai.OpenAI(
            base_url="http://scripted/v1",
            api_key="k",
            http_client=httpx.Client(transport=llm.transport()),
        )
    )
    with at.trajectory("ex") as t:
        policy(client)
    assert isinstance(t.calls[0], LLMCall) and t.trainable_turns == 1


@pytest.mark.parametrize("stream", [False, True])
def test_top_logprobs_are_kept_when_asked_for(instrumented, clients, stream):
    client, _ = clients(ScriptedLLM([Reply("three tokens here")]))
    with at.trajectory("ex") as t:
        result = policy(client, top_logprobs=2, stream=stream)
        chunks = list(result) if stream else None
    (choice,) = t.calls[0].choices
    if chunks is None:
        seen = [[a.logprob for a in lp.top_logprobs] for lp in result.choices[0].logprobs.content]
    else:
        seen = [
            [a.logprob for a in lp.top_logprobs]
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for lp in c.choices[0].logprobs.content
        ]
    assert [[a["logprob"] for a in alts] for alts in choice.top_logprobs] == seen
    assert len(seen) == len(choice.token_ids) and all(len(alts) == 2 for alts in seen)
    t.reward = 1.0
    (converted,) = [i for i in t.to_art().messages_and_choices if not isinstance(i, dict)]
    assert [len(lp.top_logprobs) for lp in converted.logprobs.content] == [2] * len(seen)


def test_messages_given_as_an_iterator_still_reach_the_server(instrumented, clients):
    llm = ScriptedLLM([Reply("ok")])
    client, _ = clients(llm)
    messages = iter([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with at.trajectory("ex") as t:
        at.trainable(client.chat.completions.create)(model="policy", messages=messages)
    assert [m["role"] for m in llm.requests[0]["messages"]] == ["system", "user"]
    assert [m["role"] for m in t.calls[0].messages] == ["system", "user"]
