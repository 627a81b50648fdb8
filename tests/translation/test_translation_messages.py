"""Anthropic Messages served through Chat Completions: the real ``anthropic`` SDK reads the
translator's bytes (served at the HTTP boundary by ``httpx2.MockTransport``, the SDK's own
HTTP library) for chat answers made by the scripted vLLM-like server, and gets the Message a
native Messages server would send, whole and streamed."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

import arttrace as at
from arttrace.gateway import Gateway
from arttrace.testing import Reply, ScriptedLLM, ToolCall
from arttrace.translation import TranslationError
from arttrace.translation._messages import SIGNATURE, MessagesTranslation
from support.gateway import RecordingUpstream
from support.served import KeptLLM, served

TRAINING = {"logprobs": True, "return_token_ids": True}
"""What the gateway adds to every upstream body."""
WEATHER = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)


class Messages:
    """A Messages server made of the translator and a Chat Completions server: what the
    gateway does, without the recording. Keeps every SSE body it sent."""

    def __init__(self, llm: ScriptedLLM, fail: Callable[[int], bytes | None] | None = None):
        self.llm, self.fail = llm, fail
        self.streams: list[bytes] = []
        self.client = sdk(self.handle)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        try:
            t = MessagesTranslation(json.loads(request.read()))
        except TranslationError as error:
            body = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": str(error)},
            }
            return httpx2.Response(400, json=body)
        status, payload, chunks = self.llm.respond({**t.upstream_body, **TRAINING})
        if chunks is None:
            if status != 200:
                return httpx2.Response(
                    status, content=t.error(status, json.dumps(payload).encode())
                )
            return httpx2.Response(200, json=t.answer(payload))
        out = bytearray(t.start())
        for number, chunk in enumerate(_chunks(chunks)):
            failure = self.fail(number) if self.fail else None
            if failure is not None:
                out += t.error(502, failure)
                break
            out += t.chunk(chunk)
        else:
            out += t.end()
        self.streams.append(bytes(out))
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=bytes(out)
        )

    def create(self, **params: Any) -> Message:
        return self.client.messages.create(model="policy", max_tokens=256, **params)

    def stream(self, **params: Any) -> Message:
        with self.client.messages.stream(model="policy", max_tokens=256, **params) as stream:
            return stream.get_final_message()


def sdk(handle: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    """The real SDK, its HTTP calls answered by ``handle``."""
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://messages.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handle)),
        max_retries=0,
    )


def _chunks(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    for line in b"".join(lines).split(b"\n\n"):
        if line.startswith(b"data: {"):
            yield json.loads(line[6:])


def _events(data: bytes) -> list[dict[str, Any]]:
    """Each SSE event of ``data``, checked against the SDK's own event types (and its
    ``event:`` name against its ``type``)."""
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame:
            continue
        name, payload = frame.split("\n")
        event = json.loads(payload.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        if event["type"] not in ("ping", "error"):
            EVENTS.validate_python(event)
        out.append(event)
    return out


def _same(whole: Message, streamed: Message) -> None:
    """The streamed Message is the whole one (each from its own upstream call: ids differ)."""
    assert streamed.id.startswith("msg_") and whole.id.startswith("msg_")
    one = whole.model_dump(exclude={"id"})
    two = Message.model_validate(streamed.model_dump()).model_dump(exclude={"id"})
    assert two == one


def test_a_text_answer_is_the_message_a_native_server_sends_whole_and_streamed() -> None:
    llm = KeptLLM([Reply("Paris is sunny."), Reply("Paris is sunny.")])
    server = Messages(llm)
    whole = server.create(messages=[{"role": "user", "content": "Weather in Paris?"}])
    prompt, sampled, _ = llm.tokens(0)
    assert whole.model_dump(exclude={"id"}) == Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "policy",
            "content": [{"type": "text", "text": "Paris is sunny."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": len(prompt),
                "output_tokens": len(sampled),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
    ).model_dump(exclude={"id"})
    assert whole.id == "msg_1"  # the upstream call's id, chatcmpl- cut

    streamed = server.stream(messages=[{"role": "user", "content": "Weather in Paris?"}])
    _same(whole, streamed)
    kinds = [e["type"] for e in _events(server.streams[0])]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert llm.requests[1]["stream_options"] == {"include_usage": True}


def test_two_parallel_tool_calls_are_two_tool_use_blocks_whole_and_streamed() -> None:
    reply = Reply(
        "Let me check.",
        tool_calls=[
            ToolCall("weather", {"city": "Paris"}, id="call_paris"),
            ToolCall("weather", {"city": "Oslo"}, id="call_oslo"),
        ],
    )
    server = Messages(ScriptedLLM([reply, reply]))
    ask = {"messages": [{"role": "user", "content": "Paris and Oslo?"}], "tools": [WEATHER]}
    whole = server.create(**ask)
    assert [b.model_dump(exclude_none=True) for b in whole.content] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_paris", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_oslo", "name": "weather", "input": {"city": "Oslo"}},
    ]
    assert whole.stop_reason == "tool_use"
    _same(whole, server.stream(**ask))
    events = _events(server.streams[0])
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [(e["index"], e["content_block"]["type"]) for e in starts] == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
    ]
    json_deltas = [e for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert [(e["index"], json.loads(e["delta"]["partial_json"])) for e in json_deltas] == [
        (1, {"city": "Paris"}),
        (2, {"city": "Oslo"}),
    ]


@pytest.mark.parametrize("keys", [("reasoning",), ("reasoning", "reasoning_content")])
def test_reasoning_is_a_signed_thinking_block_before_the_text(keys: tuple[str, ...]) -> None:
    """vLLM 0.11-0.14 send the reasoning under both keys: it is one thinking block."""
    reply = Reply("It is 4.", reasoning="2 and 2 make 4.")
    server = Messages(ScriptedLLM([reply, reply], reasoning_keys=keys))
    whole = server.create(messages=[{"role": "user", "content": "2+2?"}])
    assert [b.model_dump(exclude_none=True) for b in whole.content] == [
        {"type": "thinking", "thinking": "2 and 2 make 4.", "signature": SIGNATURE},
        {"type": "text", "text": "It is 4."},
    ]
    _same(whole, server.stream(messages=[{"role": "user", "content": "2+2?"}]))
    events = _events(server.streams[0])
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert deltas.index("signature_delta") < deltas.index("text_delta")


def test_stop_sequences_and_max_tokens_are_messages_stop_reasons() -> None:
    server = Messages(
        ScriptedLLM(
            [Reply("One, two", stop_reason="three")] * 2
            + [Reply("A long", finish_reason="length")] * 2
            + [Reply("Done", stop_reason=2)]  # vLLM's stop token id: the model's own end
        )
    )
    ask: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Count"}],
        "stop_sequences": ["three"],
    }
    for get in (server.create, server.stream):
        message = get(**ask)
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "three")
    for get in (server.create, server.stream):
        assert get(**ask).stop_reason == "max_tokens"
    assert (server.create(**ask).stop_reason, server.llm.requests[0]["stop"]) == (
        "end_turn",
        ["three"],
    )


def test_a_named_tool_choice_stops_for_tool_use_though_vllm_says_stop() -> None:
    reply = Reply(tool_calls=[ToolCall("weather", {"city": "Rome"})], finish_reason="stop")
    server = Messages(ScriptedLLM([reply, reply]))
    ask: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Rome?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "weather"},
    }
    assert server.create(**ask).stop_reason == "tool_use"
    assert server.stream(**ask).stop_reason == "tool_use"
    assert server.llm.requests[0]["tool_choice"] == {
        "type": "function",
        "function": {"name": "weather"},
    }


def test_arguments_that_are_not_a_json_object_reach_the_agent_as_empty_input(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent's validation then answers the model; the SDK never fails on them."""
    t = MessagesTranslation({"model": "m", "max_tokens": 9, "messages": [], "stream": True})
    call = {
        "id": "call_x",
        "type": "function",
        "function": {"name": "weather", "arguments": "{city"},
    }
    chat = {
        "id": "chatcmpl-x",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
    }
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        assert t.answer(chat)["content"] == [
            {"type": "tool_use", "id": "call_x", "name": "weather", "input": {}}
        ]
        head = {"id": "chatcmpl-x", "model": "m", "object": "chat.completion.chunk"}
        named = {**call, "index": 0, "function": {"name": "weather"}}
        pieces = [{"index": 0, "function": {"arguments": a}} for a in ("{ci", "ty")]
        deltas = [{"role": "assistant", "content": ""}, {"tool_calls": [named]}]
        deltas += [{"tool_calls": [p]} for p in pieces]
        data = b"".join(
            t.chunk({**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]})
            for d in deltas
        )
        data += t.chunk(
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        )
        data += t.chunk({**head, "choices": [], "usage": chat["usage"]}) + t.end()
    assert "not a JSON object" in caplog.text and "'weather'" in caplog.text
    client = sdk(
        lambda _: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=data)
    )
    with client.messages.stream(
        model="m", max_tokens=9, messages=[{"role": "user", "content": "?"}]
    ) as stream:
        message = stream.get_final_message()
    assert [b.model_dump(exclude_none=True) for b in message.content] == [
        {"type": "tool_use", "id": "call_x", "name": "weather", "input": {}}
    ]
    assert (message.stop_reason, message.usage.output_tokens) == ("tool_use", 4)


def test_a_tool_loop_sends_the_agents_turns_back_as_chat_messages() -> None:
    """The SDK's own objects (thinking, text, tool use, tool results) become the chat
    messages a vLLM Messages server would render: thinking as ``reasoning``."""
    first = Reply(
        "Checking.",
        reasoning="Two cities.",
        tool_calls=[ToolCall("weather", {"city": "Paris"}), ToolCall("weather", {"city": "Oslo"})],
    )
    server = Messages(ScriptedLLM([first, Reply("Paris sunny, Oslo unknown.")]))
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
        {"type": "text", "text": "You are terse."},
    ]
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
    answer = server.create(system=system, messages=messages, tools=[WEATHER])
    paris, oslo = (b for b in answer.content if b.type == "tool_use")
    messages += [
        {"role": "assistant", "content": answer.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": paris.id, "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": oslo.id,
                    "content": [{"type": "text", "text": "no data"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    final = server.create(system=system, messages=messages, tools=[WEATHER])
    assert final.content[0].type == "text" and final.stop_reason == "end_turn"
    assert server.llm.requests[1]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning": "Two cities.",
            "tool_calls": [
                {
                    "id": paris.id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": oslo.id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": paris.id, "content": "sunny"},
        {"role": "tool", "tool_call_id": oslo.id, "content": "no data"},
        {"role": "user", "content": "Summarise."},
    ]


def test_a_request_becomes_the_chat_request_vllm_would_make() -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    body = {
        "model": "policy",
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image", "source": image},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Two images"},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "A note."},
                    }
                ],
            },
            {"role": "assistant", "content": "The note says"},  # a prefill
        ],
        "tools": [{**WEATHER, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "metadata": {"user_id": "u1"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stream": True,
    }
    assert MessagesTranslation(body).upstream_body == {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in these?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                ],
            },
            {"role": "assistant", "content": "Two images"},
            {"role": "user", "content": "A note."},
            {"role": "assistant", "content": "The note says"},
        ],
        "max_tokens": 64,
        "stop": ["END"],
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "The weather in a city.",
                    "parameters": WEATHER["input_schema"],
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "continue_final_message": True,
        "add_generation_prompt": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_tool_results_come_first_then_one_user_message_with_their_images() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    calls = [{"type": "tool_use", "id": f"t{k}", "name": "shot", "input": {}} for k in (1, 2)]
    body = {
        "model": "policy",
        "max_tokens": 9,
        "messages": [
            {"role": "user", "content": "Screenshots?"},
            {"role": "assistant", "content": calls},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "one"},
                            {"type": "image", "source": png},
                        ],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "two",
                        "is_error": True,
                    },
                    {"type": "text", "text": "Compare."},
                ],
            },
        ],
    }
    assert MessagesTranslation(body).upstream_body["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"t{k}", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
                for k in (1, 2)
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "two"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "Compare."},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "'web_search'"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "custom tool"),
        (
            {"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]},
            "input_schema",
        ),
        (
            {"tools": [{"type": "computer_20250124", "name": "computer", "display_width_px": 9}]},
            "'computer'",
        ),
        (
            {"mcp_servers": [{"type": "url", "url": "https://mcp.test", "name": "m"}]},
            "'mcp_servers'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "Files API",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {
                                    "type": "base64",
                                    "media_type": "application/pdf",
                                    "data": "",
                                },
                            }
                        ],
                    }
                ]
            },
            "PDF",
        ),
        ({"max_tokens": None}, "'max_tokens' is required"),
    ],
)
def test_what_needs_anthropics_servers_is_a_400_saying_so(
    change: dict[str, Any], said: str
) -> None:
    body = {"model": "policy", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(TranslationError) as raised:
        MessagesTranslation({**body, **change})
    assert said in str(raised.value)


def test_the_sdk_raises_a_400_for_a_server_tool_with_the_reason() -> None:
    server = Messages(ScriptedLLM())
    with pytest.raises(anthropic.BadRequestError) as raised:
        server.create(
            messages=[{"role": "user", "content": "news?"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    assert "Anthropic's own tools" in str(raised.value.api_message)
    assert server.llm.requests == []  # nothing went upstream


@pytest.mark.parametrize(
    ("status", "error", "kind"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (404, anthropic.NotFoundError, "not_found_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (503, anthropic.ServiceUnavailableError, "overloaded_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_an_upstream_error_is_anthropics_error_for_its_status(
    status: int, error: type[anthropic.APIStatusError], kind: str
) -> None:
    upstream = json.dumps({"error": {"message": "model 'x' overloaded", "code": status}}).encode()

    def handle(request: httpx2.Request) -> httpx2.Response:
        t = MessagesTranslation(json.loads(request.read()))
        return httpx2.Response(status, content=t.error(status, upstream))

    with pytest.raises(error) as raised:
        sdk(handle).messages.create(
            model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}]
        )
    assert (raised.value.type, raised.value.api_message) == (kind, "model 'x' overloaded")


def test_a_stream_that_fails_midway_ends_with_an_error_event_the_sdk_raises() -> None:
    server = Messages(
        ScriptedLLM([Reply("A fairly long answer that is cut.")]),
        fail=lambda n: b'{"error": {"message": "the upstream cut its answer"}}' if n == 4 else None,
    )
    with pytest.raises(anthropic.APIStatusError) as raised:
        server.stream(messages=[{"role": "user", "content": "hi"}])
    assert (raised.value.type, raised.value.api_message) == (
        "api_error",
        "the upstream cut its answer",
    )
    events = _events(server.streams[0])
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "error"


def test_an_upstream_stream_without_usage_still_counts_the_tokens() -> None:
    """An upstream that ignores ``stream_options``: the usage comes from the token ids."""
    llm = KeptLLM([Reply("Hello there.")])
    t = MessagesTranslation(
        {
            "model": "m",
            "max_tokens": 9,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    _, _, chunks = llm.respond({**t.upstream_body, "stream_options": None, **TRAINING})
    assert chunks is not None
    data = t.start() + b"".join(t.chunk(c) for c in _chunks(chunks)) + t.end()
    prompt, sampled, _ = served(llm.answers[0][0], True)
    delta = next(e for e in _events(data) if e["type"] == "message_delta")
    assert delta["usage"]["input_tokens"] == len(prompt)
    assert delta["usage"]["output_tokens"] == len(sampled)


# -- through the gateway ------------------------------------------------------------------


def _weather_agent() -> ScriptedLLM:
    """A policy that calls two tools in parallel, thinking first, then answers from them."""

    def respond(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":
            results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
            return Reply(f"Paris: {results[0]}; Oslo: {results[1]}.")
        return Reply(
            "Checking both.",
            reasoning="Two cities, two calls.",
            tool_calls=[
                ToolCall("weather", {"city": "Paris"}),
                ToolCall("weather", {"city": "Oslo"}),
            ],
        )

    return ScriptedLLM(respond)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_anthropic_sdk_tool_loop_through_the_gateway_trains_every_turn(stream: bool) -> None:
    """The agent speaks Messages with the real SDK; the gateway (``translate="messages"``)
    calls the upstream's Chat Completions, answers each turn in Messages and records each as a
    trainable turn with the upstream's exact tokens."""
    upstream = RecordingUpstream(_weather_agent())
    with (
        upstream,
        Gateway(upstream.base_url, translate="messages") as gateway,
        at.trajectory("q-1") as t,
        anthropic.Anthropic(
            api_key="test", base_url=gateway.url(t).removesuffix("/v1"), max_retries=0
        ) as client,
    ):
        messages: list[Any] = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
        got: list[Message] = []
        for _ in range(2):
            ask: dict[str, Any] = {"model": "policy", "max_tokens": 256, "tools": [WEATHER]}
            if stream:
                with client.messages.stream(messages=messages, **ask) as events:
                    got.append(events.get_final_message())
            else:
                got.append(client.messages.create(messages=messages, **ask))
            messages.append({"role": "assistant", "content": got[-1].content})
            calls = [b for b in got[-1].content if b.type == "tool_use"]
            results = {"Paris": "sunny", "Oslo": "snow"}
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": c.id,
                            "content": results[c.input["city"]],
                        }
                        for c in calls
                    ],
                }
            )
        t.reward = 1.0

    first, last = got
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert [b.input for b in first.content if b.type == "tool_use"] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    assert first.stop_reason == "tool_use"
    assert last.content[0].type == "text" and last.content[0].text == "Paris: sunny; Oslo: snow."
    # the upstream was called with Chat Completions, asked for the training data
    assert [e.path for e in upstream.exchanges] == ["/v1/chat/completions"] * 2
    assert all(e.body["logprobs"] and e.body["return_token_ids"] for e in upstream.exchanges)
    # each Message is the translation of what the upstream answered
    for message, exchange in zip(got, upstream.exchanges, strict=True):
        prompt, sampled, _ = served(exchange.answered, stream)
        assert (message.usage.input_tokens, message.usage.output_tokens) == (
            len(prompt),
            len(sampled),
        )
    # every turn trains, with the upstream's exact tokens
    assert [c.trainable for c in t.calls] == [True, True] and t.trainable_turns == 2
    for call, exchange in zip(t.calls, upstream.exchanges, strict=True):
        prompt, sampled, logprobs = served(exchange.answered, stream)
        assert call.prompt_token_ids is not None and call.prompt_token_ids.tolist() == prompt
        choice = call.choices[0]
        assert choice.token_ids is not None and choice.token_ids.tolist() == sampled
        assert choice.logprobs is not None and choice.logprobs.tolist() == logprobs
        assert call.streamed is stream
    (conversation,) = t.conversations()
    roles = [i["role"] if isinstance(i, dict) else "turn" for i in conversation.items]
    assert roles == ["user", "turn", "tool", "tool", "turn"]


def test_a_tool_call_streamed_after_the_next_began_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vLLM streams tool calls one after the other; an upstream that goes back to an earlier
    one cannot reopen its block: the agent still gets a stream its SDK reads, and the log
    says what was left out."""
    t = MessagesTranslation({"model": "m", "max_tokens": 9, "messages": [], "stream": True})
    head = {"id": "chatcmpl-y", "model": "m", "object": "chat.completion.chunk"}

    def call(index: int, **fields: Any) -> dict[str, Any]:
        delta = {"tool_calls": [{"index": index, **fields}]}
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}

    pieces = [
        call(0, id="a", function={"name": "weather", "arguments": '{"city": "Paris"}'}),
        call(1, id="b", function={"name": "weather", "arguments": '{"city": "Oslo"}'}),
        call(0, function={"arguments": " "}),
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        data = b"".join(t.chunk(c) for c in pieces) + t.end()
    assert "tool call 0 after the next one began" in caplog.text
    with sdk(
        lambda _: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=data)
    ).messages.stream(model="m", max_tokens=9, messages=[{"role": "user", "content": "?"}]) as s:
        message = s.get_final_message()
    assert [(b.id, b.input) for b in message.content if b.type == "tool_use"] == [
        ("a", {"city": "Paris"}),
        ("b", {"city": "Oslo"}),
    ]


def test_a_claude_code_shaped_beta_call_through_the_gateway_trains() -> None:
    """``client.beta.messages`` (``/v1/messages?beta=true``, what Claude Code calls) with its
    billing header, thinking budget and metadata: one trainable turn, the header kept out of
    the prompt."""
    upstream = RecordingUpstream(ScriptedLLM([Reply("Done.", reasoning="Nothing to do.")]))
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=9f;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    ]
    with (
        upstream,
        Gateway(upstream.base_url, translate="messages") as gateway,
        at.trajectory("q-1") as t,
        anthropic.Anthropic(
            api_key="test", base_url=gateway.url(t).removesuffix("/v1"), max_retries=0
        ) as client,
        client.beta.messages.stream(
            model="policy",
            max_tokens=512,
            system=system,
            messages=[{"role": "user", "content": "Tidy up."}],
            metadata={"user_id": "u-1"},
            thinking={"type": "enabled", "budget_tokens": 256},
            betas=["interleaved-thinking-2025-05-14"],
        ) as stream,
    ):
        message = stream.get_final_message()
    assert [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content
    ] == [
        ("thinking", "Nothing to do."),
        ("text", "Done."),
    ]
    (exchange,) = upstream.exchanges
    assert exchange.path == "/v1/chat/completions"
    assert exchange.body["messages"][0] == {"role": "system", "content": "You are a coding agent."}
    assert "metadata" not in exchange.body and "thinking" not in exchange.body
    (call,) = t.calls
    prompt, sampled, _ = served(exchange.answered, True)
    assert call.trainable and call.prompt_token_ids is not None
    assert call.prompt_token_ids.tolist() == prompt
    assert call.choices[0].token_ids is not None and call.choices[0].token_ids.tolist() == sampled
