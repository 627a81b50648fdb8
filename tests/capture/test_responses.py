"""The Responses API through the OpenAI SDK shim and off the wire (the gateway), against the
scripted server answering ``/v1/responses`` as vLLM does: every way the SDK calls it, exact
tokens when the server returns them, context with one warning when it does not, chains and
function calls as chat messages, and capture faults the caller never sees."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.capture import _guard, _openai, _responses, _warnings
from arttrace.capture._calls import OpenCall, Settings
from arttrace.capture._responses import ResponsesCall
from arttrace.gateway import Gateway
from arttrace.testing import LLMServer, Reply, ScriptedLLM, ToolCall, serve
from support.common import warnings_are_errors

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = Reply("Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])
ONLY_CALL = Reply(tool_calls=[ToolCall("get_weather", {"city": "Rome"})])
ASK = {
    "include": ["message.output_text.logprobs"],
    "extra_body": {"enable_response_messages": True},
}


class Answer(pydantic.BaseModel):
    value: int


@pytest.fixture
def started() -> Iterator[Callable[..., tuple[LLMServer, openai.OpenAI, openai.AsyncOpenAI]]]:
    servers: list[LLMServer] = []

    def start(
        *replies: Reply | str, **options: Any
    ) -> tuple[LLMServer, openai.OpenAI, openai.AsyncOpenAI]:
        server = serve(ScriptedLLM(list(replies), **options))
        servers.append(server)
        url = server.base_url
        return (
            server,
            openai.OpenAI(base_url=url, api_key="test", max_retries=0),
            openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0),
        )

    yield start
    for server in servers:
        server.stop()


def exact(response: dict[str, Any]) -> tuple[list[int], list[int], list[float]]:
    """What vLLM returned as the turn's exact tokens: prompt ids, sampled ids, logprobs."""
    logprobs = [
        entry["logprob"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        for entry in part["logprobs"] or ()
    ]
    return (
        response["input_messages"][0]["tokens"],
        response["output_messages"][0]["tokens"],
        logprobs,
    )


def tokens(call: at.LLMCall) -> tuple[list[int], list[int], list[float]]:
    (choice,) = call.choices
    assert call.prompt_token_ids is not None and choice.token_ids is not None
    assert choice.logprobs is not None
    return call.prompt_token_ids.tolist(), choice.token_ids.tolist(), choice.logprobs.tolist()


def as_sent(response: Any) -> dict[str, Any]:
    """The server's JSON as the SDK holds it (vLLM's extra fields included)."""
    return dict(response.model_dump(mode="json", warnings=False))


# -- every way the SDK calls it ---------------------------------------------------------------


def test_a_whole_response_is_recorded_with_the_servers_exact_tokens(instrumented, started):
    server, client, _ = started("Hello there.")

    @at.trainable
    def agent() -> Any:
        return client.responses.create(model="policy", input="Hi", instructions="Be brief.")

    with at.trajectory("q") as t:
        response = agent()
    (call,) = t.calls
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert call.choices[0].message == {"role": "assistant", "content": "Hello there."}
    assert call.choices[0].finish_reason == "stop"
    assert call.response_id == response.id and call.trainable and t.trainable_turns == 1
    assert tokens(call) == exact(as_sent(response))
    sent = server.responses.requests[0]  # asked for the logprobs and the raw token ids
    assert sent["include"] == ["message.output_text.logprobs"]
    assert sent["enable_response_messages"] is True
    assert "temperature" not in sent and "top_logprobs" not in sent  # sampling untouched


def test_the_caller_keeps_its_own_include_and_choice(instrumented, started):
    server, client, _ = started("a", "b")

    @at.trainable
    def agent() -> None:
        client.responses.create(model="policy", input="x", include=["reasoning.encrypted_content"])
        client.responses.create(
            model="policy", input="y", extra_body={"enable_response_messages": False}
        )

    with warnings.catch_warnings(record=True) as caught, at.trajectory("q") as t:
        warnings.simplefilter("always")
        agent()
    first, second = server.responses.requests
    assert first["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]
    assert second["enable_response_messages"] is False
    assert t.trainable_turns == 1  # the second turn has no ids: kept as context, warned
    assert [str(w.message).count("OpenAIChatCompletionsModel") for w in caught] == [1]


def test_async_and_streamed_calls_record_the_same_tokens(instrumented, started):
    replies = [CALL] * 6
    _server, client, aclient = started(*replies)
    ask: dict[str, Any] = {"model": "policy", "input": "Weather?", "tools": [WEATHER]}

    @at.trainable
    async def agent() -> list[Any]:
        out: list[Any] = [client.responses.create(**ask)]
        out.append(await aclient.responses.create(**ask))
        stream = client.responses.create(**ask, stream=True)
        out.append([e for e in stream][-1].response)
        astream = await aclient.responses.create(**ask, stream=True)
        out.append([e async for e in astream][-1].response)
        with client.responses.stream(**ask) as helper:
            for _ in helper:
                pass
            out.append(helper.get_final_response())
        async with aclient.responses.stream(**ask) as ahelper:
            async for _ in ahelper:
                pass
            out.append(await ahelper.get_final_response())
        return out

    with at.trajectory("q") as t:
        responses = asyncio.run(agent())
    assert len(t.calls) == 6 and t.trainable_turns == 6
    whole = exact(as_sent(responses[0]))
    for call, response in zip(t.calls, responses, strict=True):
        assert tokens(call) == exact(as_sent(response))
        assert tokens(call)[:2] == whole[:2]  # the same prompt and sampled ids every way
        assert call.choices[0].message == {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": response.output[-1].call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        }
        assert call.choices[0].finish_reason == "tool_calls"
    assert [c.streamed for c in t.calls] == [False, False, True, True, True, True]
    assert t.calls[0].tools == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]


def test_parse_raw_and_streaming_response_views(instrumented, started):
    _server, client, aclient = started('{"value": 3}', "raw", "streamed view", "async view")

    @at.trainable
    async def agent() -> list[Any]:
        parsed = client.responses.parse(model="policy", input="n?", text_format=Answer)
        raw = client.responses.with_raw_response.create(model="policy", input="r")
        with client.responses.with_streaming_response.create(
            model="policy", input="s", stream=True
        ) as view:
            events = list(view.parse())
        async with aclient.responses.with_streaming_response.create(
            model="policy", input="a"
        ) as aview:
            whole = await aview.parse()
        return [parsed, raw.parse(), events[-1].response, whole]

    with at.trajectory("q") as t:
        parsed, raw, streamed, whole = asyncio.run(agent())
    assert parsed.output_parsed == Answer(value=3)
    assert [c.choices[0].message["content"] for c in t.calls] == [
        '{"value": 3}',
        "raw",
        "streamed view",
        "async view",
    ]
    assert t.trainable_turns == 4
    for call, response in zip(t.calls, [parsed, raw, streamed, whole], strict=True):
        assert tokens(call) == exact(as_sent(response))


def test_a_cut_stream_keeps_what_arrived_as_context(instrumented, started):
    _server, client, _ = started("one two three four five", cut_stream_after=6)

    @at.trainable
    def agent() -> None:
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in client.responses.create(model="policy", input="x", stream=True):
                pass

    with at.trajectory("q") as t:
        agent()
    (call,) = t.calls
    assert call.partial and call.error and t.trainable_turns == 0
    assert call.choices[0].message["content"]  # the text that arrived
    assert "one two three four five".startswith(call.choices[0].message["content"])


# -- chains, function calls, reasoning -------------------------------------------------------


def test_a_previous_response_id_chain_is_recorded_as_one_conversation(instrumented, started):
    _server, client, _ = started("Hello.", CALL, "It is sunny in Paris.")

    @at.trainable
    def agent() -> None:
        first = client.responses.create(
            model="policy", input="Hi", instructions="Be brief.", tools=[WEATHER]
        )
        second = client.responses.create(
            model="policy",
            input="Weather in Paris?",
            tools=[WEATHER],
            previous_response_id=first.id,
            instructions="Be brief.",
        )
        call_id = second.output[-1].call_id
        client.responses.create(
            model="policy",
            input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny"}],
            tools=[WEATHER],
            previous_response_id=second.id,
            instructions="Be brief.",
        )

    with at.trajectory("q") as t:
        agent()
        t.reward = 1.0
    first, second, third = t.calls
    assert third.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather in Paris?"},
        second.choices[0].message,
        {
            "role": "tool",
            "tool_call_id": second.choices[0].message["tool_calls"][0]["id"],
            "content": "sunny",
        },
    ]
    assert t.trainable_turns == 3
    # the server rendered the same conversation: each prompt extends the turn before
    for earlier, later in [(first, second), (second, third)]:
        prompt, ids, _ = tokens(earlier)
        assert tokens(later)[0][: len(prompt) + len(ids)] == prompt + ids
    trajectory = t.to_art()
    choices = [m for m in trajectory.messages_and_choices if isinstance(m, Choice)]
    assert len(choices) == 3 and not trajectory.additional_histories
    assert [c.model_extra["token_ids"] for c in choices] == [tokens(c)[1] for c in t.calls]
    assert [c.model_extra["prompt_token_ids"] for c in choices] == [tokens(c)[0] for c in t.calls]


def test_a_chain_started_outside_the_run_says_so_and_warns_once(instrumented, started):
    _server, client, _ = started("Hello.", "Again.", "And again.")
    first = client.responses.create(model="policy", input="Hi")  # no run: not recorded

    @at.trainable
    def agent() -> None:
        client.responses.create(model="policy", input="More", previous_response_id=first.id)
        client.responses.create(model="policy", input="More", previous_response_id=first.id)

    with (
        pytest.warns(UserWarning, match="was not recorded in this run") as caught,
        at.trajectory("q") as t,
    ):
        agent()
    assert len([w for w in caught if "not recorded" in str(w.message)]) == 1
    for call in t.calls:
        assert call.messages == [{"role": "user", "content": "More"}]
        assert first.id in call.params["arttrace_context"]


def test_function_calls_and_their_outputs_become_chat_messages(instrumented, started):
    server, client, _ = started("Done.")
    given = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Use the tool."}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking."}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Rome"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "warm"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "cold"}],
        },
        {"type": "item_reference", "id": "msg_0"},
    ]

    @at.trainable
    def agent() -> None:
        client.responses.create(model="policy", input=given, tools=[WEATHER])

    with at.trajectory("q") as t:
        agent()
    (call,) = t.calls
    assert call.messages == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning": "Use the tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "warm"},
        {"role": "tool", "tool_call_id": "c2", "content": "cold"},
    ]
    assert call.params["arttrace_skipped_items"] == ["item_reference"]
    assert server.llm.requests[0]["messages"] == call.messages  # what the server rendered


def test_reasoning_is_kept_on_the_assistant_message(instrumented, started):
    _server, client, _ = started(Reply("Paris.", reasoning="The capital of France."))

    @at.trainable
    def agent() -> Any:
        return client.responses.create(model="policy", input="Capital of France?", stream=True)

    with at.trajectory("q") as t:
        list(agent())
    (call,) = t.calls
    assert call.choices[0].message == {
        "role": "assistant",
        "content": "Paris.",
        "reasoning": "The capital of France.",
    }
    assert t.trainable_turns == 1


# -- when the server returns no exact tokens ----------------------------------------------------


def test_a_turn_that_is_only_a_function_call_is_context_with_one_warning(instrumented, started):
    """vLLM puts the generation's logprobs on the message's text; a turn with no text has
    nowhere to put them, so it cannot be trained on: one warning per model, with the fix."""
    _server, client, _ = started(ONLY_CALL, ONLY_CALL, ONLY_CALL)

    @at.trainable
    def agent() -> None:
        for _ in range(3):
            client.responses.create(model="policy", input="Rome?", tools=[WEATHER])

    with pytest.warns(at.UntrainableTurnWarning) as caught, at.trajectory("q") as t:
        agent()
    # Only ours: a stray ResourceWarning of an earlier test's socket may land here too.
    (warning,) = [w for w in caught if w.category is at.UntrainableTurnWarning]
    said = str(warning.message)
    assert "OpenAIChatCompletionsModel" in said and "token_generations" in said
    # It says what is missing: the ids came, the logprobs did not.
    assert "only a function call: token ids, no logprobs" in said
    assert "without exact token ids" not in said
    assert t.trainable_turns == 0 and len(t.calls) == 3
    for call in t.calls:
        (choice,) = call.choices
        assert choice.message["tool_calls"] and choice.logprobs is None
        assert call.prompt_token_ids is not None and choice.token_ids is not None


def test_a_server_returning_token_generations_makes_every_turn_trainable(instrumented, started):
    server, client, aclient = started(ONLY_CALL, CALL)
    server.responses.token_generations = True

    @at.trainable
    async def agent() -> list[Any]:
        whole = client.responses.create(model="policy", input="Rome?", tools=[WEATHER])
        stream = await aclient.responses.create(model="policy", input="Paris?", stream=True)
        return [whole, [e async for e in stream][-1].response]

    with at.trajectory("q") as t:
        responses = asyncio.run(agent())
    assert t.trainable_turns == 2
    for call, response in zip(t.calls, responses, strict=True):
        (generation,) = as_sent(response)["token_generations"]
        assert tokens(call) == (
            generation["prompt_token_ids"],
            generation["token_ids"],
            [p["logprob"] for p in generation["output_tokens"]],
        )


def test_request_training_data_false_sends_the_request_unchanged(started):
    at.instrument(request_training_data=False)
    try:
        server, client, _ = started("Hi.")

        @at.trainable
        def agent() -> None:
            client.responses.create(model="policy", input="x")

        with (
            pytest.warns(at.UntrainableTurnWarning, match="OpenAIChatCompletionsModel") as caught,
            at.trajectory("q") as t,
        ):
            agent()
    finally:
        at.uninstrument()
        _warnings.reset()
    assert server.responses.requests == [{"model": "policy", "input": "x"}]
    (call,) = t.calls
    assert call.trainable and t.trainable_turns == 0 and call.choices[0].logprobs is None
    (warning,) = [w for w in caught if w.category is at.UntrainableTurnWarning]
    assert "without prompt token ids, sampled token ids and logprobs" in str(warning.message)


def test_calls_outside_trainable_are_context_and_ask_for_nothing(instrumented, started):
    server, client, _ = started("Hi.")
    with at.trajectory("q") as t:
        client.responses.create(model="judge", input="x")
    assert server.responses.requests == [{"model": "judge", "input": "x"}]
    assert not t.calls[0].trainable


def test_a_wrapped_client_records_responses_calls(started):
    _server, client, _ = started("Hi.")
    client = at.wrap_openai(client)

    @at.trainable
    def agent() -> None:
        client.responses.create(model="policy", input="x")

    with at.trajectory("q") as t:
        agent()
    assert t.trainable_turns == 1


# -- off the wire: the gateway ------------------------------------------------------------------


def test_the_gateway_forwards_responses_and_records_them_with_the_same_parser(started):
    server, _, _ = started("Hello.", "Streamed.", "Plain.")
    body = {"model": "policy", "input": "Hi"}
    with Gateway(server.base_url) as gateway, httpx.Client() as http:
        with at.trajectory("q") as t:
            answered = http.post(f"{gateway.url(t)}/responses", json=body).json()
            with http.stream(
                "POST", f"{gateway.url(t)}/responses", json={**body, "stream": True}
            ) as streamed:
                lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        with at.trajectory("r") as u:
            url = gateway.url(u, request_training_data=False)
            with pytest.warns(at.UntrainableTurnWarning, match="OpenAIChatCompletionsModel"):
                plain = http.post(f"{url}/responses", json=body)
    completed = json.loads(lines[-1].removeprefix("data: "))["response"]
    sent = server.responses.requests
    assert sent[0]["include"] == ["message.output_text.logprobs"]  # the gateway asked
    assert sent[0]["enable_response_messages"] is True and sent[2] == body
    first, second = t.calls
    assert tokens(first) == exact(answered) and tokens(second) == exact(completed)
    assert first.choices[0].message == {"role": "assistant", "content": "Hello."}
    assert t.trainable_turns == 2
    assert plain.status_code == 200 and u.trainable_turns == 0
    assert u.calls[0].choices[0].message == {"role": "assistant", "content": "Plain."}


def test_the_wire_recorder_reads_bytes_as_the_shim_reads_objects(instrumented, started):
    _server, client, _ = started("Same answer.")

    @at.trainable
    def agent() -> tuple[ResponsesCall, Any]:
        response = client.responses.create(model="policy", input="x")
        recorder = ResponsesCall({"model": "policy", "input": "x"}, Settings(), None)
        recorder.whole(200, json.dumps(as_sent(response)).encode())
        return recorder, response

    with at.trajectory("q") as t:
        recorder, _ = agent()
    shim, wire = t.calls
    assert wire is recorder.call
    assert shim.choices == wire.choices and shim.prompt_token_ids == wire.prompt_token_ids


# -- faults in arttrace's own steps never reach the caller --------------------------------------


def _outcome(result: Any) -> Any:
    """What the caller saw, comparable across two runs (``created_at`` is the server's clock)."""
    if isinstance(result, list | tuple):
        return [_outcome(r) for r in result]
    if isinstance(result, pydantic.BaseModel):
        result = result.model_dump(mode="json", warnings=False)
    if isinstance(result, dict):
        return {k: _outcome(v) for k, v in result.items() if k != "created_at"}
    return result


def _aclient(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)


def _sync(client: openai.OpenAI, url: str) -> Any:
    return client.responses.create(model="policy", input="x", tools=[WEATHER], **ASK)


def _async(client: openai.OpenAI, url: str) -> Any:
    async def run() -> Any:
        async with _aclient(url) as aclient:
            return await aclient.responses.create(model="policy", input="x", **ASK)

    return asyncio.run(run())


def _stream(client: openai.OpenAI, url: str) -> Any:
    return list(client.responses.create(model="policy", input="x", stream=True, **ASK))


def _stream_async(client: openai.OpenAI, url: str) -> Any:
    async def run() -> Any:
        async with _aclient(url) as aclient:
            stream = await aclient.responses.create(model="policy", input="x", stream=True, **ASK)
            return [event async for event in stream]

    return asyncio.run(run())


def _helper(client: openai.OpenAI, url: str) -> Any:
    with client.responses.stream(model="policy", input="x", **ASK) as stream:
        return [*stream, stream.get_final_response()]


def _closed_early(client: openai.OpenAI, url: str) -> Any:
    stream = client.responses.create(model="policy", input="x", stream=True, **ASK)
    first = next(iter(stream))
    stream.close()
    return first


def _parse(client: openai.OpenAI, url: str) -> Any:
    parsed = client.responses.parse(model="policy", input="x", text_format=Answer, **ASK)
    return [parsed.output_parsed, parsed]


def _views(client: openai.OpenAI, url: str) -> Any:
    raw = client.responses.with_raw_response.create(model="policy", input="x", **ASK)
    with client.responses.with_streaming_response.create(
        model="policy", input="y", stream=True, **ASK
    ) as view:
        return [raw.status_code, raw.parse(), list(view.parse())]


def _chain(client: openai.OpenAI, url: str) -> Any:
    first = client.responses.create(model="policy", input="x", **ASK)
    given = [
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "warm"},
    ]
    return [
        first,
        client.responses.create(model="policy", input=given, previous_response_id=first.id, **ASK),
    ]


def _error(client: openai.OpenAI, url: str) -> Any:
    try:
        client.responses.create(model="policy", input="x", previous_response_id="resp_none", **ASK)
    except openai.APIStatusError as error:
        return [type(error), error.status_code, str(error)]
    raise AssertionError("the server found a response that does not exist")


FAULT_MODES: dict[str, tuple[Callable[..., Any], list[Reply | str]]] = {
    "whole": (_sync, [CALL]),
    "whole async": (_async, ["3"]),
    "stream": (_stream, [CALL]),
    "stream async": (_stream_async, [Reply("a b", reasoning="think")]),
    "stream helper": (_helper, ["three tokens here"]),
    "stream closed early": (_closed_early, ["a b c"]),
    "parse": (_parse, ['{"value": 3}']),
    "raw and streaming views": (_views, ["1", "2"]),
    "chain and function calls": (_chain, ["1", ONLY_CALL]),
    "error": (_error, ["3"]),
}


def _namer(call: OpenCall) -> None:
    raise RuntimeError("fault injected into a namer")


RESPONSES_FAULTS: dict[str, tuple[Any, str]] = {
    "ResponsesCall.__init__": (ResponsesCall, "__init__"),
    "ResponsesCall.complete": (ResponsesCall, "complete"),
    "ResponsesCall.add_chunk": (ResponsesCall, "add_chunk"),
    "ResponsesCall.end_stream": (ResponsesCall, "end_stream"),
    "ResponsesCall.fail": (ResponsesCall, "fail"),
    "ResponsesCall.abandon": (ResponsesCall, "abandon"),
    "ResponsesCall._messages": (ResponsesCall, "_messages"),
    "reading a response": (_responses, "read_response"),
    "reading exact tokens": (_responses, "_exact_tokens"),
    "reading input items": (_responses, "input_messages"),
    "reading output items": (_responses, "assistant_message"),
    "reading tools": (_responses, "chat_tools"),
    "reading SDK objects": (_responses, "_plain"),
    "training fields": (_responses, "with_training_fields"),
    "naming a call": (_openai, "_namers"),
}


def _run(mode: str, capture: bool) -> Any:
    call, replies = FAULT_MODES[mode]
    with (
        serve(ScriptedLLM(list(replies))) as server,
        openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client,
    ):
        if not capture:
            return _outcome(call(client, server.base_url))
        with at.trajectory("ex"):
            return _outcome(at.trainable(call)(client, server.base_url))


@pytest.fixture(scope="module")
def uninstrumented_outcomes() -> dict[str, Any]:
    with warnings_are_errors():
        return {mode: _run(mode, capture=False) for mode in FAULT_MODES}


@pytest.mark.parametrize("fault", RESPONSES_FAULTS)
def test_a_fault_in_any_responses_step_is_invisible_to_the_caller(
    instrumented, uninstrumented_outcomes, monkeypatch, caplog, fault
):
    owner, name = RESPONSES_FAULTS[fault]
    fired: list[str] = []
    original = getattr(owner, name)

    def boom(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return original(*args, **kwargs)  # the scripted server shares the item readers
        fired.append(name)
        raise RuntimeError(f"fault injected into {fault}")

    if name == "_namers":
        monkeypatch.setattr(_openai, "_namers", [lambda call: boom()])
    else:
        monkeypatch.setattr(owner, name, boom)
    monkeypatch.setattr(_guard, "_logged", set())
    for mode in FAULT_MODES:
        with warnings_are_errors():  # nothing of arttrace's may reach the caller
            assert _run(mode, capture=True) == uninstrumented_outcomes[mode], mode
        _warnings.reset()
    assert fired, f"the fault in {fault} never fired: the test proves nothing"
    assert any(r.exc_info and "fault injected" in str(r.exc_info[1]) for r in caplog.records)


def test_the_scripted_server_streams_vllms_event_sequence(started):
    server, _client, _ = started(CALL)
    with httpx.stream(
        "POST",
        f"{server.base_url}/responses",
        json={
            "model": "m",
            "input": "x",
            "stream": True,
            **ASK["extra_body"],
            "include": ASK["include"],
        },
    ) as response:
        names = [
            line.removeprefix("event: ")
            for line in response.iter_lines()
            if line.startswith("event: ")
        ]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    message = names.index("response.output_item.added")
    assert names[message + 1] == "response.content_part.added"
    assert names[message + 2] == "response.output_text.delta"
    done = names.index("response.output_text.done")
    assert names[done : done + 4] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the function call
    ]
    assert "response.function_call_arguments.delta" in names
    assert names[-3:-1] == ["response.function_call_arguments.done", "response.output_item.done"]


def test_the_scripted_server_answers_legacy_completions_as_vllm(started):
    _server, client, _ = started("four", "four")
    whole = client.completions.create(
        model="m", prompt="2+2=", logprobs=1, extra_body={"return_token_ids": True}
    )
    chunks = list(
        client.completions.create(
            model="m", prompt="2+2=", logprobs=1, stream=True, extra_body={"return_token_ids": True}
        )
    )
    (choice,) = whole.choices
    assert choice.text == "four" and choice.finish_reason == "stop"
    extra = choice.model_extra or {}
    assert len(extra["token_ids"]) == len(choice.logprobs.token_logprobs)
    assert extra["prompt_token_ids"]
    streamed = [i for c in chunks for i in (c.choices[0].model_extra or {})["token_ids"]]
    assert streamed == extra["token_ids"]
    assert "".join(c.choices[0].text for c in chunks) == "four"
    assert (chunks[0].choices[0].model_extra or {})["prompt_token_ids"] == extra["prompt_token_ids"]


# -- ART's own preprocessing accepts the records --------------------------------------------------


def test_art_trains_exactly_the_sampled_tokens_of_responses_turns(instrumented):
    """Exact Qwen2.5 ids from a server returning ``token_generations``: a function-call turn
    and the answer after its output, chained by ``previous_response_id``, tokenized by ART."""
    import art
    from art.preprocessing.tokenize import tokenize_trajectory_groups

    from arttrace.testing import HFChatTokenizer
    from support.qwen import qwen_tokenizer

    qwen = qwen_tokenizer()
    rollouts = [("Paris", "Sunny.", 1.0), ("Rome", "Warm.", 0.0)]
    script: list[Reply] = []
    for city, answer, _ in rollouts:
        script += [Reply(tool_calls=[ToolCall("get_weather", {"city": city})]), Reply(answer)]
    with serve(ScriptedLLM(script, tokenizer=HFChatTokenizer(qwen))) as server:
        server.responses.token_generations = True
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)

        @at.trainable
        def agent() -> None:
            first = client.responses.create(model="policy", input="Weather?", tools=[WEATHER])
            output = {"type": "function_call_output", "call_id": first.output[-1].call_id}
            client.responses.create(
                model="policy",
                input=[{**output, "output": "fine"}],
                tools=[WEATHER],
                previous_response_id=first.id,
            )

        trajectories = []
        for number, (_, _, reward) in enumerate(rollouts):
            with at.trajectory("ex", metadata={"rollout": number}) as t:
                agent()
                t.reward = reward
            assert t.trainable_turns == 2
            trajectories.append(t.to_art())
    results = list(
        tokenize_trajectory_groups(
            qwen,
            [art.TrajectoryGroup(trajectories)],
            allow_training_without_logprobs=False,
            scale_rewards=True,
        )
    )
    assert len(results) == 2
    for result, trajectory in zip(
        sorted(results, key=lambda r: r.trajectory.metadata["rollout"]), trajectories, strict=True
    ):
        choices = [m for m in trajectory.messages_and_choices if isinstance(m, Choice)]
        first, second = (c.model_extra or {} for c in choices)
        # one sequence: the answer's prompt extends the call's prompt and sample
        assert result.token_ids == second["prompt_token_ids"] + second["token_ids"]
        masked = [t for t, m in zip(result.token_ids, result.assistant_mask, strict=True) if m]
        assert masked == first["token_ids"] + second["token_ids"]
        kept = [lp for lp, m in zip(result.logprobs, result.assistant_mask, strict=True) if m]
        assert kept == [t.logprob for c in choices for t in c.logprobs.content]


def test_raw_ids_short_of_the_servers_own_count_are_not_trusted(instrumented, started):
    """A vLLM whose final streamed response held only the last delta's ids (or several
    generations' worth of output): the server's ``usage.output_tokens`` disagrees, so the turn
    is context, not trained on wrong ids."""
    _server, client, _ = started("one two three")

    @at.trainable
    def agent() -> ResponsesCall:
        response = client.responses.create(model="policy", input="x")
        sent = as_sent(response)
        sent["output_messages"][0]["tokens"] = sent["output_messages"][0]["tokens"][-1:]
        recorder = ResponsesCall({"model": "policy", "input": "x"}, Settings(), None)
        recorder.whole(200, json.dumps(sent).encode())
        return recorder

    with pytest.warns(at.UntrainableTurnWarning), at.trajectory("q") as t:
        recorder = agent()
    assert t.calls[0].choices[0].token_ids is not None  # the shim's own record: whole
    assert recorder.call.choices[0].token_ids is None and recorder.call.prompt_token_ids is None
    assert recorder.call.choices[0].message == {"role": "assistant", "content": "one two three"}


def test_langchain_on_the_responses_api_is_recorded_once_and_trains(instrumented, started):
    """``ChatOpenAI(use_responses_api=True)``: the shim records the call with its exact
    tokens, LangChain's hook names it, the layer merge keeps one record."""
    from langchain_openai import ChatOpenAI

    server, _, _ = started("Hello there.", "Streamed.")
    llm = ChatOpenAI(
        model="policy", base_url=server.base_url, api_key="test", use_responses_api=True
    )

    @at.trainable
    def agent() -> None:
        llm.invoke("Hi")
        for _ in llm.stream("Hi again"):
            pass

    with warnings_are_errors(), at.trajectory("q") as t:
        agent()
    assert len(t.calls) == len(server.responses.requests) == 2
    assert [(c.source, c.framework) for c in t.calls] == [("openai", "langchain")] * 2
    assert t.trainable_turns == 2
    for call, sent in zip(t.calls, server.responses.sent, strict=True):
        assert tokens(call) == exact(sent)


def test_a_server_side_conversation_is_named_as_unrecorded_history(instrumented, started):
    _, client, _ = started("Again.")

    @at.trainable
    def agent() -> None:
        client.responses.create(model="policy", input="More", conversation="conv_1")

    with (
        pytest.warns(UserWarning, match="continues conversation 'conv_1', which was not"),
        at.trajectory("q") as t,
    ):
        agent()
    (call,) = t.calls
    assert call.messages == [{"role": "user", "content": "More"}]
    assert "conversation 'conv_1'" in call.params["arttrace_context"]
