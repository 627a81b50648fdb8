"""A record keeps each sampled token in 8 bytes (a 4-byte id, a float32 logprob) and loses
nothing the server sent: vLLM's logprobs are float32 values (its sampler's dtype), so the
record, ``to_dict()`` (the journal), ``to_art()`` and a JSON round trip give back the very
floats the server wrote; any other value (a rounded decimal, an id beyond 32 bits) is kept in
8 bytes, exactly. Over real HTTP, through the OpenAI SDK shim and the HTTP-client layer."""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

import arttrace as at
from arttrace.capture._records import ChoiceRecord, LLMCall
from arttrace.testing import LLMServer, Reply, serve
from support.served import KeptLLM

ASK = [{"role": "user", "content": "Say something long."}]
REPLY = Reply(" ".join(f"word{i}" for i in range(40)))


class VLLMShaped(KeptLLM):
    """Logprobs as vLLM writes them: a float32 value (``log_softmax(..., dtype=float32)``,
    then ``.tolist()``) as the shortest decimal that reads back as it."""

    def _logprob(self, number: int, index: int, position: int, token_id: int) -> float:
        return array("f", [super()._logprob(number, index, position, token_id)])[0]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, LLMServer]]:
    started = {
        "vllm": serve(VLLMShaped(replies=lambda body: REPLY)),
        "decimal": serve(KeptLLM(replies=lambda body: REPLY)),
    }
    yield started
    for s in started.values():
        s.stop()


def _shim(base_url: str, stream: bool) -> None:
    with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        result = sdk.chat.completions.create(
            model="policy",
            messages=ASK,
            stream=stream,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        if stream:
            for _ in result:
                pass


def _http(base_url: str, stream: bool) -> None:
    body = {"model": "policy", "messages": ASK, "logprobs": True, "return_token_ids": True}
    url = f"{base_url}/chat/completions"
    with httpx.Client() as client:
        if not stream:
            client.post(url, json=body).raise_for_status()
            return
        with client.stream("POST", url, json={**body, "stream": True}) as response:
            for _ in response.iter_bytes():
                pass


def _run(server: LLMServer, layer: str, stream: bool) -> at.Trajectory:
    call = at.trainable(_shim if layer == "shim" else _http)
    at.instrument()
    try:
        with at.trajectory("q") as t:
            call(server.base_url, stream)
    finally:
        at.uninstrument()
    t.reward = 1.0
    return t


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("layer", ["shim", "http"])
def test_vllm_logprobs_are_kept_in_float32_and_given_back_as_sent(
    servers: dict[str, LLMServer], layer: str, stream: bool
) -> None:
    llm = servers["vllm"].llm
    assert isinstance(llm, KeptLLM)
    t = _run(servers["vllm"], layer, stream)
    prompt, ids, logprobs = llm.tokens()
    (call,) = t.calls
    (choice,) = call.choices
    assert call.untrainable_reason(choice) is None
    assert choice.logprobs is not None and choice.token_ids is not None
    assert call.prompt_token_ids is not None
    # 8 bytes a sampled token: a 4-byte id and a float32 logprob
    assert (choice.token_ids.typecode, choice.logprobs.typecode) == ("I", "f")
    assert call.prompt_token_ids.typecode == "I"
    assert choice.token_ids.itemsize + choice.logprobs.itemsize == 8
    # the same floats as the server wrote, to the digit, wherever they are read
    assert choice.logprobs.tolist() == logprobs
    saved = t.to_dict()["calls"][0]
    assert [repr(x) for x in saved["choices"][0]["logprobs"]] == [repr(x) for x in logprobs]
    assert (saved["prompt_token_ids"], saved["choices"][0]["token_ids"]) == (prompt, ids)
    art_choice = t.to_art().messages_and_choices[-1]
    assert [c.logprob for c in art_choice.logprobs.content] == logprobs  # type: ignore[union-attr]
    assert art_choice.model_extra == {"prompt_token_ids": prompt, "token_ids": ids}  # type: ignore[union-attr]
    again = at.Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    (back,) = again.calls[0].choices
    assert back.logprobs is not None and back.logprobs.typecode == "f"
    assert again.to_dict() == t.to_dict()


def test_logprobs_a_float32_cannot_hold_are_kept_in_float64(
    servers: dict[str, LLMServer],
) -> None:
    """A server that writes rounded decimals (OpenAI's API, this scripted one by default)."""
    llm = servers["decimal"].llm
    assert isinstance(llm, KeptLLM)
    t = _run(servers["decimal"], "shim", False)
    _, _, logprobs = llm.tokens()
    (choice,) = t.calls[0].choices
    assert choice.logprobs is not None and choice.logprobs.typecode == "d"
    assert choice.logprobs.tolist() == logprobs
    assert t.to_dict()["calls"][0]["choices"][0]["logprobs"] == logprobs


def test_ids_beyond_32_bits_and_odd_logprobs_come_back_exactly() -> None:
    """What the small form cannot hold is kept in 8 bytes, not altered: an id beyond 32 bits or
    negative, a NaN, a value beyond float32's range or finer than its precision."""
    data: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "x"},
        "finish_reason": "stop",
        "logprobs": [-0.5, -9999.0, -1.401298464324817e-45],  # float32 values
        "token_ids": [0, 151645, 2**32 - 1],
        "tokens": None,
        "top_logprobs": None,
    }
    small = ChoiceRecord.from_dict(data)
    assert small.logprobs is not None and small.token_ids is not None
    assert (small.logprobs.typecode, small.token_ids.typecode) == ("f", "I")
    assert small.to_dict() == data
    for logprobs in ([-0.5, -1e300], [-0.5, -0.1], [float("nan")]):
        odd = ChoiceRecord.from_dict({**data, "logprobs": logprobs, "token_ids": [2**40, -1, 7]})
        assert odd.logprobs is not None and odd.token_ids is not None
        assert (odd.logprobs.typecode, odd.token_ids.typecode) == ("d", "q")
        assert odd.token_ids.tolist() == [2**40, -1, 7]
        assert repr(odd.logprobs.tolist()) == repr(logprobs)
    call = LLMCall.from_dict({"model": "m", "messages": [], "prompt_token_ids": [-3, 5]})
    assert call.prompt_token_ids is not None and call.prompt_token_ids.tolist() == [-3, 5]
