"""Keys never reach what arttrace stores or exports: a 401 body that echoes the request's key is
redacted in the record, the trajectory, its JSON and the spans (the caller's exception is
untouched); headers passed per request are never recorded; saved files are the owner's only."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import httpx
import openai
import pytest

import arttrace as at
from arttrace.integrations._core import FrameworkCall, choice_record
from arttrace.testing import Reply, ScriptedLLM

URL = "http://auth.test/v1"
USER = [{"role": "user", "content": "q"}]


def _echoing_401(request: httpx.Request) -> httpx.Response:
    """A server that quotes the credentials it refuses, as some proxies do."""
    said = [request.headers.get(h) for h in ("authorization", "api-key", "x-api-key")]
    return httpx.Response(
        401,
        json={
            "error": {"message": f"Incorrect API key provided: {' / '.join(filter(None, said))}"}
        },
    )


def _exported(spans: Any) -> str:
    """Everything the user's exporter received, as text."""
    out = []
    for span in spans.get_finished_spans():
        out.append(json.dumps(dict(span.attributes or {}), default=str))
        out.append(str(span.status.description))
        out += [json.dumps(dict(e.attributes or {}), default=str) for e in span.events]
    return "\n".join(out)


@pytest.mark.parametrize(
    ("api_key", "headers", "secrets"),
    [
        ("sk-proj-Abcdefghijklmnop1234", {}, ["sk-proj-Abcdefghijklmnop1234"]),
        ("company-internal-key-7f3a9", {}, ["company-internal-key-7f3a9"]),
        ("EMPTY", {"Authorization": "Bearer gw-tok-112233445566"}, ["gw-tok-112233445566"]),
        ("EMPTY", {"api-key": "azure0123456789abcdef"}, ["azure0123456789abcdef"]),
    ],
    ids=["sk-key", "client-key", "authorization-header", "api-key-header"],
)
def test_a_401_echoing_the_key_is_redacted_everywhere_arttrace_keeps_it(
    instrumented, respx_mock, spans, tmp_path, api_key, headers, secrets
):
    respx_mock.post(f"{URL}/chat/completions").mock(side_effect=_echoing_401)
    client = openai.OpenAI(base_url=URL, api_key=api_key, max_retries=0)

    @at.trainable
    def agent() -> None:
        client.chat.completions.create(model="policy", messages=USER, extra_headers=headers)

    with pytest.raises(openai.AuthenticationError) as raised, at.trajectory("ex") as t:
        agent()
    assert all(s in str(raised.value) for s in secrets)  # the caller's exception is untouched
    (call,) = t.calls
    assert call.error and "AuthenticationError" in call.error and "[redacted]" in call.error
    assert t.exception is not None and "AuthenticationError" in t.exception["traceback"]
    t.reward = 0.0
    t.save(tmp_path / "t.json")
    stored = [
        call.error,
        json.dumps(t.to_dict()),
        (tmp_path / "t.json").read_text(),
        _exported(spans),
    ]
    leaks = [(s, text[:80]) for s in secrets for text in stored if s in text]
    assert leaks == []


def test_request_headers_are_never_recorded(instrumented, clients, spans):
    client, _ = clients(ScriptedLLM([Reply("ok")]))
    secret = "hdr-secret-0123456789"

    @at.trainable(model="policy")
    def agent() -> None:
        client.chat.completions.create(
            model="policy",
            messages=USER,
            temperature=0.5,
            extra_headers={"X-Api-Key": secret, "X-Trace": "trace-value-abcdef"},
        )
        seen = FrameworkCall(
            "someframework",
            "other",
            USER,
            params={
                "temperature": 0.5,
                "extra_headers": {"Authorization": f"Bearer {secret}"},
                "default_headers": {"X-Trace": "trace-value-abcdef"},
                "api_key": secret,
            },
        )
        seen.finish([choice_record({"role": "assistant", "content": "ok"})])

    with at.trajectory("ex") as t:
        agent()
    assert [c.params for c in t.calls] == [
        {"temperature": 0.5, "logprobs": True, "extra_body": {"return_token_ids": True}},
        {"temperature": 0.5},
    ]
    saved = json.dumps(t.to_dict())
    exported = _exported(spans)
    for value in (secret, "trace-value-abcdef", "extra_headers", "default_headers"):
        assert value not in saved and value not in exported


def test_saved_trajectories_are_readable_by_their_owner_only(tmp_path):
    with at.trajectory("ex") as t:
        t.reward = 1.0
    old = os.umask(0o022)
    try:
        t.save(tmp_path / "t.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t.json").stat().st_mode) == 0o600
    assert at.Trajectory.load(tmp_path / "t.json").reward == 1.0
