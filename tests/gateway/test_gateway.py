"""The gateway with a plain httpx client: what the caller gets is the upstream's bytes, and
what the run records is what an in-process call would have recorded."""

from __future__ import annotations

import contextvars
import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import arttrace as at
from arttrace.capture import _warnings
from arttrace.gateway import Gateway
from arttrace.integrations._core import FrameworkCall, choice_record
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve
from support.common import TOOLS
from support.gateway import RecordingUpstream, raw_request

JSON = {"Content-Type": "application/json"}


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    yield
    _warnings.reset()


@contextmanager
def gateway_to(upstream: RecordingUpstream, **options: Any) -> Iterator[Gateway]:
    """``upstream`` served, and a gateway in front of it."""
    with upstream, Gateway(upstream.base_url, **options) as gateway:
        yield gateway


def calculator() -> ScriptedLLM:
    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        return Reply("Let me add.", tool_calls=[ToolCall("add", {"a": 2, "b": 3})])

    return ScriptedLLM(respond)


def sse_json(data: bytes) -> list[dict[str, Any]]:
    events = [e.removeprefix(b"data: ") for e in data.split(b"\n\n") if e.strip()]
    return [json.loads(e) for e in events if e != b"[DONE]"]


def run_calculator(client: httpx.Client, url: str, *, stream: bool) -> list[bytes]:
    """Two turns (a tool call, then the answer); returns the bytes the caller got."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    got = []
    for _ in range(2):
        body = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.7}
        if stream:
            with client.stream(
                "POST", f"{url}/chat/completions", json={**body, "stream": True}
            ) as r:
                assert r.status_code == 200
                data = b"".join(r.iter_raw())
            chunks = sse_json(data)
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or ()]
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                args = "".join(tc["function"].get("arguments") or "" for tc in calls)
                message["tool_calls"] = [
                    {
                        "id": calls[0]["id"],
                        "type": "function",
                        "function": {"name": calls[0]["function"]["name"], "arguments": args},
                    }
                ]
        else:
            r = client.post(f"{url}/chat/completions", json=body)
            assert r.status_code == 200
            data = r.content
            message = json.loads(data)["choices"][0]["message"]
        got.append(data)
        messages.append(message)
        for call in message.get("tool_calls") or ():
            args = json.loads(call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])}
            )
    return got


def upstream_tokens(exchange: Any) -> tuple[list[int], list[int], list[float]]:
    """Prompt ids, sampled ids and logprobs as the upstream sent them."""
    if exchange.body.get("stream"):
        chunks = sse_json(exchange.answered)
        prompt = next(c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c)
        ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or ()]
        logprobs = [
            t["logprob"]
            for c in chunks
            for ch in c["choices"]
            for t in (ch.get("logprobs") or {}).get("content") or ()
        ]
        return prompt, ids, logprobs
    whole = json.loads(exchange.answered)
    choice = whole["choices"][0]
    return (
        whole["prompt_token_ids"],
        choice["token_ids"],
        [t["logprob"] for t in choice["logprobs"]["content"]],
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_httpx_agent_trains_through_the_gateway(stream: bool) -> None:
    upstream = RecordingUpstream(calculator())
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        got = run_calculator(client, gateway.url(t), stream=stream)
        t.reward = 1.0

    # the caller's bytes are the upstream's bytes
    assert got == [e.answered for e in upstream.exchanges]
    # every call a trainable policy turn with the server's exact tokens, in order
    assert [c.trainable for c in t.calls] == [True, True]
    assert t.trainable_turns == 2
    for call, exchange in zip(t.calls, upstream.exchanges, strict=True):
        prompt, ids, logprobs = upstream_tokens(exchange)
        assert call.prompt_token_ids is not None and call.prompt_token_ids.tolist() == prompt
        choice = call.choices[0]
        assert choice.token_ids is not None and choice.token_ids.tolist() == ids
        assert choice.logprobs is not None and choice.logprobs.tolist() == logprobs
        assert call.untrainable_reason(choice) is None
        assert call.streamed is stream and call.agent == "gateway"
    (conversation,) = t.conversations()
    roles = [
        item["role"] if isinstance(item, dict) else "assistant (turn)"
        for item in conversation.items
    ]
    assert roles == ["user", "assistant (turn)", "tool", "assistant (turn)"]
    first_turn = conversation.items[1]
    assert not isinstance(first_turn, dict)
    assert first_turn.choice.message["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2, "b": 3}',
    }
    assert conversation.tools == TOOLS


def test_exact_tokens_are_asked_for_without_touching_sampling() -> None:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 17,
        "seed": 5,
    }
    upstream = RecordingUpstream()
    with gateway_to(upstream) as gateway, httpx.Client() as client:
        with at.trajectory("q-1") as t:
            client.post(f"{gateway.url(t)}/chat/completions", json=body)
            # the caller decided: kept as the caller said (and the turn is not trainable)
            with pytest.warns(at.UntrainableTurnWarning, match="no logprobs"):
                client.post(
                    f"{gateway.url(t)}/chat/completions",
                    json={**body, "logprobs": False, "return_token_ids": False},
                )
        # each run says so of its own turns
        with at.trajectory("q-2") as t2, pytest.warns(at.UntrainableTurnWarning, match="q-2"):
            url = gateway.url(t2, request_training_data=False)
            raw = json.dumps(body, indent=1).encode()
            json_body = {"Content-Type": "application/json"}
            client.post(f"{url}/chat/completions", content=raw, headers=json_body)

    asked, kept, untouched = (e.body for e in upstream.exchanges)
    assert asked == {**body, "logprobs": True, "return_token_ids": True}
    assert kept == {**body, "logprobs": False, "return_token_ids": False}
    assert untouched == body
    assert t.trainable_turns == 1
    assert t.calls[1].untrainable_reason(t.calls[1].choices[0]) == "no logprobs"
    assert t2.calls[0].trainable and t2.trainable_turns == 0


def test_the_callers_headers_reach_the_upstream_as_sent() -> None:
    upstream = RecordingUpstream()
    sent = {"user-agent": "my-agent/1.0", "x-trace": "abc", "content-type": "application/json"}
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        # curl sends Expect: 100-continue with a large body; the gateway has read it already
        expect = {"expect": "100-continue"}
        client.post(f"{gateway.url(t)}/chat/completions", json=body, headers={**sent, **expect})
    (exchange,) = upstream.exchanges
    assert {k: exchange.headers[k] for k in sent} == sent  # nothing of the gateway's own client
    assert exchange.headers["accept-encoding"] == "identity"
    assert "expect" not in exchange.headers  # no wait for the upstream's 100 Continue


def test_the_gateways_upstream_calls_are_not_recorded_again_by_the_http_client_layer(
    instrumented: None,
) -> None:
    # instrument() hooks aiohttp, which the gateway calls the upstream with. The calls are made
    # from a context outside the trajectory, as an agent in another process makes them.
    upstream = RecordingUpstream()
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        url = f"{gateway.url(t)}/chat/completions"
        outside = contextvars.Context()
        outside.run(client.post, url, json=body)
        outside.run(client.post, url, json={**body, "stream": True})
    assert [c.streamed for c in t.calls] == [False, True]
    assert t.trainable_turns == 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_to_the_gateway_from_inside_the_run_is_recorded_once(
    instrumented: None, stream: bool
) -> None:
    # An agent in this process, inside the run and its @trainable code, with instrument() on:
    # the HTTP-client layer sees the call to the gateway and leaves it to the gateway.
    upstream = RecordingUpstream(calculator())
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        got = at.trainable(run_calculator)(client, gateway.url(t), stream=stream)
        t.reward = 1.0
    assert got == [e.answered for e in upstream.exchanges]
    assert [(c.source, c.agent, c.trainable) for c in t.calls] == [("gateway", "gateway", True)] * 2
    assert t.trainable_turns == 2


def test_an_openai_sdk_call_to_the_gateway_from_inside_the_run_is_recorded_once(
    instrumented: None,
) -> None:
    """The shim stands aside for a gateway of this process, as the HTTP layer does."""
    upstream = RecordingUpstream()
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t:
        client = openai.OpenAI(base_url=gateway.url(t), api_key="sk-test", max_retries=0)

        @at.trainable
        def agent() -> None:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}]
            )

        agent()
    assert [(c.source, c.trainable) for c in t.calls] == [("gateway", True)]


def test_a_frameworks_call_through_the_gateway_is_kept_once_and_says_gateway(
    spans: InMemorySpanExporter,
) -> None:
    """A framework's hook and the gateway both see a call to a run's URL: one record, the
    gateway's tokens and the framework's names; its span is an OpenAI-protocol ``chat``."""
    upstream = RecordingUpstream()
    messages = [{"role": "user", "content": "hi"}]
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        seen = FrameworkCall("someframework", "policy", messages, step="planner")
        body = {"model": "policy", "messages": messages}
        answer = client.post(f"{gateway.url(t)}/chat/completions", json=body).json()
        seen.finish([choice_record(answer["choices"][0]["message"], finish_reason="stop")])
        t.reward = 1.0
    (call,) = t.calls
    assert (call.source, call.framework, call.step) == ("gateway", "someframework", "planner")
    assert call.trainable and call.choices[0].token_ids is not None
    assert at.Trajectory.from_dict(t.to_dict()).calls[0].source == "gateway"
    attributes = [
        dict(s.attributes or {})
        for s in spans.get_finished_spans()
        if (s.attributes or {}).get("arttrace.agent") == "gateway"
    ]
    assert [(a["gen_ai.provider.name"], "arttrace.framework" in a) for a in attributes] == [
        ("openai", False)
    ]


def test_only_the_runs_policy_model_is_trained() -> None:
    upstream = RecordingUpstream()
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        url = gateway.url(t, model="policy", agent="solver")
        for model in ("policy", "judge"):
            client.post(
                f"{url}/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            )
    assert [(c.model, c.trainable, c.agent) for c in t.calls] == [
        ("policy", True, "solver"),
        ("judge", False, None),
    ]
    assert "logprobs" not in upstream.exchanges[1].body  # a context call is left as sent


def test_unknown_and_ended_runs_get_404_with_a_clear_message() -> None:
    with RecordingUpstream() as upstream, Gateway(upstream.base_url) as gateway:
        never_called = pytest.warns(at.NothingToTrainWarning, match="no call reached its gateway")
        with never_called, at.trajectory("q-1") as t:
            url = gateway.url(t)
            assert gateway.url(t) == url  # one run per trajectory
        with httpx.Client() as client:
            ended = client.post(f"{url}/chat/completions", json={})
            unknown = client.post(f"{gateway.base_url}/runs/nope/v1/chat/completions", json={})
            nowhere = client.get(f"{gateway.base_url}/v1/models")
    for response in (ended, unknown):
        assert response.status_code == 404
        assert "no open run" in response.json()["error"]["message"]
    assert nowhere.status_code == 404
    assert "/runs/<run_id>/v1" in nowhere.json()["error"]["message"]
    assert upstream.exchanges == []
    with pytest.raises(at.ArttraceError, match="has ended"):
        gateway_after = Gateway(upstream.base_url)
        with gateway_after:
            gateway_after.url(t)


def test_models_and_other_routes_pass_through() -> None:
    upstream = RecordingUpstream()
    with (
        gateway_to(upstream) as gateway,
        # The run's agent called its URL (so not "no call reached"), but nothing to train on.
        pytest.warns(at.NothingToTrainWarning, match="its gateway calls recorded no policy turn"),
        at.trajectory("q-1") as t,
        httpx.Client() as client,
    ):
        response = client.get(f"{gateway.url(t)}/models?limit=5")
    assert response.json() == {"object": "list", "data": [{"id": "m"}]}
    assert response.headers["x-upstream"] == "yes"
    assert upstream.exchanges[0].path == "/v1/models"
    assert t.calls == []


def test_calls_stay_under_the_upstreams_own_path_prefix() -> None:
    """An upstream behind a path (``/proxy/v1``): a run's calls reach only what is under it."""
    upstream = RecordingUpstream()
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
    prefixed = upstream.base_url.replace("/v1", "/proxy/v1")
    with upstream, Gateway(prefixed) as gateway, at.trajectory("q-1") as t:
        run = gateway.url(t).removeprefix(gateway.base_url)
        answers = [
            raw_request(gateway.base_url, "POST", f"{run}/{tail}", JSON, body.encode())[0]
            for tail in ("%2e%2e/%2e%2e/admin", "..%2f..%2fadmin", "chat/completions")
        ]
    assert answers == [400, 400, 200]
    assert [e.path for e in upstream.exchanges] == ["/proxy/v1/chat/completions"]


def test_responses_calls_are_forwarded_byte_for_byte_and_recorded() -> None:
    body = {"model": "policy", "input": "Say hello", "instructions": "Be brief."}
    upstream = RecordingUpstream()  # a minimal Responses API: no tokens, so not trainable
    with (
        gateway_to(upstream) as gateway,
        at.trajectory("q-1") as t,
        httpx.Client() as client,
        pytest.warns(at.UntrainableTurnWarning),
    ):
        response = client.post(f"{gateway.url(t)}/responses", json=body)
    assert response.content == upstream.exchanges[0].answered
    assert upstream.exchanges[0].body["include"] == ["message.output_text.logprobs"]
    (call,) = t.calls
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]
    assert call.choices[0].message == {"role": "assistant", "content": "Hello from Responses"}


def test_an_upstream_error_reaches_the_caller_unchanged_and_marks_the_call() -> None:
    def fail(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 503, {"error": {"message": "the engine is overloaded", "type": "overloaded"}}

    upstream = RecordingUpstream(fail=fail)
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        response = client.post(
            f"{gateway.url(t)}/chat/completions",
            json={"model": "policy", "messages": [], "stream": True},
        )
    assert response.status_code == 503
    assert response.content == upstream.exchanges[0].answered
    assert response.headers["x-upstream"] == "yes"
    (call,) = t.calls
    assert call.error is not None and "503" in call.error and "overloaded" in call.error
    assert t.trainable_turns == 0


def test_an_unreachable_upstream_is_a_502_and_marks_the_call() -> None:
    with RecordingUpstream() as dead:
        url = dead.base_url
    with Gateway(url) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        response = client.post(
            f"{gateway.url(t)}/chat/completions", json={"model": "policy", "messages": []}
        )
    assert response.status_code == 502
    assert "could not be reached" in response.json()["error"]["message"]
    (call,) = t.calls
    assert call.error is not None and "ClientConnectorError" in call.error


def test_an_upstream_silent_beyond_the_timeout_is_cut_and_marks_the_call_partial() -> None:
    upstream = RecordingUpstream(ScriptedLLM(["one two three"]), delay=1.5)  # 1.5 s per chunk
    with (
        gateway_to(upstream, timeout=0.3) as gateway,
        at.trajectory("q-1") as t,
        httpx.Client() as client,
    ):
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        got = b""
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream("POST", f"{gateway.url(t)}/chat/completions", json=body) as response,
        ):
            for piece in response.iter_raw():
                got += piece
    assert got == upstream.exchanges[0].answer[0]  # the first chunk, then the cut
    (call,) = t.calls
    assert call.partial and call.error is not None and "Timeout" in call.error


def test_a_stream_the_upstream_cuts_is_cut_for_the_caller_and_marked_partial() -> None:
    llm = ScriptedLLM(["one two three four five"], cut_stream_after=4)
    upstream = RecordingUpstream(llm)
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        got = b""
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream(
                "POST", f"{gateway.url(t)}/chat/completions", json={**body, "stream": True}
            ) as response,
        ):
            for piece in response.iter_raw():
                got += piece
    assert got == upstream.exchanges[0].answered  # everything the upstream sent, then the cut
    (call,) = t.calls
    assert call.partial and call.error is not None
    assert call.untrainable_reason(call.choices[0]) == "the response was incomplete"


def test_a_caller_that_hangs_up_mid_stream_closes_the_upstream_call() -> None:
    llm = ScriptedLLM([" ".join(["word"] * 100)])
    upstream = RecordingUpstream(llm, delay=0.02)
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        with client.stream(
            "POST", f"{gateway.url(t)}/chat/completions", json={**body, "stream": True}
        ) as response:
            pieces = response.iter_raw()
            next(pieces)
            next(pieces)
        # the hang-up reaches the upstream: it stops sending long before its 200 chunks
        exchange = upstream.exchanges[0]
        assert exchange.hung_up is not None
        for _ in range(200):
            if t.call_log.in_flight == 0 and exchange.hung_up.is_set():
                break
            time.sleep(0.01)
        assert exchange.hung_up.is_set()
    (call,) = t.calls
    assert call.partial and call.error == "the caller disconnected before the response ended"
    assert len(exchange.answer) < 100


def test_a_caller_that_stops_at_the_finish_reason_leaves_a_whole_record() -> None:
    """As LiteLLM's sync stream does: the run may end the moment the caller has the finish."""
    upstream = RecordingUpstream(ScriptedLLM(lambda _: " ".join(["word"] * 30)), delay=0.002)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with gateway_to(upstream) as gateway, httpx.Client() as client:
        for _ in range(5):
            with at.trajectory("q-1") as t:
                got = b""
                with client.stream("POST", f"{gateway.url(t)}/chat/completions", json=body) as r:
                    for piece in r.iter_raw():
                        got += piece
                        if b'"finish_reason": "stop"' in got:
                            break  # and the run ends at once
            (call,) = t.calls
            assert not call.partial and call.choices[0].finish_reason == "stop"
            assert t.trainable_turns == 1


def test_a_caller_that_hangs_up_before_the_answer_starts_marks_the_call() -> None:
    upstream = RecordingUpstream(think=1.0)
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t:
        with httpx.Client(timeout=0.2) as client, pytest.raises(httpx.ReadTimeout):
            body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
            client.post(f"{gateway.url(t)}/chat/completions", json={**body, "stream": True})
        for _ in range(100):
            if t.call_log.in_flight == 0:
                break
            time.sleep(0.01)
    (call,) = t.calls
    assert call.partial and call.error == "the caller disconnected before the response ended"


def test_other_methods_on_a_runs_api_are_refused() -> None:
    with (
        gateway_to(RecordingUpstream()) as gateway,
        pytest.warns(at.NothingToTrainWarning, match="no call reached its gateway URL"),
        at.trajectory("q-1") as t,
    ):
        response = httpx.request("OPTIONS", f"{gateway.url(t)}/chat/completions")
    assert response.status_code == 405
    assert "OPTIONS is not relayed" in response.json()["error"]["message"]


def test_a_run_whose_agent_never_calls_its_url_says_so_with_the_fix() -> None:
    with (
        gateway_to(RecordingUpstream()) as gateway,
        pytest.warns(at.NothingToTrainWarning) as caught,
        at.trajectory("q-1") as t,
    ):
        gateway.url(t)  # handed to an agent that calls somewhere else
    (warning,) = [w for w in caught if w.category is at.NothingToTrainWarning]
    message = str(warning.message)
    assert "run 'q-1' has a gateway URL but recorded no policy turn" in message
    assert "(no call reached its gateway URL)" in message and "gateway.url(t)" in message


def test_anthropic_messages_are_forwarded_and_said_to_be_unrecorded() -> None:
    upstream = RecordingUpstream()
    body = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with (
        gateway_to(upstream) as gateway,
        pytest.warns((at.UntrainableTurnWarning, at.NothingToTrainWarning)) as caught,
        at.trajectory("q-1") as t,
        httpx.Client() as client,
    ):
        for _ in range(2):
            answer = client.post(f"{gateway.url(t)}/messages", json=body)
            assert answer.content == upstream.exchanges[-1].answered
    assert [e.path for e in upstream.exchanges] == ["/v1/messages"] * 2
    assert t.calls == []
    (unrecorded,) = [w for w in caught if w.category is at.UntrainableTurnWarning]
    assert "run 'q-1' called the Anthropic Messages API (/v1/messages)" in str(unrecorded.message)
    (nothing,) = [w for w in caught if w.category is at.NothingToTrainWarning]
    assert "its gateway calls recorded no policy turn" in str(nothing.message)
    assert "Anthropic Messages calls (/v1/messages)" in str(nothing.message)


def test_legacy_completions_are_recorded_as_context() -> None:
    upstream = serve(ScriptedLLM(["Paris."]))
    try:
        with (
            Gateway(upstream.base_url) as gateway,
            pytest.warns((at.UntrainableTurnWarning, at.NothingToTrainWarning)) as caught,
            at.trajectory("q-1") as t,
            httpx.Client() as client,
        ):
            body = {"model": "policy", "prompt": "The capital of France is", "max_tokens": 4}
            answer = client.post(f"{gateway.url(t)}/completions", json=body)
            assert answer.status_code == 200
    finally:
        upstream.stop()
    (call,) = t.calls
    assert not call.trainable and call.choices[0].message["content"] == "Paris."
    causes = {str(w.message) for w in caught}
    assert any("ART trains chat conversations" in m for m in causes)  # the call's warning
    assert any("recorded no policy turn (its gateway calls recorded no" in m for m in causes)


def test_the_gateways_token_and_the_callers_key() -> None:
    with (
        RecordingUpstream() as upstream,
        Gateway(
            upstream.base_url, token="gw-token-123", upstream_api_key="sk-upstream-456"
        ) as gateway,
        at.trajectory("q-1") as t,
        httpx.Client() as client,
    ):
        url = f"{gateway.url(t)}/chat/completions"
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        refused = client.post(url, json=body)
        wrong = client.post(url, json=body, headers={"Authorization": "Bearer nope"})
        as_api_key = client.post(url, json=body, headers={"Authorization": "Bearer gw-token-123"})
        beside = client.post(
            url,
            json=body,
            headers={"X-Arttrace-Token": "gw-token-123", "Authorization": "Bearer sk-caller-789"},
        )
    assert refused.status_code == wrong.status_code == 401
    assert "X-Arttrace-Token" in refused.json()["error"]["message"] or "token" in refused.text
    assert as_api_key.status_code == beside.status_code == 200
    first, second = upstream.exchanges
    assert first.headers["authorization"] == "Bearer sk-upstream-456"
    assert second.headers["authorization"] == "Bearer sk-caller-789"
    assert "x-arttrace-token" not in second.headers


def test_one_runs_cookies_never_reach_another_runs_calls() -> None:
    """An upstream's ``Set-Cookie`` (a load balancer's sticky session) reaches its caller and
    goes no further: the gateway forwards for many callers, so it keeps no cookie jar."""
    upstream = RecordingUpstream(set_cookie="lb=node-7; Path=/")
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    with upstream:
        named = upstream.base_url.replace("127.0.0.1", "localhost")  # a jar keeps a host's
        with Gateway(named) as gateway, httpx.Client() as client:
            answers = []
            for example_id in ("q-1", "q-2"):
                with at.trajectory(example_id) as t:
                    answers.append(client.post(f"{gateway.url(t)}/chat/completions", json=body))
                    client.cookies.clear()  # the first caller's jar is its own business
    assert [a.headers.get("set-cookie") for a in answers] == ["lb=node-7; Path=/"] * 2
    assert [e.headers.get("cookie") for e in upstream.exchanges] == [None, None]


def test_keys_are_never_recorded_logged_or_exported(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-live-0123456789abcdef"

    def echo_key(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("stream"):
            return 401, {"error": {"message": f"Incorrect API key: {headers['authorization']}"}}
        return None  # type: ignore[return-value]

    caplog.set_level(logging.DEBUG)
    upstream = RecordingUpstream(fail=echo_key)
    with gateway_to(upstream) as gateway, at.trajectory("q-1") as t, httpx.Client() as client:
        url = f"{gateway.url(t)}/chat/completions"
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        ok = client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
        refused = client.post(
            url, json={**body, "stream": True}, headers={"Authorization": f"Bearer {key}"}
        )
    assert ok.status_code == 200 and refused.status_code == 401
    assert key in refused.text  # the caller gets the upstream's answer unchanged
    assert all(e.headers["authorization"] == f"Bearer {key}" for e in upstream.exchanges)
    recorded = json.dumps(t.to_dict())
    assert t.calls[1].error is not None and "Incorrect API key" in t.calls[1].error
    assert key not in recorded
    assert key not in caplog.text
    exported = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    exported += json.dumps(
        [[dict(e.attributes or {}) for e in s.events] for s in spans.get_finished_spans()]
    )
    assert spans.get_finished_spans() and key not in exported


def test_gateway_lifecycle_errors() -> None:
    gateway = Gateway("http://127.0.0.1:9/v1")
    with pytest.raises(at.ArttraceError, match="not serving"):
        gateway.url(at.trajectory("q"))
    with gateway, pytest.raises(at.ArttraceError, match="twice"):
        gateway.start()
    with pytest.raises(at.ArttraceError, match="restart"):
        gateway.start()
    with pytest.raises(ValueError, match="OpenAI base URL"):
        Gateway("127.0.0.1:8000")


async def test_async_context_manager_and_calls_from_the_event_loop() -> None:
    with RecordingUpstream() as upstream:
        async with (
            Gateway(upstream.base_url) as gateway,
            httpx.AsyncClient() as client,
            at.trajectory("q-1") as t,
        ):
            response = await client.post(
                f"{gateway.url(at.current_trajectory())}/chat/completions",
                json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            )
    assert response.status_code == 200
    assert t.trainable_turns == 1


def test_an_answer_arttrace_cannot_read_reaches_the_caller_and_marks_the_call() -> None:
    def odd(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"id": "x", "choices": "not a list"}

    upstream = RecordingUpstream(fail=odd)
    with (
        gateway_to(upstream) as gateway,
        at.trajectory("q-1") as t,
        httpx.Client() as client,
        pytest.warns(at.UntrainableTurnWarning, match="could not read"),
    ):
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        response = client.post(f"{gateway.url(t)}/chat/completions", json=body)
    assert response.status_code == 200
    assert response.content == upstream.exchanges[0].answered
    (call,) = t.calls
    assert call.capture_error is not None and t.trainable_turns == 0


def test_a_caller_hanging_up_mid_body_is_quiet_and_reaches_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A caller that sends half its body and hangs up: nothing is forwarded, no traceback is
    logged, and the gateway goes on serving the run."""
    with (
        RecordingUpstream() as upstream,
        Gateway(upstream.base_url) as gateway,
        caplog.at_level(logging.ERROR),
        at.trajectory("q-1") as t,
    ):
        url = gateway.url(t)
        host, port = gateway.base_url.removeprefix("http://").rsplit(":", 1)
        path = url.removeprefix(gateway.base_url) + "/chat/completions"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(head.encode() + b'{"model": "pol')
        time.sleep(0.3)  # the gateway reads the cut body
        with httpx.Client() as client:
            after = client.post(f"{url}/chat/completions", json=CHAT_BODY)
        t.reward = 1.0
    assert after.status_code == 200
    assert len(upstream.exchanges) == 1  # only the whole call
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


CHAT_BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
