"""Capture never changes what the caller sees: not for a response shape the SDK lets through and
arttrace cannot read, not for a failure injected into any of arttrace's own capture steps, not
when warnings are turned into errors. The caller's result is compared with the one the same call
gives without arttrace, through the real OpenAI SDK."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import warnings
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pydantic
import pytest

import arttrace as at
from arttrace.capture import _calls, _chat, _context, _guard, _trainable, _trajectory, _warnings
from arttrace.capture._calls import CallLog, OpenCall
from arttrace.capture._chat import Capture, _StreamedChoice
from arttrace.capture._records import UNREADABLE
from arttrace.testing import Reply, ScriptedLLM, ToolCall
from support.common import warnings_are_errors

URL = "http://llm.test/v1"
USER = [{"role": "user", "content": "add 1 and 2"}]
ASK = {"logprobs": True, "extra_body": {"return_token_ids": True}}
"""The caller asks for the training fields itself, so arttrace's request is the caller's own
and the two arms of each comparison send the same bytes."""


# -- response shapes the SDK returns without complaint ----------------------------------------


def _whole() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "3"},
                "logprobs": {
                    "content": [{"token": "token_id:7", "logprob": -0.1, "top_logprobs": []}]
                },
                "finish_reason": "stop",
                "token_ids": [7],
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        "prompt_token_ids": [1, 2],
    }


def _shape(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    body = _whole()
    change(body)
    return body


def _choice(body: dict[str, Any]) -> dict[str, Any]:
    return body["choices"][0]  # type: ignore[no-any-return]


def _token(body: dict[str, Any]) -> dict[str, Any]:
    return _choice(body)["logprobs"]["content"][0]  # type: ignore[no-any-return]


SHAPES = {
    "message null": lambda b: _choice(b).update(message=None),
    "token id beyond 64 bits": lambda b: _choice(b).update(token_ids=[2**70]),
    "prompt token id beyond 64 bits": lambda b: b.update(prompt_token_ids=[2**64]),
    "null logprob": lambda b: _token(b).update(logprob=None),
    "tool call with null function": lambda b: _choice(b)["message"].update(
        tool_calls=[{"id": "call_1", "type": "function", "function": None}]
    ),
    "choice missing index": lambda b: _choice(b).pop("index"),
    "prompt token ids as strings": lambda b: b.update(prompt_token_ids=["1", "2"]),
    "choices null": lambda b: b.update(choices=None),
    "logprob a word": lambda b: _token(b).update(logprob="high"),
    "null top logprob": lambda b: _token(b).update(top_logprobs=[None]),
    "content a number": lambda b: _choice(b)["message"].update(content=3),
    "token ids a string": lambda b: _choice(b).update(token_ids="7"),
}


def _chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "p"}
    token = {"token": "token_id:7", "logprob": -0.1, "top_logprobs": []}
    return [
        {**head, "prompt_token_ids": [1, 2], "choices": [_delta({"role": "assistant"})]},
        {**head, "choices": [_delta({"content": "3"}, token_ids=[7], logprobs=[token])]},
        {**head, "choices": [_delta({}, finish_reason="stop")]},
        {**head, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
    ]


def _delta(delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}
    if "logprobs" in fields:
        out["logprobs"] = {"content": fields.pop("logprobs")}
    return {**out, **fields}


STREAM_SHAPES: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "delta null": lambda c: c[1]["choices"][0].update(delta=None),
    "chunk choices null": lambda c: c[1].update(choices=None),
    "token id beyond 64 bits": lambda c: c[1]["choices"][0].update(token_ids=[2**64]),
    "null logprob": lambda c: c[1]["choices"][0]["logprobs"]["content"][0].update(logprob=None),
    "choice missing index": lambda c: c[1]["choices"][0].pop("index"),
    "prompt token ids as strings": lambda c: c[0].update(prompt_token_ids=["1", "2"]),
    "tool call delta without index": lambda c: c[1]["choices"][0]["delta"].update(
        tool_calls=[{"id": "call_1", "function": {"name": "add", "arguments": "{}"}}]
    ),
    "content a number": lambda c: c[1]["choices"][0]["delta"].update(content=3),
}


USAGES: dict[str, Any] = {
    "a string": "lots",
    "a list": [2, 1],
    "a number": 3,
    "negative counts": {"prompt_tokens": -2, "completion_tokens": -1, "total_tokens": -3},
    "counts of the wrong type": {
        "prompt_tokens": "2",
        "completion_tokens": None,
        "total_tokens": {"n": 3},
        "completion_tokens_details": "none",
    },
    "counts true": {"prompt_tokens": True, "completion_tokens": True, "total_tokens": True},
}
"""Malformed ``usage`` fields: the ids and logprobs are all there, so the turn still trains."""


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _respond_with(respx_mock: Any, response: httpx.Response) -> None:
    respx_mock.post(f"{URL}/chat/completions").mock(return_value=response)


def _policy_call(**kwargs: Any) -> Any:
    client = openai.OpenAI(base_url=URL, api_key="k", max_retries=0)
    return client.chat.completions.create(model="policy", messages=USER, **ASK, **kwargs)


def _dump(obj: Any) -> Any:
    return obj.model_dump(warnings=False)


def _assert_marked(t: at.Trajectory, caught: list[warnings.WarningMessage]) -> None:
    (call,) = t.calls
    assert call.capture_error and call.trainable and t.trainable_turns == 0
    assert all(call.untrainable_reason(c) == UNREADABLE for c in call.choices)
    relevant = [w for w in caught if issubclass(w.category, at.UntrainableTurnWarning)]
    assert len(relevant) == 1 and UNREADABLE in str(relevant[0].message)
    t.reward = 1.0
    json.dumps(t.to_dict())  # the journal can still write it


@pytest.mark.parametrize("shape", SHAPES)
def test_an_unreadable_response_reaches_the_caller_unchanged(instrumented, respx_mock, shape):
    body = _shape(SHAPES[shape])
    _respond_with(respx_mock, httpx.Response(200, json=body))
    plain = _dump(_policy_call())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            captured = _dump(at.trainable(_policy_call)())
    assert captured == plain
    _assert_marked(t, caught)


@pytest.mark.parametrize("shape", STREAM_SHAPES)
def test_an_unreadable_stream_reaches_the_caller_unchanged(instrumented, respx_mock, shape):
    chunks = _chunks(_whole())
    STREAM_SHAPES[shape](chunks)

    def answer(request: httpx.Request) -> httpx.Response:  # the usage chunk only when asked
        asked = (json.loads(request.content).get("stream_options") or {}).get("include_usage")
        content = _sse(chunks if asked else chunks[:3])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    respx_mock.post(f"{URL}/chat/completions").mock(side_effect=answer)

    def consume() -> list[Any]:
        return [_dump(c) for c in _policy_call(stream=True)]

    plain = consume()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with at.trajectory("ex") as t:
            captured = at.trainable(consume)()
    assert captured == plain
    _assert_marked(t, caught)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("usage", USAGES)
def test_a_malformed_usage_never_costs_the_turn(instrumented, respx_mock, usage, stream):
    body = _whole() | {"usage": USAGES[usage]}
    chunks = _chunks(body)
    chunks[3]["usage"] = USAGES[usage]

    def answer(request: httpx.Request) -> httpx.Response:
        if not stream:
            return httpx.Response(200, json=body)
        asked = (json.loads(request.content).get("stream_options") or {}).get("include_usage")
        content = _sse(chunks if asked else chunks[:3])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    respx_mock.post(f"{URL}/chat/completions").mock(side_effect=answer)

    def consume() -> Any:
        result = _policy_call(stream=stream)
        return [_dump(c) for c in result] if stream else _dump(result)

    plain = consume()
    with warnings_are_errors(), at.trajectory("ex") as t:  # no warning, ours or pydantic's
        captured = at.trainable(consume)()
    assert captured == plain
    (call,) = t.calls
    assert call.capture_error is None and t.trainable_turns == 1
    assert list(call.choices[0].token_ids or ()) == [7]
    json.dumps(t.to_dict())  # the journal can write it


def test_every_run_that_loses_a_turn_says_so(instrumented, clients):
    """Once per run, model and cause: a later run losing turns for the same cause warns
    again (naming the run), a second lost turn in the same run does not."""
    client, _ = clients(ScriptedLLM([Reply("a")] * 4, logprobs=False))

    @at.trainable
    def agent() -> None:
        for _ in range(2):
            client.chat.completions.create(model="policy", messages=USER)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: a repeated text at one line is shown once
        for run in ("first", "second"):
            with at.trajectory(run) as t:
                agent()
            assert t.trainable_turns == 0 and len(t.calls) == 2
    told = [str(w.message) for w in caught if w.category is at.UntrainableTurnWarning]
    assert len(told) == 2
    assert "run 'first'" in told[0] and "run 'second'" in told[1]
    assert all("(no logprobs)" in m for m in told)


# -- faults injected into arttrace's own capture steps ----------------------------------------


class Answer(pydantic.BaseModel):
    value: int


def _clients(llm: ScriptedLLM) -> tuple[openai.OpenAI, openai.AsyncOpenAI]:
    return (
        openai.OpenAI(
            base_url=URL,
            api_key="k",
            max_retries=0,
            http_client=httpx.Client(transport=llm.transport()),
        ),
        openai.AsyncOpenAI(
            base_url=URL,
            api_key="k",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=llm.transport()),
        ),
    )


def _outcome(result: Any) -> Any:
    """What the caller saw, comparable across two runs (``created`` is the server's clock)."""
    if isinstance(result, list):
        return [_outcome(r) for r in result]
    if isinstance(result, pydantic.BaseModel):
        return result.model_dump(warnings=False, exclude={"created"})
    return result


def _whole_sync(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    return client.chat.completions.create(model="policy", messages=USER, **ASK)


def _whole_async(llm: ScriptedLLM) -> Any:
    _, client = _clients(llm)

    async def run() -> Any:
        return await client.chat.completions.create(model="policy", messages=USER, **ASK)

    return asyncio.run(run())


def _stream_sync(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    with client.chat.completions.create(model="policy", messages=USER, stream=True, **ASK) as s:
        return list(s)


def _stream_async(llm: ScriptedLLM) -> Any:
    _, client = _clients(llm)

    async def run() -> Any:
        stream = await client.chat.completions.create(
            model="policy", messages=USER, stream=True, **ASK
        )
        return [chunk async for chunk in stream]

    return asyncio.run(run())


def _stream_closed_early(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    stream = client.chat.completions.create(model="policy", messages=USER, stream=True, **ASK)
    first = next(iter(stream))
    stream.close()
    return first


def _raw(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    raw = client.chat.completions.with_raw_response.create(model="policy", messages=USER, **ASK)
    return [raw.status_code, raw.headers["content-type"], raw.parse()]


def _raw_stream(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    raw = client.chat.completions.with_raw_response.create(
        model="policy", messages=USER, stream=True, **ASK
    )
    return list(raw.parse())


def _parse(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    parsed = client.chat.completions.parse(
        model="policy", messages=USER, response_format=Answer, **ASK
    )
    return [parsed.choices[0].message.parsed, parsed]


def _error(llm: ScriptedLLM) -> Any:
    client, _ = _clients(llm)
    try:
        client.chat.completions.create(model="", messages=USER, **ASK)  # the server says 400
    except openai.APIStatusError as error:
        return [type(error), error.status_code, str(error)]
    raise AssertionError("the server accepted a request without a model")


MODES: dict[str, tuple[Callable[[ScriptedLLM], Any], Callable[[], ScriptedLLM]]] = {
    "whole": (_whole_sync, lambda: ScriptedLLM([Reply("3")])),
    "whole async": (_whole_async, lambda: ScriptedLLM([Reply("3")])),
    "tools": (_whole_sync, lambda: ScriptedLLM([Reply(tool_calls=[ToolCall("add", {"a": 1})])])),
    "no logprobs": (_whole_sync, lambda: ScriptedLLM([Reply("3")], logprobs=False)),
    "stream": (_stream_sync, lambda: ScriptedLLM([Reply("three tokens here")])),
    "stream async": (_stream_async, lambda: ScriptedLLM([Reply("three tokens here")])),
    "stream closed early": (_stream_closed_early, lambda: ScriptedLLM([Reply("a b c")])),
    "raw": (_raw, lambda: ScriptedLLM([Reply("3")])),
    "raw stream": (_raw_stream, lambda: ScriptedLLM([Reply("3")])),
    "parse": (_parse, lambda: ScriptedLLM([Reply('{"value": 3}')])),
    "error": (_error, lambda: ScriptedLLM([Reply("3")])),
}

FAULTS: dict[str, tuple[Any, str]] = {
    "Capture.__init__": (Capture, "__init__"),
    "Capture.complete": (Capture, "complete"),
    "Capture.add_chunk": (Capture, "add_chunk"),
    "hiding the usage chunk": (Capture, "conceal"),
    "Capture.end_stream": (Capture, "end_stream"),
    "Capture.fail": (Capture, "fail"),
    "Capture.abandon": (Capture, "abandon"),
    "reading a response": (_chat, "_read_completion"),
    "reading a chunk's choice": (_StreamedChoice, "add"),
    "reassembling a choice": (_StreamedChoice, "record"),
    "OpenCall._close": (OpenCall, "_close"),
    "OpenCall._claim": (OpenCall, "_claim"),
    "OpenCall._record_error": (OpenCall, "_record_error"),
    "request span attributes": (_calls, "_request_attributes"),
    "response span attributes": (_calls, "_response_attributes"),
    "scrubbing params": (_calls, "scrub_params"),
    "CallLog.open": (CallLog, "open"),
    "CallLog.close": (CallLog, "close"),
    "CallLog.freeze": (CallLog, "freeze"),
    "warn_untrainable": (_calls, "warn_untrainable"),
    "policy_scope": (_context, "policy_scope"),
    "training fields": (_chat, "with_training_fields"),
}


def _run_arm(mode: str, capture: bool) -> Any:
    call, make_llm = MODES[mode]
    if not capture:
        return _outcome(call(make_llm()))
    with at.trajectory("ex"):
        return _outcome(at.trainable(call)(make_llm()))


@pytest.fixture(scope="module")
def uninstrumented() -> dict[str, Any]:
    with warnings_are_errors():
        return {mode: _run_arm(mode, capture=False) for mode in MODES}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_in_any_capture_step_is_invisible_to_the_caller(
    instrumented, uninstrumented, spans, monkeypatch, caplog, fault
):
    """``spans``: a provider is set, so span attributes are built and exceptions recorded."""
    owner, name = FAULTS[fault]
    fired: list[str] = []

    def boom(*args: Any, **kwargs: Any) -> Any:
        fired.append(name)
        raise RuntimeError(f"fault injected into {fault}")

    monkeypatch.setattr(owner, name, boom)
    monkeypatch.setattr(_guard, "_logged", set())  # each failure place logs its first time again
    for mode in MODES:
        with warnings_are_errors():  # nothing of arttrace's may reach the caller
            assert _run_arm(mode, capture=True) == uninstrumented[mode], mode
        _warnings.reset()
    assert fired, f"the fault in {fault} never fired: the test proves nothing"
    assert any(r.exc_info and "fault injected" in str(r.exc_info[1]) for r in caplog.records)


def test_a_failing_step_marks_the_call_and_the_rest_still_happens(instrumented, spans, monkeypatch):
    """A failure while ending the span: the record is still kept, marked, and warned about."""
    monkeypatch.setattr(_calls, "_response_attributes", lambda *a: 1 / 0)
    client, _ = _clients(ScriptedLLM([Reply("3")]))
    with pytest.warns(at.UntrainableTurnWarning, match=UNREADABLE), at.trajectory("ex") as t:
        at.trainable(client.chat.completions.create)(model="policy", messages=USER)
    (call,) = t.calls
    assert "ZeroDivisionError" in (call.capture_error or "") and t.trainable_turns == 0
    assert call.choices[0].message["content"] == "3"  # kept as context
    (span,) = [s for s in spans.get_finished_spans() if s.name == "chat policy"]
    assert span.end_time is not None


# -- warnings turned into errors ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_warnings_as_errors_never_cost_the_caller_its_response(
    instrumented, clients, caplog, stream
):
    client, _ = clients(ScriptedLLM([Reply("no logprobs here")], logprobs=False))
    with warnings.catch_warnings(), at.trajectory("ex") as t:
        warnings.simplefilter("error")
        result = at.trainable(client.chat.completions.create)(
            model="policy", messages=USER, stream=stream
        )
        content = (
            "".join(c.choices[0].delta.content or "" for c in result if c.choices)
            if stream
            else result.choices[0].message.content
        )
    assert content == "no logprobs here"
    assert t.trainable_turns == 0 and len(t.calls) == 1
    (logged,) = [r for r in caplog.records if "cannot be trained (no logprobs)" in r.getMessage()]
    assert logged.levelno == logging.WARNING and "warning filter" in logged.getMessage()


def test_the_shapes_are_valid_for_the_sdk_itself():
    """Guard against a vacuous test: every shape above is one the SDK returns without raising."""

    def client(answer: httpx.Response) -> openai.OpenAI:
        transport = httpx.MockTransport(lambda r: answer)
        return openai.OpenAI(
            base_url=URL, api_key="k", http_client=httpx.Client(transport=transport)
        )

    bodies = [_shape(change) for change in SHAPES.values()]
    bodies += [_whole() | {"usage": usage} for usage in USAGES.values()]
    for body in bodies:
        client(httpx.Response(200, json=body)).chat.completions.create(
            model="policy", messages=USER
        )
    for stream_change in STREAM_SHAPES.values():
        chunks = copy.deepcopy(_chunks(_whole()))
        stream_change(chunks)
        sse = httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=_sse(chunks)
        )
        list(client(sse).chat.completions.create(model="policy", messages=USER, stream=True))


def test_a_fault_while_recording_the_callers_exception_leaves_it_alone(
    instrumented, spans, monkeypatch
):
    def boom(error: BaseException) -> Any:
        raise RuntimeError("fault injected into exception_attributes")

    for module in (_trajectory, _trainable):
        monkeypatch.setattr(module, "exception_attributes", boom)

    class Mine(Exception):
        pass

    @at.trainable
    def agent() -> None:
        raise Mine("the caller's own")

    _warnings.reset()  # once per process: this test asserts it
    with (
        pytest.warns(at.NothingToTrainWarning, match="no LLM call was seen"),
        pytest.raises(Mine, match="the caller's own"),
        at.trajectory("ex") as t,
    ):
        agent()
    assert t.exception is not None and t.exception["type"].endswith("Mine")
