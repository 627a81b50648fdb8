"""arttrace's capture contract against a real vLLM server (opt in: `make test-vllm`).

Every policy turn an instrumented agent makes is recorded once and trainable, its prompt ids,
sampled ids, logprobs, finish reason, text, tool calls and reasoning equal to what the server
sent (read from the raw bytes under the client), whole and streamed, n=1 and n=2, tool calls
parsed by vLLM's hermes parser; and ART's own tokenizer masks exactly the sampled ids.

Tests marked ``reasoning`` need a server started with a reasoning parser; the others the plain
server ART itself starts (hermes tool parser, no reasoning parser). `.ci/vllm/run.sh` runs
each set against its server.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from contract import (
    QUESTION,
    TAG_IDS,
    TOOLS,
    ask,
    check_art_masks_exactly_the_sampled_ids,
    check_recorded_as_sent,
    forced,
    model_name,
    two_runs,
)
from raw import Tee

import arttrace as at

# Short texts: the random model spells a forced text in small pieces, ~0.3 s a token here.
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
TOOL_TURN = f"Ok.\n<tool_call>\n{json.dumps(CALL)}\n</tool_call>"
ANSWER = "Sunny."
THINKING = "<think>\nParis weather.\n</think>\n\n"


@at.trainable
def weather_agent(
    client: openai.OpenAI,
    first: str,
    second: str,
    *,
    stream_first: bool,
    stream_second: bool,
    seed: int,
) -> list[dict[str, Any]]:
    """Asks for the weather with a tool call, gets the result, answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    turn = ask(client, messages, stream=stream_first, tools=TOOLS, **forced(first, seed=seed))
    messages.append(turn)
    assert turn["tool_calls"], f"vLLM's hermes parser found no tool call in {turn}"
    for call in turn["tool_calls"]:
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == CALL["arguments"]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 22°C"})
    messages.append(
        ask(client, messages, stream=stream_second, tools=TOOLS, **forced(second, seed=seed))
    )
    return messages


def run_group(
    client: openai.OpenAI,
    first: str,
    second: str = ANSWER,
    *,
    stream_first: bool,
    stream_second: bool,
) -> list[at.Trajectory]:
    """Two runs of the agent (see ``two_runs``)."""

    def rollout(seed: int) -> None:
        messages = weather_agent(
            client,
            first,
            second,
            stream_first=stream_first,
            stream_second=stream_second,
            seed=seed,
        )
        assert ANSWER in (messages[-1]["content"] or ""), messages[-1]

    return two_runs("weather", rollout)


@pytest.mark.parametrize(
    ("stream_first", "stream_second"),
    [(False, False), (True, True), (True, False)],
    ids=["whole-whole", "stream-stream", "stream-whole"],
)
def test_a_tool_calling_agent_is_recorded_exactly(
    client: openai.OpenAI, tee: Tee, tokenizer: Any, stream_first: bool, stream_second: bool
) -> None:
    runs = run_group(client, TOOL_TURN, stream_first=stream_first, stream_second=stream_second)
    assert [t.trainable_turns for t in runs] == [2, 2]
    pairs = check_recorded_as_sent(runs, tee)
    assert len(pairs) == 4
    for call, raw in pairs:
        if raw.choices[0].tool_calls:
            # hermes keeps the newline before <tool_call> in the content; arttrace too
            assert raw.choices[0].content == "Ok.\n"
            assert TAG_IDS["<tool_call>"] in raw.choices[0].token_ids
            assert call.choices[0].finish_reason == "tool_calls"
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_n2_samples_are_each_recorded_and_trained(
    client: openai.OpenAI, tee: Tee, tokenizer: Any, stream: bool
) -> None:
    @at.trainable
    def sampler(seed: int) -> None:
        response = client.chat.completions.create(
            model=model_name(),
            messages=[{"role": "user", "content": QUESTION}],
            n=2,
            max_tokens=8,
            seed=seed,
            stream=stream,
        )
        if isinstance(response, openai.Stream):
            for _ in response:
                pass

    runs = two_runs("sample", sampler)
    pairs = check_recorded_as_sent(runs, tee)
    for call, raw in pairs:
        assert len(call.choices) == len(raw.choices) == 2
        assert {c.finish_reason for c in call.choices} <= {"length", "stop"}
    for t in runs:
        assert t.trainable_turns == 2
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


@pytest.mark.parametrize(
    ("n", "caller_asks"), [(1, False), (2, False), (1, True)], ids=["n1", "n2", "caller-asks"]
)
def test_trainable_streams_carry_usage_and_agree_with_it(
    client: openai.OpenAI, tee: Tee, n: int, caller_asks: bool
) -> None:
    """#9 item 5: a trainable stream asks for its usage chunk (not a sampling parameter), the
    usage is recorded, and vLLM's count of sampled tokens equals the ids recorded; a caller
    that did not ask never sees that chunk."""
    seen: list[Any] = []

    @at.trainable
    def streamer() -> None:
        options: dict[str, Any] = {"stream_options": {"include_usage": True}} if caller_asks else {}
        stream = client.chat.completions.create(
            model=model_name(),
            messages=[{"role": "user", "content": QUESTION}],
            n=n,
            max_tokens=6,
            stream=True,
            **options,
        )
        seen.extend(chunk.usage for chunk in stream)

    with at.trajectory("usage", metadata={"run": 0}) as t:
        streamer()
        t.reward = 1.0
    ((call, raw),) = check_recorded_as_sent([t], tee)
    assert any(usage is not None for usage in seen) == caller_asks
    exchange = tee.completions()[0]
    ending = bytes(exchange.data).decode().rstrip().split("\n\n")[-2:]
    assert (exchange.body.get("stream_options") or {}).get("include_usage") is True, (
        f"arttrace did not ask this trainable stream for its usage chunk. Sent: "
        f"{exchange.body}; the stream ended {ending}; recorded usage: {call.usage}"
    )
    assert raw.usage is not None and call.usage is not None
    assert call.usage["completion_tokens"] == raw.usage["completion_tokens"]
    assert raw.usage["completion_tokens"] == sum(len(c.token_ids or ()) for c in call.choices)


@pytest.mark.reasoning
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_is_recorded_and_its_tokens_trained(
    client: openai.OpenAI, tee: Tee, tokenizer: Any, stream: bool
) -> None:
    def rollout(seed: int) -> None:
        messages = [{"role": "user", "content": QUESTION}]
        at.trainable(ask)(client, messages, stream=stream, **forced(THINKING + ANSWER, seed=seed))

    runs = two_runs("think", rollout)
    pairs = check_recorded_as_sent(runs, tee)
    for call, raw in pairs:
        sent = raw.choices[0]
        assert TAG_IDS["</think>"] in sent.token_ids, "the model spelled </think> in pieces"
        assert sent.reasoning and "Paris weather." in sent.reasoning, "no reasoning parsed"
        assert sent.content is not None and ANSWER in sent.content
        assert call.choices[0].message.get("reasoning") == sent.reasoning
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


@pytest.mark.reasoning
@pytest.mark.parametrize(
    ("stream_first", "stream_second"),
    [(False, False), (True, True)],
    ids=["whole", "stream"],
)
def test_reasoning_then_a_tool_call(
    client: openai.OpenAI, tee: Tee, tokenizer: Any, stream_first: bool, stream_second: bool
) -> None:
    turn = THINKING + f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"
    runs = run_group(
        client,
        turn,
        THINKING + ANSWER,
        stream_first=stream_first,
        stream_second=stream_second,
    )
    pairs = check_recorded_as_sent(runs, tee)
    for call, raw in pairs:
        if raw.choices[0].tool_calls:
            assert raw.choices[0].reasoning
            assert call.choices[0].message.get("reasoning") == raw.choices[0].reasoning
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_raw_httpx_call_is_recorded_exactly(
    base_url: str, tee: Tee, tokenizer: Any, stream: bool
) -> None:
    """#9 item 1: a client arttrace does not wrap (plain httpx) is read off the wire, and on a
    policy call arttrace asks for the exact tokens in the JSON body."""
    http = httpx.Client(transport=tee, timeout=300)

    @at.trainable
    def agent(seed: int) -> None:
        body = {
            "model": model_name(),
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 8,
            "seed": seed,
            "stream": stream,
        }
        with http.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            for _ in response.iter_bytes():
                pass

    runs = two_runs("raw-httpx", agent)
    http.close()
    check_recorded_as_sent(runs, tee)
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


async def test_an_async_streamed_tool_call_is_recorded_exactly(
    base_url: str, tee: Tee, tokenizer: Any
) -> None:
    http = httpx.AsyncClient(transport=tee, timeout=300)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, http_client=http)

    @at.trainable
    async def agent(seed: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        request: dict[str, Any] = {"model": model_name(), "messages": messages, "tools": TOOLS}
        stream = await client.chat.completions.create(
            **request, **forced(TOOL_TURN, seed=seed), stream=True
        )
        calls: dict[int, dict[str, str]] = {}
        async for chunk in stream:
            for part in chunk.choices:
                for tc in part.delta.tool_calls or ():
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += tc.id or ""
                    if tc.function is not None:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
        (call,) = calls.values()
        assert json.loads(call["arguments"]) == CALL["arguments"]
        messages += [
            {
                "role": "assistant",
                "content": "Ok.\n",
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 22°C"},
        ]
        answer = await client.chat.completions.create(**request, **forced(ANSWER, seed=seed))
        assert answer.choices[0].message.content == ANSWER

    runs = []
    for number, reward in enumerate([1.0, 0.0]):
        async with at.trajectory("async", metadata={"run": number}) as t:
            await agent(number)
            t.reward = reward
        runs.append(t)
    await http.aclose()
    assert [t.trainable_turns for t in runs] == [2, 2]
    check_recorded_as_sent(runs, tee)
    check_art_masks_exactly_the_sampled_ids(tokenizer, runs)


def test_a_call_outside_trainable_is_context_and_left_alone(
    client: openai.OpenAI, tee: Tee
) -> None:
    with at.trajectory("context") as t:
        client.chat.completions.create(
            model=model_name(), messages=[{"role": "user", "content": QUESTION}], max_tokens=4
        )
        t.reward = 0.0
    (call,) = t.calls
    assert not call.trainable and t.trainable_turns == 0
    body = tee.completions()[0].body
    assert "logprobs" not in body and "return_token_ids" not in body, body
