"""Keys never reach what arttrace stores or exports: a 401 body that echoes the request's
credentials, whatever their scheme (``Authorization`` with any scheme, ``Basic`` decoded too,
``x-api-key``, Azure's ``api-key``, ``x-goog-api-key``, a key in the query string), is redacted
in the record, the trajectory, its JSON, its ``to_art()``, the spans, the logs and the gateway's
journal, for every layer (the OpenAI SDK, raw HTTP clients, the gateway) over real HTTP (the
caller's exception is untouched); headers passed per request are never recorded; saved files
are the owner's only."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import stat
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import requests

import arttrace as at
from arttrace.capture import _redact
from arttrace.gateway import Gateway
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


# -- every credential scheme, over real HTTP, through every layer ------------------------------


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


CREDENTIALS: dict[str, tuple[dict[str, str], dict[str, str], list[str]]] = {
    # name: (headers sent, query sent, the secrets that must appear nowhere)
    "bearer": ({"Authorization": "Bearer tok-bearer-0123456789"}, {}, ["tok-bearer-0123456789"]),
    "basic": (
        {"Authorization": f"Basic {_basic('alice', 'pw-basic-0123456789')}"},
        {},
        [_basic("alice", "pw-basic-0123456789"), "pw-basic-0123456789"],
    ),
    "token": ({"Authorization": "Token tok-token-0123456789"}, {}, ["tok-token-0123456789"]),
    "api-key scheme": (
        {"Authorization": "Api-Key ak-scheme-012345678"},
        {},
        ["ak-scheme-012345678"],
    ),
    "any scheme": ({"Authorization": "Custom-Auth cust-0123456789"}, {}, ["cust-0123456789"]),
    "x-api-key": ({"x-api-key": "xak-0123456789abc"}, {}, ["xak-0123456789abc"]),
    "api-key (Azure)": ({"api-key": "azure-0123456789abc"}, {}, ["azure-0123456789abc"]),
    "x-goog-api-key": ({"x-goog-api-key": "goog-0123456789abc"}, {}, ["goog-0123456789abc"]),
    "?api-key=": ({}, {"api-key": "qak-0123456789abc"}, ["qak-0123456789abc"]),
    "?key=": ({}, {"key": "qk-0123/456789+abc"}, ["qk-0123/456789+abc", "qk-0123%2F456789%2Babc"]),
    "?access_token=": ({}, {"access_token": "qat-0123456789abc"}, ["qat-0123456789abc"]),
}


class _Echoing(BaseHTTPRequestHandler):
    """An upstream that refuses every call, quoting all it was sent: each header as it came,
    the path and query as sent and decoded, a Basic pair decoded (as some proxies do)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        said = [f"{k}: {v}" for k, v in self.headers.items()]
        scheme, _, credentials = (self.headers.get("authorization") or "").partition(" ")
        if credentials:
            said.append(f"key {credentials}")
        if scheme.lower() == "basic":
            said.append(f"user:password {base64.b64decode(credentials).decode()}")
        said += [self.path, urllib.parse.unquote_plus(self.path)]
        body = json.dumps({"error": {"message": f"Invalid credentials: {' | '.join(said)}"}})
        data = body.encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(autouse=True)
def _nothing_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test redacts what it sent itself, not what an earlier test taught arttrace."""
    monkeypatch.setattr(_redact, "_known", ())
    monkeypatch.setattr(_redact, "_seen", {}, raising=False)


@pytest.fixture
def echoing() -> Iterator[str]:
    """The base URL (``.../v1``) of an upstream that echoes every credential in a 401."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echoing)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


BODY = {"model": "policy", "messages": USER}


def _with_query(url: str, query: dict[str, str]) -> str:
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


def _openai_sdk(base: str, headers: dict[str, str], query: dict[str, str]) -> None:
    client = openai.OpenAI(
        base_url=base, api_key="EMPTY", max_retries=0, default_headers=headers, default_query=query
    )
    client.chat.completions.create(model="policy", messages=USER)


def _httpx(base: str, headers: dict[str, str], query: dict[str, str]) -> None:
    with httpx.Client() as client:
        url = _with_query(f"{base}/chat/completions", query)
        client.post(url, json=BODY, headers=headers).raise_for_status()


def _requests(base: str, headers: dict[str, str], query: dict[str, str]) -> None:
    url = f"{base}/chat/completions"
    requests.post(url, json=BODY, headers=headers, params=query, timeout=10).raise_for_status()


def _urllib(base: str, headers: dict[str, str], query: dict[str, str]) -> None:
    request = urllib.request.Request(
        _with_query(f"{base}/chat/completions", query),
        data=json.dumps(BODY).encode(),
        headers={"content-type": "application/json", **headers},
    )
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as error:
        error.read()  # the caller reads the server's explanation
        raise


def _aiohttp(base: str, headers: dict[str, str], query: dict[str, str]) -> None:
    async def post() -> None:
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.post(f"{base}/chat/completions", json=BODY, params=query) as response,
        ):
            await response.read()
            response.raise_for_status()

    asyncio.run(post())


REFUSED = (
    openai.AuthenticationError,
    httpx.HTTPStatusError,
    requests.HTTPError,
    urllib.error.HTTPError,
    aiohttp.ClientResponseError,
)
CALLERS: dict[str, Callable[[str, dict[str, str], dict[str, str]], None]] = {
    "openai": _openai_sdk,
    "httpx": _httpx,
    "requests": _requests,
    "urllib": _urllib,
    "aiohttp": _aiohttp,
}


def _leaks(secrets: list[str], written: dict[str, str]) -> list[tuple[str, str]]:
    return [
        (secret, where) for secret in secrets for where, text in written.items() if secret in text
    ]


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("caller", CALLERS)
def test_every_credential_scheme_is_redacted_from_all_that_is_written(
    instrumented, spans, echoing, tmp_path, caplog, caller, credential
):
    headers, query, secrets = CREDENTIALS[credential]

    @at.trainable
    def agent() -> None:
        CALLERS[caller](echoing, headers, query)

    with (
        caplog.at_level(logging.DEBUG, "arttrace"),
        pytest.raises(REFUSED),  # each client's own error, untouched
        at.trajectory("ex") as t,
    ):
        agent()
    (call,) = t.calls
    assert call.error and "401" in call.error
    t.reward = 0.0
    t.save(tmp_path / "t.json")
    written = {
        "record": json.dumps(t.to_dict()),
        "saved file": (tmp_path / "t.json").read_text(),
        "to_art": t.to_art().model_dump_json(),
        "spans": _exported(spans),
        "log": caplog.text,
    }
    assert t.exception is not None  # the caller's error, kept in the run
    assert _leaks(secrets, written) == []


@pytest.mark.parametrize("credential", CREDENTIALS)
def test_every_credential_scheme_is_redacted_from_the_gateway_journal(
    echoing, tmp_path: Path, credential
):
    headers, query, secrets = CREDENTIALS[credential]
    with Gateway(echoing, out=tmp_path) as gateway, httpx.Client() as client:
        run = client.post(f"{gateway.base_url}/runs", json={"example_id": "ex"}).json()
        url = _with_query(f"{run['url']}/chat/completions", query)
        answer = client.post(url, json=BODY, headers=headers)
        assert answer.status_code == 401
        assert any(s in answer.text for s in secrets)  # the caller gets the upstream's answer
        closed = client.post(f"{gateway.base_url}/runs/{run['run_id']}/close", json={"reward": 0})
        assert closed.status_code == 200, closed.text
    journal = {str(p): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert any("401" in text for text in journal.values())  # the call's error is journaled
    assert _leaks(secrets, journal) == []


def test_a_fresh_signature_on_every_call_does_not_grow_what_is_remembered_without_end():
    for n in range(3 * _redact._MAX_SECRETS):
        _redact.remember_headers({"Authorization": f"HMAC Signature=sig-{n:012d}"})
    assert len(_redact._seen) == _redact._MAX_SECRETS
    newest = f"sig-{3 * _redact._MAX_SECRETS - 1:012d}"
    assert _redact.redact(f"bad signature {newest}") == "bad signature [redacted]"
