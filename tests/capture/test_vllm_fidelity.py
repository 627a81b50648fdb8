"""What a real vLLM sends, and what arttrace makes of it (``shared/research/vllm_protocol.md``):
the scripted server answers as vLLM does, and each divergence D1-D7 is recorded right, over
real HTTP through the OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import art
import httpx
import openai
import pytest
from art.preprocessing.tokenize import tokenize_trajectory_groups
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.capture import _warnings
from arttrace.capture._calls import Settings
from arttrace.capture._chat import Capture
from arttrace.capture._records import LLMCall
from arttrace.testing import HFChatTokenizer, LLMServer, Reply, ScriptedLLM, ToolCall
from support.qwen import qwen_tokenizer

Serve = Callable[[ScriptedLLM], LLMServer]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TRAINING_FIELDS = {"logprobs": True, "extra_body": {"return_token_ids": True}}
TOOL_TURN = Reply("Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    _warnings.reset()
    yield
    _warnings.reset()


@pytest.fixture(scope="module")
def qwen() -> Any:
    return qwen_tokenizer()


def client(server: Serve, llm: ScriptedLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=server(llm).base_url, api_key="k", max_retries=0)


def policy_call(sdk: openai.OpenAI, *, stream: bool, **kwargs: Any) -> tuple[LLMCall, list[Any]]:
    """One @trainable call; its record and the warnings it gave."""

    @at.trainable
    def agent() -> None:
        result = sdk.chat.completions.create(model="policy", messages=ASK, stream=stream, **kwargs)
        if stream:
            for _ in result:
                pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            agent()
            t.reward = 1.0
    (call,) = t.calls
    return call, [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]


def raw_stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's chunks, as JSON, read with plain httpx."""
    out = []
    with httpx.stream("POST", f"{url}/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: ") :]))
    return out


def read_as_the_proxy(sdk: openai.OpenAI, capture: Capture) -> list[Any]:
    """Send ``capture``'s call and read its stream as the shim's proxy does: each chunk
    recorded, the chunks the capture conceals dropped."""
    seen = []
    for chunk in sdk.chat.completions.create(**capture.kwargs):
        capture.add_chunk(chunk)
        if not capture.conceal(chunk):
            seen.append(chunk)
    capture.end_stream()
    return seen


def training_body(**extra: Any) -> dict[str, Any]:
    return {"model": "policy", "messages": ASK, "logprobs": True, "return_token_ids": True, **extra}


# -- the test server answers as vLLM does (T1-T4) ---------------------------------------------


def test_hermes_content_keeps_its_newline_before_the_tool_call(server: Serve, qwen: Any) -> None:
    llm = ScriptedLLM([TOOL_TURN, TOOL_TURN], tokenizer=HFChatTokenizer(qwen))
    url = server(llm).base_url
    whole = httpx.post(f"{url}/chat/completions", json=training_body()).json()
    message = whole["choices"][0]["message"]
    assert message["content"] == "Let me check.\n"  # hermes: the text before <tool_call>
    assert qwen.decode(whole["choices"][0]["token_ids"]).startswith("Let me check.\n<tool_call>")
    chunks = raw_stream(url, training_body(stream=True))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "Let me check.\n"


def test_held_back_tokens_arrive_as_empty_deltas_with_their_ids(server: Serve) -> None:
    llm = ScriptedLLM([TOOL_TURN, TOOL_TURN])
    url = server(llm).base_url
    whole = httpx.post(f"{url}/chat/completions", json=training_body()).json()["choices"][0]
    chunks = raw_stream(url, training_body(stream=True))
    parts = [c["choices"][0] for c in chunks]
    streamed = [i for p in parts for i in p.get("token_ids") or ()]
    assert streamed == whole["token_ids"]
    held = [p for p in parts if p["delta"] == {} and p["finish_reason"] is None]
    assert held and all(len(p["token_ids"]) == len(p["logprobs"]["content"]) == 1 for p in held)
    # the name delta carries no arguments key, as hermes sends it
    (named,) = [p for p in parts if "name" in str(p["delta"].get("tool_calls"))]
    assert named["delta"]["tool_calls"][0]["function"] == {"name": "get_weather"}
    finish = parts[-1]
    assert finish["finish_reason"] == "tool_calls" and finish["stop_reason"] is None


def test_n2_streams_interleave_and_each_role_chunk_has_the_prompt(server: Serve) -> None:
    llm = ScriptedLLM([[Reply("one two three"), Reply("four five six")]])
    chunks = raw_stream(server(llm).base_url, training_body(stream=True, n=2))
    assert [("prompt_token_ids" in c) for c in chunks[:2]] == [True, True]
    order = [c["choices"][0]["index"] for c in chunks[2:]]
    assert order[:4] == [0, 1, 0, 1]


def test_bytes_are_the_token_text_and_the_placeholders_of_the_alternatives(
    server: Serve,
) -> None:
    llm = ScriptedLLM([Reply("hi")])
    url = server(llm).base_url
    body = training_body(top_logprobs=2)
    (entry, *_) = httpx.post(f"{url}/chat/completions", json=body).json()["choices"][0]["logprobs"][
        "content"
    ]
    assert bytes(entry["bytes"]) == b"hi"
    assert [bytes(a["bytes"]).decode() for a in entry["top_logprobs"]] == [
        a["token"] for a in entry["top_logprobs"]
    ]
    assert entry["top_logprobs"][0]["token"].startswith("token_id:")


def test_usage_chunk_and_continuous_usage_counted_per_choice(server: Serve) -> None:
    llm = ScriptedLLM([[Reply("a b"), Reply("c d e")]] * 2)
    url = server(llm).base_url
    plain = raw_stream(url, training_body(stream=True, n=2))
    assert all("usage" not in c for c in plain)
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = raw_stream(url, training_body(stream=True, n=2, stream_options=options))
    *parts, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4 + 6
    assert max(c["usage"]["completion_tokens"] for c in parts) == 6  # one choice's count


def test_include_reasoning_false_drops_ids_and_logprobs(server: Serve) -> None:
    llm = ScriptedLLM([Reply("4", reasoning="2+2")])
    body = training_body(include_reasoning=False)
    answer = httpx.post(f"{server(llm).base_url}/chat/completions", json=body).json()
    choice = answer["choices"][0]
    assert choice["logprobs"] is None and "token_ids" not in choice
    assert answer["prompt_token_ids"] and choice["message"]["reasoning"] is None


def test_drop_held_back_plays_vllm_0_11(server: Serve) -> None:
    llm = ScriptedLLM([TOOL_TURN], drop_held_back=True)
    options = {"include_usage": True}
    chunks = raw_stream(server(llm).base_url, training_body(stream=True, stream_options=options))
    *parts, usage = chunks
    ids = [i for c in parts for i in c["choices"][0].get("token_ids") or ()]
    logprobs = [e for c in parts for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert len(ids) == len(logprobs) < usage["usage"]["completion_tokens"]
    assert all(c["choices"][0]["delta"] or c["choices"][0]["finish_reason"] for c in parts[1:])


# -- D1: a stream that lost tokens is not trained on -------------------------------------------


@pytest.mark.parametrize(
    "reply", [TOOL_TURN, Reply("4", reasoning="2 plus 2")], ids=["tool", "think"]
)
def test_a_stream_that_lost_held_back_tokens_is_untrainable_with_the_fix(
    instrumented: None, server: Serve, reply: Reply
) -> None:
    sdk = client(server, ScriptedLLM([reply], drop_held_back=True))
    call, [warning] = policy_call(sdk, stream=True, stream_options={"include_usage": True})
    (choice,) = call.choices
    assert len(choice.token_ids) == len(choice.logprobs) < call.usage["completion_tokens"]
    assert call.untrainable_reason(choice) == "the stream lost tokens"
    message = str(warning.message)
    assert "vLLM 0.10.2 to 0.12.x" in message and "vLLM >= 0.13" in message


def test_a_whole_stream_with_its_usage_is_trainable(instrumented: None, server: Serve) -> None:
    sdk = client(server, ScriptedLLM([TOOL_TURN, [Reply("a b"), Reply("c")]]))
    call, caught = policy_call(sdk, stream=True, stream_options={"include_usage": True})
    assert call.untrainable_reason(call.choices[0]) is None and not caught
    call, caught = policy_call(sdk, stream=True, n=2, stream_options={"include_usage": True})
    assert [call.untrainable_reason(c) for c in call.choices] == [None, None] and not caught
    assert call.usage["completion_tokens"] == sum(len(c.token_ids) for c in call.choices)


def test_a_policy_stream_asks_for_the_usage_chunk_and_the_caller_never_sees_it(
    server: Serve,
) -> None:
    """The contract the stream proxy relies on: the capture asks for ``include_usage`` only on
    a policy stream whose caller did not set ``stream_options`` and does not read raw bytes,
    and names the one chunk to drop; what remains is what the caller would have seen."""
    llm = ScriptedLLM(lambda request: Reply("one two three"))
    sdk = client(server, llm)
    base = {"model": "policy", "messages": ASK, "stream": True}

    @at.trainable
    def start(kwargs: dict[str, Any]) -> Capture:
        return Capture(kwargs, Settings(), sdk, hide_usage=True)

    with at.trajectory("ex"):
        capture = start(base)
        own = start({**base, "stream_options": {"include_usage": False}})
        raw = start({**base, "extra_headers": {"X-Stainless-Raw-Response": "true"}})
        context = Capture(base, Settings(), sdk, hide_usage=True)  # outside @trainable
        seen = read_as_the_proxy(sdk, capture)
        for other in (own, raw, context):
            other.abandon("not sent")
    assert capture.kwargs["stream_options"] == {"include_usage": True}
    assert own.kwargs["stream_options"] == {"include_usage": False}
    assert "stream_options" not in raw.kwargs and "stream_options" not in context.kwargs
    assert llm.requests[0]["stream_options"] == {"include_usage": True}
    twin = client(server, ScriptedLLM(lambda request: Reply("one two three")))  # same logprobs
    untouched = twin.chat.completions.create(**{**capture.kwargs, "stream_options": None})

    def shown(chunks: Any) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in c.to_dict().items() if k not in ("id", "created")} for c in chunks
        ]

    assert shown(seen) == shown(untouched)
    assert capture.call.usage is not None
    assert capture.call.usage["completion_tokens"] == len(capture.call.choices[0].token_ids)


@pytest.mark.parametrize("mode", ["sync", "async", "stream()"])
def test_the_shim_checks_a_policy_stream_against_usage_the_caller_never_asked_for(
    instrumented: None, server: Serve, mode: str
) -> None:
    """End to end through the patched SDK, as a user writes it (no ``stream_options``): the
    stream is checked against the server's usage, and the caller sees the chunks it would
    have seen without arttrace."""

    def read(llm: ScriptedLLM) -> list[dict[str, Any]]:
        url = server(llm).base_url
        kwargs: dict[str, Any] = {"model": "policy", "messages": ASK, **TRAINING_FIELDS}
        if mode == "async":

            async def consume() -> list[Any]:
                sdk = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
                return [c async for c in await sdk.chat.completions.create(**kwargs, stream=True)]

            chunks = asyncio.run(consume())
        else:
            sdk = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
            if mode == "stream()":
                with sdk.chat.completions.stream(**kwargs) as events:
                    chunks = [e.chunk for e in events if e.type == "chunk"]
            else:
                chunks = list(sdk.chat.completions.create(**kwargs, stream=True))
        return [
            {k: v for k, v in c.to_dict().items() if k not in ("id", "created")} for c in chunks
        ]

    plain = read(ScriptedLLM([TOOL_TURN]))  # the fields arttrace adds, asked for by hand
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            seen = at.trainable(read)(ScriptedLLM([TOOL_TURN]))
            lossy = at.trainable(read)(ScriptedLLM([TOOL_TURN], drop_held_back=True))
    assert seen == plain  # no usage chunk, nothing else changed
    whole, lost = t.calls
    assert whole.usage is not None and whole.usage["completion_tokens"] == len(
        whole.choices[0].token_ids
    )
    assert whole.untrainable_reason(whole.choices[0]) is None
    assert lost.untrainable_reason(lost.choices[0]) == "the stream lost tokens"
    assert [str(w.message) for w in caught if "lost tokens" in str(w.message)]
    assert len(lossy) < len(seen)


# -- D2: repetition --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_repetition_is_a_complete_sample_and_art_gets_length(
    instrumented: None, server: Serve, stream: bool
) -> None:
    sdk = client(server, ScriptedLLM([Reply("la la la la", finish_reason="repetition")]))

    @at.trainable
    def agent() -> None:
        result = sdk.chat.completions.create(model="policy", messages=ASK, stream=stream)
        for _ in result if stream else ():
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("error", at.UntrainableTurnWarning)
        with at.trajectory("ex") as t:
            agent()
            t.reward = 0.0
    (call,) = t.calls
    assert call.choices[0].finish_reason == "repetition"  # the record keeps vLLM's word
    assert call.untrainable_reason(call.choices[0]) is None
    (choice,) = [c for c in t.to_art().messages_and_choices if isinstance(c, Choice)]
    assert choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == call.choices[0].token_ids.tolist()


# -- D4: include_reasoning=false ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_no_logprobs_after_include_reasoning_false_names_the_cause(
    instrumented: None, server: Serve, stream: bool
) -> None:
    sdk = client(server, ScriptedLLM([Reply("4", reasoning="2+2")]))
    call, [warning] = policy_call(sdk, stream=stream, extra_body={"include_reasoning": False})
    assert call.untrainable_reason(call.choices[0]) == "no logprobs (include_reasoning=false)"
    assert "include_reasoning=false" in str(warning.message)
    assert "--return-tokens-as-token-ids" not in str(warning.message)


# -- D5: reasoning -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys", [("reasoning",), ("reasoning", "reasoning_content"), ("reasoning_content",)]
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_is_recorded_and_handed_to_art(
    instrumented: None, server: Serve, stream: bool, keys: tuple[str, ...]
) -> None:
    sdk = client(server, ScriptedLLM([Reply("4", reasoning="2 plus 2 is 4")], reasoning_keys=keys))
    call, caught = policy_call(sdk, stream=stream)
    assert not caught
    (record,) = call.choices
    assert record.message == {"role": "assistant", "content": "4", "reasoning": "2 plus 2 is 4"}
    assert call.untrainable_reason(record) is None
    assert len(record.token_ids) > 2  # <think>...</think> and the answer: what was sampled


def test_reasoning_reaches_art_and_its_tokenizer_trains_the_sampled_ids(
    instrumented: None, server: Serve, qwen: Any
) -> None:
    llm = ScriptedLLM(
        [Reply("4", reasoning="2 plus 2"), Reply("done", reasoning="said 4")] * 2,
        tokenizer=HFChatTokenizer(qwen),
    )
    sdk = client(server, llm)

    @at.trainable
    def agent(stream: bool) -> None:
        first = sdk.chat.completions.create(model="policy", messages=ASK, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in first if c.choices)
            reply: dict[str, Any] = {"role": "assistant", "content": text}
        else:
            reply = first.choices[0].message.model_dump(exclude_none=True)
        sdk.chat.completions.create(
            model="policy", messages=[*ASK, reply, {"role": "user", "content": "sure?"}]
        )

    runs = []
    for number, stream in enumerate((False, True)):
        with at.trajectory(f"ex-{number}") as t:
            agent(stream)
            t.reward = float(number)
        runs.append(t)
    trajectories = [t.to_art() for t in runs]
    for trajectory in trajectories:
        first, second = [c for c in trajectory.messages_and_choices if isinstance(c, Choice)]
        assert first.message.model_extra["reasoning"] == "2 plus 2"
        assert second.message.model_extra["reasoning"] == "said 4"
    results = list(
        tokenize_trajectory_groups(
            qwen,
            [art.TrajectoryGroup(trajectories)],
            allow_training_without_logprobs=False,
            scale_rewards=True,
        )
    )
    for number, trajectory in enumerate(trajectories):
        sampled = [
            i
            for c in trajectory.messages_and_choices
            if isinstance(c, Choice)
            for i in c.model_extra["token_ids"]
        ]
        assert "<think>" in qwen.decode(sampled)
        mine = [r for r in results if r.trajectory.reward == trajectory.reward]
        masked = [i for r in mine for i, m in zip(r.token_ids, r.assistant_mask, strict=True) if m]
        assert sorted(masked) == sorted(sampled), number


# -- D7: continuous usage ----------------------------------------------------------------------


def test_continuous_usage_keeps_the_final_count_and_a_cut_stream_no_running_count(
    instrumented: None, server: Serve
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    pair = [Reply("a b c"), Reply("d e")]
    sdk = client(server, ScriptedLLM([pair]))
    call, _ = policy_call(sdk, stream=True, n=2, stream_options=options)
    assert call.usage["completion_tokens"] == sum(len(c.token_ids) for c in call.choices) == 10

    cut = client(server, ScriptedLLM([pair], cut_stream_after=6))  # 2 role chunks, 4 tokens
    with at.trajectory("cut") as t, pytest.raises(httpx.RemoteProtocolError):
        at.trainable(
            lambda: list(
                cut.chat.completions.create(
                    model="policy", messages=ASK, stream=True, n=2, stream_options=options
                )
            )
        )()
    (call,) = t.calls
    assert call.partial and call.usage is None  # not one choice's running count


def test_concealing_leaves_openai_style_chunks_as_the_caller_would_see_them() -> None:
    """OpenAI's API sends ``"usage": null`` on every chunk once ``include_usage`` is on: the
    chunks the caller sees still dump as they would have without it."""

    def answer(request: httpx.Request) -> httpx.Response:
        include = (json.loads(request.read()).get("stream_options") or {}).get("include_usage")
        head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "policy"}
        part = {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}
        chunks: list[dict[str, Any]] = [{**head, "choices": [part]}]
        if include:
            chunks = [{**chunks[0], "usage": None}, {**head, "choices": [], "usage": USAGE}]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    sdk = openai.OpenAI(
        base_url="http://openai.test/v1",
        api_key="k",
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )
    base = {"model": "policy", "messages": ASK, "stream": True}
    with pytest.warns(at.UntrainableTurnWarning, match="no logprobs"), at.trajectory("ex"):
        capture = at.trainable(lambda: Capture(base, Settings(), sdk, hide_usage=True))()
        seen = read_as_the_proxy(sdk, capture)
    plain = list(sdk.chat.completions.create(**base))
    assert [c.to_json() for c in seen] == [c.to_json() for c in plain]
    assert capture.call.usage == USAGE


def test_a_server_that_forces_usage_keeps_its_usage_chunk_for_the_caller(server: Serve) -> None:
    """vLLM's ``--enable-force-include-usage`` sends usage on every chunk and a usage chunk
    whatever was asked: the caller sees it with or without arttrace, so it is not dropped."""
    sdk = client(server, ScriptedLLM(lambda request: Reply("a b c"), force_include_usage=True))
    base = {"model": "policy", "messages": ASK, "stream": True}
    with at.trajectory("ex"):
        capture = at.trainable(lambda: Capture(base, Settings(), sdk, hide_usage=True))()
        chunks = list(sdk.chat.completions.create(**capture.kwargs))
        hidden = [c for c in chunks if capture.conceal(c)]
        capture.abandon("read")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and hidden == []


USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
