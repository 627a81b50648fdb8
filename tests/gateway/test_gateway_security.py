"""``arttrace gateway`` attacked from the outside: raw HTTP against the running command, with
an upstream the test starts, which must never see a refused request.

Paths that leave a run's ``/v1`` (dot segments, encoded or not, encoded slashes, backslashes)
are refused before anything is forwarded. A gateway without a token refuses what a web page
could send it: a ``Host`` that is not its own (DNS rebinding), a body that is not declared JSON
(a form or ``text/plain`` post), a request a browser marks as coming from another site
(``Origin``, ``Sec-Fetch-Site``), unless the name or origin is allowed. Bad arguments to the
command are one line each, with the fix, and exit status 2.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.gateway import Exchange, RecordingUpstream, gateway_process, raw_request

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as served:
        yield served


@pytest.fixture(scope="module")
def gateway(upstream: RecordingUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``arttrace gateway`` without a token, as a process of its own."""
    with gateway_process(upstream.base_url, tmp_path_factory.mktemp("gateway")) as base:
        yield base


@pytest.fixture
def seen(upstream: RecordingUpstream) -> list[Exchange]:
    """What reaches the upstream during the test."""
    upstream.exchanges.clear()
    return upstream.exchanges


def post(
    base: str, target: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return raw_request(base, "POST", target, {**JSON, **(headers or {})}, json.dumps(body).encode())


def open_run(base: str, **headers: str) -> str:
    """A new run's path (``/runs/<id>``)."""
    status, _, content = post(base, "/runs", {"example_id": "q-1"}, headers)
    assert status == 201, content
    return f"/runs/{json.loads(content)['run_id']}"


def message(content: bytes) -> str:
    return str(json.loads(content)["error"]["message"])


# -- 3: paths that leave the run's /v1 ----------------------------------------------------

TRAVERSALS = [
    "/../admin/keys",
    "/%2e%2e/admin/keys",
    "/%2E%2E/admin/keys",
    "/.%2e/.%2E/admin",
    "/chat/%2e%2e/%2e%2e/%2e%2e/admin",
    "/./models",
    "/..%2fadmin",
    "/..%2Fadmin",
    "/models%2f..%2f..%2fadmin",
    "/..%5cadmin",
    "/..\\admin",
    "/%252e%252e/admin",
]


@pytest.mark.parametrize("tail", TRAVERSALS)
def test_a_path_that_leaves_the_runs_v1_is_refused_before_it_is_forwarded(
    gateway: str, seen: list[Exchange], tail: str
) -> None:
    run = open_run(gateway)
    status, _, content = post(gateway, f"{run}/v1{tail}", CHAT)
    assert status == 400, content
    assert "path" in message(content) and "/v1" in message(content)
    assert seen == []
    # the run's own routes still work, under the upstream's /v1
    status, _, content = post(gateway, f"{run}/v1/chat/completions", CHAT)
    assert status == 200, content
    assert [e.path for e in seen] == ["/v1/chat/completions"]


# -- 5: what a web page could send a gateway without a token -------------------------------


def test_a_host_that_is_not_the_gateways_is_refused(gateway: str, seen: list[Exchange]) -> None:
    """DNS rebinding: a page on attacker.example whose name now resolves to 127.0.0.1."""
    port = gateway.rsplit(":", 1)[1]
    run = open_run(gateway)
    rebound = {"Host": f"attacker.example:{port}"}
    for target, body in (("/runs", {"example_id": "q-2"}), (f"{run}/v1/chat/completions", CHAT)):
        status, _, content = post(gateway, target, body, rebound)
        assert status == 400, content
        assert "attacker.example" in message(content) and "--allow-host" in message(content)
    status, _, content = raw_request(gateway, "GET", run, rebound)
    assert status == 400, content
    assert seen == []
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        status, _, content = post(gateway, f"{run}/v1/chat/completions", CHAT, {"Host": host})
        assert status == 200, content
    assert len(seen) == 3


def test_allowed_host_names_and_origins_are_served(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    upstream.exchanges.clear()
    page = "http://localhost:3000"
    options = ("--allow-host", "gateway.internal", "--allow-origin", page)
    with gateway_process(upstream.base_url, tmp_path, *options) as base:
        port = base.rsplit(":", 1)[1]
        run = open_run(base, Host=f"gateway.internal:{port}")
        # a browser's preflight from the allowed page, then its call
        status, headers, _ = raw_request(
            base,
            "OPTIONS",
            f"{run}/v1/chat/completions",
            {
                "Origin": page,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert status == 204
        assert headers["access-control-allow-origin"] == page
        assert "POST" in headers["access-control-allow-methods"]
        assert "content-type" in headers["access-control-allow-headers"]
        browser = {"Origin": page, "Sec-Fetch-Site": "same-site"}
        status, headers, content = post(base, f"{run}/v1/chat/completions", CHAT, browser)
        assert status == 200, content
        assert (
            headers["access-control-allow-origin"] == page and "origin" in headers["vary"].lower()
        )
        status, headers, _ = post(base, "/runs", {"example_id": "q-2"}, browser)
        assert status == 201 and headers["access-control-allow-origin"] == page
        # another page is still refused, its preflight too
        other = {"Origin": "http://localhost:4000"}
        status, _, content = post(base, f"{run}/v1/chat/completions", CHAT, other)
        assert status == 403 and "--allow-origin" in message(content)
        status, headers, _ = raw_request(
            base,
            "OPTIONS",
            "/runs",
            {**other, "Access-Control-Request-Method": "POST"},
        )
        assert status == 403 and "access-control-allow-origin" not in headers
    assert [e.path for e in upstream.exchanges] == ["/v1/chat/completions"]


BROWSER_ELSEWHERE = [
    {"Origin": "http://attacker.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"},
]


@pytest.mark.parametrize("headers", BROWSER_ELSEWHERE, ids=lambda h: ",".join(h.values()))
def test_a_browser_request_from_another_site_is_refused(
    gateway: str, seen: list[Exchange], headers: dict[str, str]
) -> None:
    run = open_run(gateway)
    for target, body in (("/runs", {"example_id": "q-2"}), (f"{run}/v1/chat/completions", CHAT)):
        status, answered, content = post(gateway, target, body, headers)
        assert status == 403, content
        assert "--allow-origin" in message(content)
        assert "access-control-allow-origin" not in answered
    status, _, content = post(gateway, f"{run}/close", {"reward": 1.0}, headers)
    assert status == 403, content
    status, _, content = raw_request(gateway, "GET", run, {})
    assert status == 200 and json.loads(content)["reward"] is None
    assert seen == []


@pytest.mark.parametrize(
    "headers",
    [{"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Mode": "cors"}],
    ids=lambda h: ",".join(h.values()),
)
def test_what_programs_and_the_gateways_own_origin_send_is_served(
    gateway: str, seen: list[Exchange], headers: dict[str, str]
) -> None:
    """Node's fetch sends ``Sec-Fetch-Mode: cors`` (and no ``Origin``); a URL typed into the
    browser is ``Sec-Fetch-Site: none``."""
    run = open_run(gateway, **headers)
    status, _, content = post(gateway, f"{run}/v1/chat/completions", CHAT, headers)
    assert status == 200, content
    assert len(seen) == 1


NOT_JSON = [
    None,
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
]


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_body_not_declared_json_is_refused(
    gateway: str, seen: list[Exchange], content_type: str | None
) -> None:
    """A form or ``fetch(..., {mode: "no-cors"})`` posts these without a CORS preflight."""
    run = open_run(gateway)
    headers = {"Content-Type": content_type} if content_type else {}
    for method, target, body in (
        ("POST", "/runs", {"example_id": "q-2"}),
        ("PUT", f"{run}/reward", {"reward": 1.0}),
        ("POST", f"{run}/v1/chat/completions", CHAT),
    ):
        status, _, content = raw_request(
            gateway, method, target, headers, json.dumps(body).encode()
        )
        assert status == 415, content
        assert "Content-Type: application/json" in message(content)
    status, _, content = raw_request(gateway, "GET", run, {})
    assert status == 200 and json.loads(content)["reward"] is None
    assert seen == []
    # a request without a body needs no content type
    status, _, content = raw_request(gateway, "POST", f"{run}/close", {})
    assert status == 200, content


def test_a_gateway_with_a_token_needs_only_the_token(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    """A page cannot know the token, so names and origins are not checked (a gateway behind a
    proxy with names of its own works as it is)."""
    upstream.exchanges.clear()
    env = {"ARTTRACE_GATEWAY_TOKEN": "gw-secret-42"}
    with gateway_process(upstream.base_url, tmp_path, env=env) as base:
        auth = {"Authorization": "Bearer gw-secret-42", "Host": "gateway.example"}
        run = open_run(base, **auth)
        status, _, content = post(base, f"{run}/v1/chat/completions", CHAT, auth)
        assert status == 200, content
        status, _, _ = post(base, f"{run}/v1/chat/completions", CHAT, {"Host": "gateway.example"})
        assert status == 401
    assert len(upstream.exchanges) == 1


# -- 11: bad arguments ---------------------------------------------------------------------


def gateway_command(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arttrace.app.cli", "gateway", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
    )


UPSTREAM = "http://127.0.0.1:9/v1"
BAD_ARGUMENTS = [
    (["--upstream", "127.0.0.1:8000/v1"], "--upstream", "http://"),
    (["--upstream", "ftp://127.0.0.1/v1"], "--upstream", "http://"),
    (["--upstream", "http:///v1"], "--upstream", "host"),
    (["--upstream", "http://[::1/v1"], "--upstream", "http://"),
    (["--upstream", "http://127.0.0.1:99999/v1"], "--upstream", "port"),
    (["--upstream", UPSTREAM, "--port", "70000"], "--port", "0 to 65535"),
    (["--upstream", UPSTREAM, "--port", "-1"], "--port", "0 to 65535"),
    (["--upstream", UPSTREAM, "--timeout", "-1"], "--timeout", "greater than 0"),
    (["--upstream", UPSTREAM, "--timeout", "0"], "--timeout", "greater than 0"),
    (["--upstream", UPSTREAM, "--timeout", "nan"], "--timeout", "greater than 0"),
    (["--upstream", UPSTREAM, "--allow-origin", "localhost:3000"], "--allow-origin", "http://"),
]


@pytest.mark.parametrize(("arguments", "option", "fix"), BAD_ARGUMENTS)
def test_a_bad_argument_is_one_line_with_the_fix(
    arguments: list[str], option: str, fix: str, tmp_path: Path
) -> None:
    done = gateway_command(*arguments, "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    (error,) = [line for line in done.stderr.splitlines() if "error" in line]
    assert error.startswith("arttrace gateway: error: ")
    assert option in error and fix in error


def test_a_port_in_use_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = gateway_command("--upstream", UPSTREAM, "--port", port, "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("arttrace gateway: ") and port in line
    assert "in use" in line and "--port" in line


def test_a_run_folder_in_use_is_one_line_with_the_fix(
    upstream: RecordingUpstream, tmp_path: Path
) -> None:
    with gateway_process(upstream.base_url, tmp_path):
        done = gateway_command("--upstream", UPSTREAM, "--port", "0", "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("arttrace gateway: ") and "in use" in line and "--out" in line
