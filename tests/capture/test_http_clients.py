"""The HTTP-client layer: raw httpx (sync, async), aiohttp, requests and urllib over real HTTP to
the scripted server. Every policy turn is trainable with the server's exact tokens, whole and
streamed; the caller gets the bytes it gets without arttrace; one layer records each call."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import subprocess
import sys
import threading
import urllib.request
import warnings
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests
from dspy._vendor.lm15.transports import (
    StdlibAsyncTransport,
    StdlibTransport,
)

import arttrace as at
from arttrace.capture import _warnings
from arttrace.capture._unwrap import ours
from arttrace.testing import ScriptedLLM
from support.http_clients import (
    CLIENTS,
    JSON,
    MODES,
    USER,
    Serve,
    lm15_request,
    normal,
)
from support.served import served


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("client", CLIENTS)
async def test_every_client_records_a_policy_turn_with_the_servers_exact_tokens(
    instrumented: None, server: Serve, client: str, mode: str
) -> None:
    llm = ScriptedLLM()
    url = server(llm).base_url + "/chat/completions"
    streamed = MODES[mode]

    @at.trainable(name="agent")
    async def agent() -> bytes:
        body = {"model": "policy", "messages": USER, "temperature": 0.7, "stream": streamed}
        return await CLIENTS[client](url, body, streamed)

    async with at.trajectory("client") as t:
        data = await agent()
        t.reward = 1.0
    (call,) = t.calls  # one layer recorded it, whatever the client sends through below
    assert (call.source, call.trainable, call.agent, call.streamed) == (
        "http",
        True,
        "agent",
        streamed,
    )
    assert (call.error, call.partial, call.capture_error) == (None, False, None)
    assert call.messages == USER and call.model == "policy"
    prompt, ids, logprobs = served(data, streamed)
    (choice,) = call.choices
    assert call.prompt_token_ids is not None and call.prompt_token_ids.tolist() == prompt
    assert choice.token_ids is not None and choice.token_ids.tolist() == ids
    assert choice.logprobs is not None and choice.logprobs.tolist() == logprobs
    assert choice.message == {"role": "assistant", "content": "You said: add 1 and 2"}
    assert t.trainable_turns == 1
    # asked for exact tokens (the body's length fixed to match), sampling untouched
    (sent,) = llm.requests
    assert (sent["logprobs"], sent["return_token_ids"], sent["temperature"]) == (True, True, 0.7)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("client", CLIENTS)
async def test_the_caller_reads_the_bytes_it_reads_without_arttrace(
    server: Serve, client: str, mode: str
) -> None:
    streamed = MODES[mode]
    body = {"model": "policy", "messages": USER, "stream": streamed}
    body |= {"logprobs": True, "return_token_ids": True}  # both arms send the same request

    @at.trainable
    async def agent(url: str) -> bytes:
        return await CLIENTS[client](url, body, streamed)

    async def arm() -> tuple[bytes, at.Trajectory]:
        async with at.trajectory("arm") as t:
            data = await agent(server(ScriptedLLM()).base_url + "/chat/completions")
        return data, t

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NothingToTrainWarning)
        plain, untraced = await arm()
    at.instrument()
    try:
        seen, traced = await arm()
    finally:
        at.uninstrument()
        _warnings.reset()
    assert normal(seen) == normal(plain)
    assert untraced.calls == [] and traced.trainable_turns == 1


def test_the_callers_own_choices_and_instrument_settings_are_kept(server: Serve) -> None:
    """The layer asks for exact tokens only on policy calls, only what the caller left unset,
    and not at all with ``request_training_data=False``."""
    llm = ScriptedLLM()
    url = server(llm).base_url + "/chat/completions"
    body = {"model": "policy", "messages": USER}

    @at.trainable
    def agent(**extra: Any) -> None:
        httpx.post(url, json=body | extra).raise_for_status()

    at.instrument()
    try:
        with (
            pytest.warns(at.UntrainableTurnWarning, match="no logprobs"),
            at.trajectory("own") as t,
        ):
            agent(logprobs=False)
            httpx.post(url, json=body).raise_for_status()  # outside @trainable: context
        at.instrument(request_training_data=False)
        _warnings.reset()
        with (
            pytest.warns(at.UntrainableTurnWarning, match="no logprobs"),
            at.trajectory("off") as off,
        ):
            agent()
    finally:
        at.uninstrument()
        _warnings.reset()
    own, context = llm.requests[:2]
    assert (own["logprobs"], own["return_token_ids"]) == (False, True)
    assert context == body and llm.requests[2] == body
    assert [(c.source, c.trainable) for c in t.calls] == [("http", True), ("http", False)]
    assert t.trainable_turns == 0 and off.trainable_turns == 0


CLOSERS: dict[str, Callable[[str, dict[str, Any]], Awaitable[bytes]]] = {}


def closer(name: str) -> Callable[[Any], Any]:
    def register(fn: Any) -> Any:
        CLOSERS[name] = fn
        return fn

    return register


@closer("httpx")
async def httpx_first_piece(url: str, body: dict[str, Any]) -> bytes:
    with httpx.Client() as client, client.stream("POST", url, json=body) as response:
        return next(response.iter_raw())


@closer("httpx-async")
async def httpx_async_first_piece(url: str, body: dict[str, Any]) -> bytes:
    async with httpx.AsyncClient() as client, client.stream("POST", url, json=body) as response:
        async for piece in response.aiter_raw():
            return piece
    raise AssertionError("no piece")


@closer("aiohttp")
async def aiohttp_first_line(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return await response.content.readline()


@closer("requests")
async def requests_first_piece(url: str, body: dict[str, Any]) -> bytes:
    with requests.post(url, json=body, stream=True, timeout=10) as response:
        return next(response.iter_content(chunk_size=16))


@closer("urllib")
async def urllib_first_line(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=JSON)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.readline()  # type: ignore[no-any-return]


@closer("dspy-lm15")
async def lm15_first_piece(url: str, body: dict[str, Any]) -> bytes:
    with StdlibTransport() as transport, transport.stream(lm15_request(url, body)) as response:
        return next(iter(response))


@closer("dspy-lm15-async")
async def lm15_async_first_piece(url: str, body: dict[str, Any]) -> bytes:
    transport = StdlibAsyncTransport()
    try:
        async with transport.stream(lm15_request(url, body)) as response:
            async for piece in response:
                return piece
    finally:
        await transport.aclose()
    raise AssertionError("no piece")


@pytest.mark.parametrize("client", CLOSERS)
async def test_a_stream_closed_before_its_end_is_kept_partial(
    instrumented: None, server: Serve, client: str
) -> None:
    url = server(ScriptedLLM()).base_url + "/chat/completions"

    @at.trainable
    async def agent() -> bytes:
        body = {"model": "policy", "messages": USER, "stream": True}
        return await CLOSERS[client](url, body)

    async with at.trajectory("closed") as t:
        assert (await agent()).startswith(b"data: ")
        (call,) = t.call_log.records  # ended when the caller closed, not with the run
    assert call.partial and call.error == "the caller closed the response before its end"
    assert t.trainable_turns == 0


def test_a_stream_cut_by_the_server_reaches_the_caller_and_marks_the_call(
    instrumented: None, server: Serve
) -> None:
    url = server(ScriptedLLM(cut_stream_after=3)).base_url + "/chat/completions"

    @at.trainable
    def agent() -> None:
        body = {"model": "policy", "messages": USER, "stream": True}
        with httpx.stream("POST", url, json=body) as response:
            b"".join(response.iter_bytes())

    with at.trajectory("cut") as t, pytest.raises(httpx.RemoteProtocolError):
        agent()
    (call,) = t.calls
    assert call.partial and call.error and "RemoteProtocolError" in call.error


def test_a_server_error_reaches_the_caller_and_marks_the_call(
    instrumented: None, server: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    url = server(ScriptedLLM()).base_url + "/chat/completions"

    @at.trainable
    def agent() -> requests.Response:
        return requests.post(url, data=b"{not json", headers=JSON, timeout=10)

    with (
        caplog.at_level(logging.ERROR, "arttrace"),
        pytest.warns(at.NothingToTrainWarning),
        at.trajectory("error") as t,
    ):
        response = agent()
    assert response.status_code == 400 and not caplog.records  # not arttrace's failure
    assert t.calls == []  # not a JSON body: not an LLM call this layer can read, passed on
    exhausted = server(ScriptedLLM([])).base_url + "/chat/completions"
    with at.trajectory("error") as t:
        answer = httpx.post(exhausted, json={"model": "policy", "messages": USER})
    (call,) = t.calls
    assert answer.status_code == 500
    assert call.error and "answered 500" in call.error and "no reply left" in call.error


def test_the_openai_sdk_is_recorded_once_by_its_shim(
    instrumented: None, clients: Callable[..., tuple[openai.OpenAI, openai.AsyncOpenAI]]
) -> None:
    client, _ = clients(ScriptedLLM())

    @at.trainable
    def agent() -> None:
        client.chat.completions.create(model="policy", messages=USER)  # type: ignore[arg-type]
        stream = client.chat.completions.create(
            model="policy",
            messages=USER,  # type: ignore[arg-type]
            stream=True,
        )
        list(stream)
        client.completions.create(model="policy", prompt="2+2=")  # not shimmed: this layer

    with (
        pytest.warns(at.UntrainableTurnWarning, match="Completions API"),
        at.trajectory("sdk") as t,
    ):
        agent()
    assert [(c.source, c.streamed) for c in t.calls] == [
        ("openai", False),
        ("openai", True),
        ("http", False),
    ]
    assert t.trainable_turns == 2


def test_completions_are_kept_as_context_with_one_warning(
    instrumented: None, server: Serve
) -> None:
    """ART trains chat conversations: a legacy Completions call is context, with one warning."""
    served_by = server(ScriptedLLM())
    url = served_by.base_url + "/completions"

    @at.trainable
    def agent(stream: bool) -> bytes:
        body = {"model": "policy", "prompt": "1+2=", "stream": stream}
        with httpx.stream("POST", url, json=body) as response:
            return b"".join(response.iter_bytes())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("completions") as t:
            whole = json.loads(agent(False))
            agent(True)
    untrainable = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(untrainable) == 1 and "Chat Completions" in str(untrainable[0].message)
    assert [(c.source, c.trainable, c.streamed) for c in t.calls] == [
        ("http", False, False),
        ("http", False, True),
    ]
    text = whole["choices"][0]["text"]
    assert [c.choices[0].message["content"] for c in t.calls] == [text, text]
    assert t.calls[0].messages == [{"role": "user", "content": "1+2="}]
    assert "logprobs" not in served_by.completions.requests[0]  # it cannot be trained anyway


def test_responses_calls_are_recorded_by_this_layer(instrumented: None, server: Serve) -> None:
    url = server(ScriptedLLM()).base_url + "/responses"
    with at.trajectory("responses") as t:
        httpx.post(url, json={"model": "policy", "input": "hi"}).raise_for_status()
    (call,) = t.calls
    assert (call.source, call.model) == ("http", "policy")
    assert call.messages[-1]["content"] == "hi"


def test_other_requests_pass_untouched(instrumented: None, server: Serve) -> None:
    base = server(ScriptedLLM()).base_url
    with at.trajectory("other") as t:
        assert httpx.get(f"{base}/models").status_code == 200
        requests.post(f"{base}/embeddings", json={"model": "e", "input": "x"}, timeout=10)
    assert t.calls == []
    # outside any run (and no tracer provider of the user's): nothing is recorded or asked
    llm = ScriptedLLM()
    httpx.post(server(llm).base_url + "/chat/completions", json={"model": "p", "messages": USER})
    assert llm.requests == [{"model": "p", "messages": USER}]


# -- threads ---------------------------------------------------------------------------------


def post(url: str, text: str) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": text}]}
    httpx.post(url, json=body).raise_for_status()


async def test_calls_from_worker_threads_land_in_the_run(instrumented: None, server: Serve) -> None:
    url = server(ScriptedLLM()).base_url + "/chat/completions"
    loop = asyncio.get_running_loop()

    @at.trainable(name="agent")
    async def agent() -> None:
        thread = threading.Thread(target=post, args=(url, "thread"))
        thread.start()
        thread.join()
        with ThreadPoolExecutor(2) as pool:
            pool.submit(post, url, "pool").result()
        await loop.run_in_executor(None, post, url, "executor")

    async with at.trajectory("threads") as t:
        await agent()
    assert sorted(c.messages[-1]["content"] for c in t.calls) == ["executor", "pool", "thread"]
    assert {(c.source, c.trainable, c.agent) for c in t.calls} == {("http", True, "agent")}
    assert t.trainable_turns == 3


def test_a_thread_started_outside_any_run_records_nothing(
    instrumented: None, server: Serve
) -> None:
    """A thread started before the run posts while the run is open: not the run's call."""
    llm = ScriptedLLM()
    url = server(llm).base_url + "/chat/completions"
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        go.wait(10)
        post(url, "outside")
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()

    @at.trainable
    def agent() -> None:
        go.set()
        done.wait(10)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NothingToTrainWarning)
        with at.trajectory("run") as t:
            agent()
    thread.join()
    assert done.is_set() and t.calls == []
    assert "logprobs" not in llm.requests[0]


# -- installing and removing ---------------------------------------------------------------


def test_instrument_imports_no_http_client_and_hooks_each_when_imported() -> None:
    code = (
        "import sys, arttrace\n"
        "arttrace.instrument()\n"
        "print(sorted(m for m in ('httpx', 'aiohttp', 'requests', 'openai', 'urllib3',\n"
        "    'dspy') if m in sys.modules))\n"
        "import httpx, requests, aiohttp, http.client\n"
        "from arttrace.capture._unwrap import ours\n"
        "print(ours(httpx.Client.__dict__['send']), ours(httpx.AsyncClient.__dict__['send']),\n"
        "    ours(requests.Session.__dict__['send']),\n"
        "    ours(aiohttp.ClientSession.__dict__['_request']),\n"
        "    ours(http.client.HTTPConnection.__dict__['request']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == ["[]", "True True True True True"]


def test_uninstrument_removes_every_hook(server: Serve) -> None:
    import http.client

    hooked = (
        (httpx.Client, "send"),
        (httpx.AsyncClient, "send"),
        (requests.Session, "send"),
        (aiohttp.ClientSession, "_request"),
        (http.client.HTTPConnection, "request"),
        (http.client.HTTPConnection, "getresponse"),
    )
    at.instrument()
    assert all(ours(owner.__dict__[name]) for owner, name in hooked)
    at.uninstrument()
    assert not any(ours(owner.__dict__[name]) for owner, name in hooked)
    llm = ScriptedLLM()
    url = server(llm).base_url + "/chat/completions"

    @at.trainable
    def agent() -> None:
        post(url, "off")

    with pytest.warns(at.NothingToTrainWarning), at.trajectory("off") as t:
        agent()
    _warnings.reset()
    assert t.calls == [] and "logprobs" not in llm.requests[0]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_compressed_answer_is_read_as_the_caller_reads_it(
    instrumented: None, respx_mock: Any, streamed: bool
) -> None:
    """httpx hands a stream's raw bytes to the tap: a gzip body is decoded on the side."""
    llm = ScriptedLLM()
    body = {"model": "policy", "messages": USER, "stream": streamed}
    sent = body | {"logprobs": True, "return_token_ids": True}  # what the layer will send
    answer = llm.handle(httpx.Request("POST", "http://llm.test/v1/chat/completions", json=sent))
    data = answer.read()
    headers = {"content-type": answer.headers["content-type"], "content-encoding": "gzip"}
    respx_mock.post("http://llm.test/v1/chat/completions").mock(
        return_value=httpx.Response(200, headers=headers, content=gzip.compress(data))
    )

    @at.trainable
    def agent() -> bytes:
        with httpx.stream("POST", "http://llm.test/v1/chat/completions", json=body) as response:
            return b"".join(response.iter_bytes())

    with at.trajectory("gzip") as t:
        assert agent() == data
    (call,) = t.calls
    assert call.capture_error is None and t.trainable_turns == 1
    assert call.choices[0].token_ids is not None
    assert call.choices[0].token_ids.tolist() == served(data, streamed)[1]


def test_arts_own_capture_and_this_layer_each_see_a_raw_call_once(
    instrumented: None, server: Serve
) -> None:
    """ART's capture (``with art.Trajectory()``) patches httpx's send and response reads
    around arttrace's hook: both still see each call once, and the caller's bytes are whole."""
    import art

    url = server(ScriptedLLM()).base_url + "/chat/completions"

    @at.trainable
    def agent() -> bytes:
        body = {"model": "policy", "messages": USER}
        whole = httpx.post(url, json=body).content
        with httpx.stream("POST", url, json=body | {"stream": True}) as response:
            return whole + b"".join(response.iter_bytes())

    with art.Trajectory() as scope, at.trajectory("art") as t:
        data = agent()
    assert data.startswith(b"{") and data.endswith(b"data: [DONE]\n\n")
    assert [(c.source, c.streamed) for c in t.calls] == [("http", False), ("http", True)]
    assert t.trainable_turns == 2
    assert len(scope.exchanges.chat_completions) == 2


class UrllibTransport(httpx.BaseTransport):
    """An httpx transport that sends with ``urllib`` (``http.client``): two hooked clients,
    one inside the other, as LiteLLM's httpx client sends through aiohttp."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = urllib.request.Request(
            str(request.url), data=request.read(), headers=dict(request.headers), method="POST"
        )
        with urllib.request.urlopen(sent, timeout=10) as answer:
            return httpx.Response(
                answer.status, headers=answer.headers.items(), content=answer.read()
            )


def test_a_client_sending_through_another_is_recorded_once_by_the_outer(
    instrumented: None, server: Serve
) -> None:
    llm = ScriptedLLM()
    url = server(llm).base_url + "/chat/completions"

    @at.trainable
    def agent() -> None:
        with httpx.Client(transport=UrllibTransport()) as client:
            client.post(url, json={"model": "policy", "messages": USER}).raise_for_status()

    with at.trajectory("nested") as t:
        agent()
    (call,) = t.calls
    assert call.source == "http" and t.trainable_turns == 1
    (sent,) = llm.requests
    assert (sent["logprobs"], sent["return_token_ids"]) == (True, True)
