"""Translation: an agent speaking the Responses API, served through the upstream's Chat
Completions, through the gateway and through the in-process HTTP layer, with the real
``openai`` SDK and the OpenAI Agents SDK's default model. The caller's view (the SDK's
objects and events) is compared field by field with what the scripted server's own
``/v1/responses`` (vLLM's shapes) answers for the same scripted turns, and every turn is a
trainable turn with the exact tokens the server sent."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import agents
import anthropic
import httpx
import openai
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.models.openai_provider import OpenAIProvider
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

import arttrace as at
from arttrace.capture import _warnings
from arttrace.testing import LLMServer, Reply, ScriptExhausted, ToolCall, serve
from arttrace.translation import Chains, ResponsesTranslation, TranslationError
from support.common import warnings_are_errors
from support.served import KeptLLM

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
}
MODES = ["gateway", "in-process"]
STRICT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def respond(request: dict[str, Any]) -> Reply:
    """The scripted model: with tools, two calls of ``add`` (the first with a word first),
    then the sum; a user saying "fail" makes the server fail."""
    messages = request["messages"]
    user = next(m["content"] for m in messages if m["role"] == "user")
    if user == "fail":
        raise ScriptExhausted("the scripted server failed on purpose")
    if user == "Think.":
        return Reply("Done.", reasoning="Two and two make four.")
    results = [m for m in messages if m["role"] == "tool"]
    if request.get("tools") and len(results) < 2:
        n = len(results)
        return Reply(
            "Adding." if n == 0 else None,
            tool_calls=[ToolCall("add", {"a": n + 1, "b": 2}, id=f"call_{n}")],
        )
    if results:
        return Reply(f"The sum is {results[-1]['content']}.")
    return Reply(f"You said: {user}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[LLMServer, KeptLLM]]:
    llm = KeptLLM(respond)
    with serve(llm) as server:
        yield server, llm


@pytest.fixture(scope="module")
def native() -> Iterator[LLMServer]:
    """The same scripted model answering ``/v1/responses`` itself: what the caller must see."""
    with serve(KeptLLM(respond)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: tuple[LLMServer, KeptLLM]) -> Iterator[at.Gateway]:
    with at.Gateway(upstream[0].base_url, translate="responses,messages") as running:
        yield running


Body = Callable[[str], Any]


def in_run(
    mode: str, gateway: at.Gateway, server: LLMServer, body: Body, api: str = "responses"
) -> tuple[Any, Any]:
    """``body(base_url)`` in a run, its calls translated by ``mode``: the trajectory and what
    ``body`` returned (a coroutine is run)."""

    def call(url: str) -> Any:
        result = body(url)
        return asyncio.run(result) if asyncio.iscoroutine(result) else result

    if mode == "gateway":
        with at.trajectory("q") as t:
            result = call(gateway.url(t))
        return t, result
    at.instrument(translate=api)
    try:
        with at.trajectory("q") as t:
            result = at.trainable(call)(server.base_url)
    finally:
        at.uninstrument()
        _warnings.reset()
    return t, result


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="test", max_retries=0)


def trains_exactly(t: at.Trajectory, llm: KeptLLM, turns: int) -> None:
    """Every call of ``t`` is a policy turn with the ids and logprobs the server sent for the
    last ``turns`` chat answers."""
    assert [c.source for c in t.calls] == [t.calls[0].source] * turns
    assert t.trainable_turns == turns
    for call, index in zip(t.calls, range(-turns, 0), strict=True):
        (choice,) = call.choices
        assert call.trainable and call.untrainable_reason(choice) is None
        assert call.prompt_token_ids is not None and choice.token_ids is not None
        assert choice.logprobs is not None
        recorded = (
            call.prompt_token_ids.tolist(),
            choice.token_ids.tolist(),
            choice.logprobs.tolist(),
        )
        assert recorded == llm.tokens(index)


# -- the caller's view, reduced to what must match a native server ---------------------------


def item_view(item: Any) -> dict[str, Any]:
    d = item if isinstance(item, dict) else item.model_dump(exclude_none=True)
    keep = ("type", "status", "role", "name", "call_id", "arguments")
    view = {k: d[k] for k in keep if k in d}
    if "content" in d:
        view["content"] = [(p.get("type"), p.get("text")) for p in d["content"] or ()]
    return view


def response_view(response: Any, strict: bool = False) -> dict[str, Any]:
    """The key fields of a Response; ``strict``: a translated one, checked against the SDK's
    type (which the SDK itself reads leniently)."""
    if strict:
        Response.model_validate(response.model_dump())
    d = response.model_dump(exclude_none=True)
    usage = d.get("usage") or {}
    return {
        "object": d["object"],
        "status": d["status"],
        "incomplete_details": d.get("incomplete_details"),
        "model": d["model"],
        "output": [item_view(i) for i in d["output"]],
        "usage": [usage.get(k) for k in ("input_tokens", "output_tokens", "total_tokens")],
        "tools": [t["name"] for t in d.get("tools") or ()],
        "previous_response_id": bool(d.get("previous_response_id")),
    }


def events_view(events: list[Any], strict: bool = False) -> list[tuple[Any, ...]]:
    """Each event's type and key fields, in order; the sequence numbers must count from 0 and
    each event's ``item_id`` must be the id of the item added at its ``output_index``;
    ``strict``: translated events, checked against the SDK's types."""
    ids: dict[int, str] = {}
    view: list[tuple[Any, ...]] = []
    for number, event in enumerate(events):
        if strict:
            STRICT.validate_python(event.model_dump())
        d = event.model_dump(exclude_none=True)
        assert d["sequence_number"] == number
        if d["type"] == "response.output_item.added":
            ids[d["output_index"]] = d["item"]["id"]
        if "item_id" in d:
            assert d["item_id"] == ids[d["output_index"]]
        fields: tuple[Any, ...] = (d["type"],)
        for key in ("output_index", "content_index", "delta", "text", "arguments"):
            if key in d:
                fields += ((key, d[key]),)
        if "item" in d:
            fields += (("item", item_view(d["item"])),)
        if "part" in d:
            fields += (("part", d["part"]["type"], d["part"].get("text")),)
        if "response" in d:
            fields += (("response", response_view(event.response, strict)),)
        view.append(fields)
    return view


# -- the openai SDK ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_whole_response_matches_the_native_one_and_trains(mode, gateway, upstream, native):
    server, llm = upstream

    def body(url: str) -> list[Any]:
        c = client(url)
        called = c.responses.create(model="policy", input="Add 1 and 2.", tools=[ADD])
        said = c.responses.create(model="policy", input="Hello", instructions="Be brief.")
        thought = c.responses.create(model="policy", input="Think.")
        return [called, said, thought]

    with warnings_are_errors():
        t, got = in_run(mode, gateway, server, body)
    expected = body(native.base_url)
    assert [response_view(r, strict=True) for r in got] == [response_view(r) for r in expected]
    assert got[0].output[1].call_id == "call_0" and got[1].output_text == "You said: Hello"
    assert got[0].id != got[1].id and got[0].id.startswith("resp_")
    assert [o.type for o in got[2].output] == ["reasoning", "message"]
    trains_exactly(t, llm, 3)
    assert t.calls[1].messages[0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_sends_the_native_events_in_order_and_trains(mode, gateway, upstream, native):
    server, llm = upstream

    def body(url: str) -> tuple[list[list[Any]], Any]:
        c = client(url)
        events = [
            list(c.responses.create(model="policy", input="Add.", tools=[ADD], stream=True)),
            list(c.responses.create(model="policy", input="Think.", stream=True)),
        ]
        with c.responses.stream(model="policy", input="Hi") as stream:  # the SDK's helper
            for _ in stream:
                pass
            final = stream.get_final_response()
        return events, final

    with warnings_are_errors():
        t, (events, final) = in_run(mode, gateway, server, body)
    expected, expected_final = body(native.base_url)
    assert [events_view(e, strict=True) for e in events] == [events_view(e) for e in expected]
    assert [e.type for e in events[0]][:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    called, thought = ([e.type for e in stream] for stream in events)
    assert "response.function_call_arguments.delta" in called
    assert "response.reasoning_text.delta" in thought
    assert called[-1] == thought[-1] == "response.completed"
    assert response_view(final, strict=True) == response_view(expected_final)
    assert final.output_text == "You said: Hi"
    trains_exactly(t, llm, 3)
    assert all(c.streamed for c in t.calls)


def tool_loop(url: str, *, chain: bool) -> list[Any]:
    """Three turns: two calls of ``add``, each answered, then the sum; continued with
    ``previous_response_id`` (``chain``) or by sending the whole conversation again."""
    c = client(url)
    conversation: list[Any] = [{"role": "user", "content": "Add twice."}]
    responses = [c.responses.create(model="policy", input=conversation, tools=[ADD])]
    for _ in range(2):
        last = responses[-1]
        (call,) = [o for o in last.output if o.type == "function_call"]
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "3"}
        if chain:
            responses.append(
                c.responses.create(
                    model="policy", input=[result], previous_response_id=last.id, tools=[ADD]
                )
            )
        else:
            conversation += [o.model_dump(exclude_none=True) for o in last.output] + [result]
            responses.append(c.responses.create(model="policy", input=conversation, tools=[ADD]))
    return responses


@pytest.mark.parametrize("mode", MODES)
def test_a_three_turn_tool_loop_trains_every_turn_chained_or_replayed(
    mode, gateway, upstream, native
):
    server, llm = upstream
    with warnings_are_errors():
        chained, chained_answers = in_run(mode, gateway, server, lambda u: tool_loop(u, chain=True))
        trains_exactly(chained, llm, 3)
        replayed, _ = in_run(mode, gateway, server, lambda u: tool_loop(u, chain=False))
        trains_exactly(replayed, llm, 3)
    expected = tool_loop(native.base_url, chain=True)
    assert [response_view(r, strict=True) for r in chained_answers] == [
        response_view(r) for r in expected
    ]
    assert chained_answers[-1].output_text == "The sum is 3."
    # arttrace's chain sends the upstream the whole conversation: the same prompts as a replay
    assert [c.prompt_token_ids.tolist() for c in chained.calls] == [
        c.prompt_token_ids.tolist() for c in replayed.calls
    ]
    assert [c.messages for c in chained.calls] == [c.messages for c in replayed.calls]


@pytest.mark.parametrize("mode", MODES)
def test_what_cannot_be_translated_is_a_400_and_upstream_errors_reach_the_caller(
    mode, gateway, upstream
):
    server, _ = upstream

    def body(url: str) -> list[openai.APIStatusError]:
        c = client(url)
        caught = []
        for kwargs in (
            {"input": "x", "previous_response_id": "resp_unknown"},
            {"input": "x", "tools": [{"type": "web_search"}]},
            {"input": "fail"},
            {"input": "fail", "stream": True},
        ):
            with pytest.raises(openai.APIStatusError) as error:
                c.responses.create(model="policy", **kwargs)
            caught.append(error.value)
        return caught

    t, (unknown, built_in, failed, failed_stream) = in_run(mode, gateway, server, body)
    assert unknown.status_code == 400 and "'resp_unknown'" in unknown.message
    assert "evicted" in unknown.message and "ARTTRACE_TRANSLATE_CHAINS" in unknown.message
    assert built_in.status_code == 400 and "web search" in built_in.message
    for error in (failed, failed_stream):
        assert error.status_code == 500
        assert error.body["message"] == "the scripted server failed on purpose"  # type: ignore[index]
    assert [c.error is not None for c in t.calls] == [True, True]  # the upstream's, recorded


# -- the OpenAI Agents SDK's default model ----------------------------------------------------


@function_tool
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return str(a + b)


def agent_run(url: str, *, stream: bool) -> Any:
    async def go() -> Any:
        async with openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0) as c:
            config = RunConfig(model_provider=OpenAIProvider(openai_client=c), model="policy")
            agent = Agent(name="adder", instructions="Add numbers.", tools=[add])
            if stream:
                result = Runner.run_streamed(agent, "Add twice.", run_config=config)
                async for _ in result.stream_events():
                    pass
                return result.final_output
            return (await Runner.run(agent, "Add twice.", run_config=config)).final_output

    return go()


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("mode", MODES)
def test_the_agents_sdk_default_model_trains_every_turn(mode, stream, gateway, upstream, native):
    """Stock vLLM sends no logprobs for the two turns that are only function calls: through
    translation, all three train."""
    server, llm = upstream
    agents.set_trace_processors([])
    with warnings_are_errors():
        t, answer = in_run(mode, gateway, server, lambda url: agent_run(url, stream=stream))
    assert answer == asyncio.run(agent_run(native.base_url, stream=stream)) == "The sum is 4.0."
    trains_exactly(t, llm, 3)
    assert t.calls[-1].messages[-1]["role"] == "tool"
    if mode == "in-process":  # named by the Agents SDK's hook, as the shim's records are
        assert [(c.framework, c.step) for c in t.calls] == [("openai_agents", "adder")] * 3


# -- the anthropic SDK (Messages), in-process ------------------------------------------------


def anthropic_loop(url: str, *, stream: bool) -> list[anthropic.types.Message]:
    """Turns of a tool loop (two tool uses, then the sum) with the anthropic SDK at ``url``."""
    c = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="test", max_retries=0)
    tool = {"name": "add", "description": ADD["description"], "input_schema": ADD["parameters"]}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add twice."}]
    said: list[anthropic.types.Message] = []
    while not said or said[-1].stop_reason == "tool_use":
        params: dict[str, Any] = {"model": "policy", "max_tokens": 200, "tools": [tool]}
        if stream:
            with c.messages.stream(messages=messages, **params) as events:
                for _ in events:
                    pass
                said.append(events.get_final_message())
        else:
            said.append(c.messages.create(messages=messages, **params))
        content = [b.model_dump(exclude_none=True) for b in said[-1].content]
        uses = [b for b in said[-1].content if b.type == "tool_use"]
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": "3"} for u in uses]
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": results},
        ]
    c.close()
    return said


def message_view(message: anthropic.types.Message) -> tuple[Any, ...]:
    blocks = [
        (b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in message.content
    ]
    usage = (message.usage.input_tokens, message.usage.output_tokens)
    return message.role, message.stop_reason, blocks, usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_anthropic_sdk_in_process_gets_what_the_gateway_sends_and_trains(
    stream, gateway, upstream
):
    server, llm = upstream
    loop = functools.partial(anthropic_loop, stream=stream)
    with warnings_are_errors():
        t, said = in_run("in-process", gateway, server, loop, api="messages")
        trains_exactly(t, llm, 3)
        through_gateway, expected = in_run("gateway", gateway, server, loop)
        trains_exactly(through_gateway, llm, 3)
    assert [message_view(m) for m in said] == [message_view(m) for m in expected]
    assert [m.stop_reason for m in said] == ["tool_use", "tool_use", "end_turn"]
    assert said[-1].content[0].text == "The sum is 3."  # type: ignore[union-attr]


# -- per run ---------------------------------------------------------------------------------


def test_a_run_chooses_its_own_translation_in_process_and_at_the_gateway(upstream, native):
    """``trajectory(..., translate=...)`` over ``instrument()``'s choice, both ways; the
    gateway's URL of such a run translates too."""
    server, llm = upstream

    def turn(url: str) -> Any:
        return client(url).responses.create(model="policy", input="Add.", tools=[ADD])

    at.instrument()  # translates nothing
    try:
        with warnings_are_errors(), at.trajectory("q", translate="responses") as t:
            at.trainable(turn)(server.base_url)
        trains_exactly(t, llm, 1)
        with at.Gateway(server.base_url) as plain, at.trajectory("q", translate=["responses"]) as g:
            turn(plain.url(g))
        trains_exactly(g, llm, 1)
        at.instrument(translate="responses")
        asked = len(native.responses.requests)
        with warnings_are_errors(), at.trajectory("q", translate=()) as native_run:
            at.trainable(turn)(native.base_url)  # the server's own Responses API answers
    finally:
        at.uninstrument()
        _warnings.reset()
    assert len(native.responses.requests) == asked + 1
    assert [c.source for c in native_run.calls] == ["openai"]  # the shim's Responses record


# -- the pieces -------------------------------------------------------------------------------


def test_chains_are_bounded_least_recently_used_first_out():
    chains = Chains(2)
    for name in ("a", "b"):
        chains.put(name, [{"role": "user", "content": name}])
    assert chains.get("a") is not None  # now the most recently used
    chains.put("c", [])
    assert chains.get("b") is None and chains.get("a") is not None and len(chains) == 2
    with pytest.raises(TranslationError, match=r"'b' is not known.*last 2 responses"):
        ResponsesTranslation({"model": "m", "input": "x", "previous_response_id": "b"}, chains)


def test_store_false_keeps_no_chain_and_unknown_names_are_refused(gateway):
    chains = Chains(4)
    t = ResponsesTranslation({"model": "m", "input": "x", "store": False}, chains)
    t.answer({"choices": [{"message": {"role": "assistant", "content": "y"}}]})
    assert len(chains) == 0
    with pytest.raises(at.ConfigurationError, match="'responses' and 'messages'"):
        at.instrument(translate="completions")
    assert not at.is_instrumented()
    with pytest.raises(at.ConfigurationError, match="cannot translate 'chat'"):
        at.Gateway("http://127.0.0.1:1/v1", translate=["responses", "chat"])


def test_a_run_opened_over_http_chooses_translation(upstream, tmp_path):
    """``POST /runs {"translate": ["responses"]}`` on a gateway that does not translate."""
    server, _ = upstream
    with at.Gateway(server.base_url, out=tmp_path) as plain:
        opened = httpx.post(
            f"{plain.base_url}/runs", json={"example_id": "q", "translate": ["responses"]}
        ).json()
        answer = client(opened["url"]).responses.create(model="policy", input="Hi")
        shown = httpx.get(f"{plain.base_url}/runs/{opened['run_id']}").json()
        refused = httpx.post(f"{plain.base_url}/runs", json={"example_id": "q", "translate": 3})
    assert answer.output_text == "You said: Hi"
    assert shown["trainable_turns"] == 1
    assert (
        refused.status_code == 400
        and "translate" in json.loads(refused.content)["error"]["message"]
    )


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_the_upstream_cuts_ends_for_the_caller_and_is_not_trained(mode):
    """Through the gateway, the Responses stream ends with the protocol's ``error`` event; in
    process, the caller's read fails as the upstream's did. The call is kept as partial."""
    llm = KeptLLM(respond, cut_stream_after=4)
    with serve(llm) as server, at.Gateway(server.base_url, translate="responses") as gateway:

        def body(url: str) -> list[Any]:
            events: list[Any] = []
            with pytest.raises(Exception) if mode == "in-process" else contextlib.nullcontext():
                for event in client(url).responses.create(model="policy", input="Hi", stream=True):
                    events.append(event)
            return events

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", at.NothingToTrainWarning)  # the run has no turn
            t, events = in_run(mode, gateway, server, body)
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert "response.completed" not in [e.type for e in events]
    if mode == "gateway":
        assert events[-1].type == "error" and "cut" in events[-1].message
    (call,) = t.calls
    assert call.partial and t.trainable_turns == 0


def test_the_gateway_command_refuses_an_unknown_protocol_in_one_line(capsys):
    from arttrace.app.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["gateway", "--upstream", "http://127.0.0.1:1/v1", "--translate", "chat"])
    assert exited.value.code == 2
    assert "--translate: must be responses or messages or both" in capsys.readouterr().err


class SlowLLM(KeptLLM):
    """The scripted model streaming a chunk every 20 ms, counting the chunks it sent."""

    sent = 0

    def respond(self, body: dict[str, Any]) -> Any:
        status, payload, chunks = super().respond(body)
        if chunks is None:
            return status, payload, chunks

        def slowly(chunks: Iterator[bytes]) -> Iterator[bytes]:
            for chunk in chunks:
                time.sleep(0.02)
                self.sent += 1
                yield chunk

        return status, payload, slowly(chunks)


@pytest.mark.parametrize("mode", MODES)
def test_a_caller_hanging_up_a_translated_stream_closes_the_upstream_call(mode):
    llm = SlowLLM(lambda request: " ".join(f"w{i}" for i in range(60)))
    with (
        serve(llm) as server,
        at.Gateway(server.base_url, translate="responses") as gateway,
        httpx.Client() as c,  # open until the end: only closing the answer may stop the upstream
    ):

        def body(url: str) -> int:
            body = {"model": "policy", "input": "Hi", "stream": True}
            with c.stream("POST", f"{url}/responses", json=body) as answer:
                for line in answer.iter_lines():
                    if "response.output_text.delta" in line:
                        break  # the caller hangs up after the first piece of text
            return llm.sent

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", at.NothingToTrainWarning)
            t, at_hang_up = in_run(mode, gateway, server, body)
        time.sleep(0.5)  # an upstream still streaming sends 25 more chunks meanwhile
    (call,) = t.calls
    assert call.partial and t.trainable_turns == 0
    assert llm.sent - at_hang_up <= 5  # of ~120: the upstream call was closed


def test_a_gateway_with_a_token_takes_it_as_an_anthropic_key(upstream):
    server, llm = upstream
    with (
        at.Gateway(server.base_url, token="s3cret", translate="messages") as gateway,
        at.trajectory("q") as t,
    ):
        url = gateway.url(t).removesuffix("/v1")
        said = anthropic.Anthropic(base_url=url, api_key="s3cret", max_retries=0).messages.create(
            model="policy", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model="policy", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
            )
    assert said.content[0].text == "You said: Hi"  # type: ignore[union-attr]
    trains_exactly(t, llm, 1)


def test_an_unreachable_upstream_is_a_502_in_the_agents_protocol() -> None:
    """The SDK of each protocol shows its own error, and the call is marked."""
    with serve(KeptLLM([])) as dead:
        url = dead.base_url
    with (
        at.Gateway(url, translate="responses,messages") as gateway,
        at.trajectory("q-1") as t,
    ):
        base = gateway.url(t)
        with pytest.raises(openai.InternalServerError, match="could not be reached") as raised:
            openai.OpenAI(base_url=base, api_key="k", max_retries=0).responses.create(
                model="policy", input="hi"
            )
        assert raised.value.status_code == 502
        with pytest.raises(anthropic.InternalServerError, match="could not be reached") as caught:
            anthropic.Anthropic(
                base_url=base.removesuffix("/v1"), api_key="k", max_retries=0
            ).messages.create(
                model="policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert caught.value.status_code == 502
    assert [c.error is not None and "ClientConnectorError" in c.error for c in t.calls] == [
        True
    ] * 2
