"""``arttrace gateway --workers 2`` from the outside: one port, two processes, any worker serves
any run, each run's calls recorded in exactly one place (its worker's journal), a worker that
dies is restarted and says so, and SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from arttrace.testing import serve
from arttrace.training._journal import Journal
from served import KeptLLM

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="workers share the port on Linux")

TOKEN = "gw-workers-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY: dict[str, Any] = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Served:
    process: subprocess.Popen[str]
    base: str
    out: Path
    llm: KeptLLM
    log: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    out = tmp_path_factory.mktemp("workers")
    log = out.parent / "workers.log"
    llm = KeptLLM()
    with serve(llm) as upstream, log.open("w") as errors:
        command = ["gateway", "--upstream", upstream.base_url, "--port", "0", "--workers", "2"]
        process = subprocess.Popen(
            [sys.executable, "-m", "arttrace.app.cli", *command, "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "ARTTRACE_GATEWAY_TOKEN": TOKEN},
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "with 2 workers" in line, line + log.read_text()
            yield Served(process, line.split("listening on ")[1].split(" ")[0], out, llm, log)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def fresh() -> httpx.Client:
    """A client that opens a new connection per request, so requests to the shared port land
    on either worker (the kernel spreads connections, not requests)."""
    return httpx.Client(headers=AUTH, limits=httpx.Limits(max_keepalive_connections=0))


def open_run(client: httpx.Client, base: str, example_id: str) -> dict[str, Any]:
    answer = client.post(f"{base}/runs", json={"example_id": example_id})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def owner(run: dict[str, Any]) -> int:
    return int(run["run_id"][1])  # "w<worker>g<generation>.<random>"


def runs_on_both(client: httpx.Client, base: str) -> dict[int, dict[str, Any]]:
    """A run held by each worker, opened on the shared port."""
    runs: dict[int, dict[str, Any]] = {}
    for n in range(64):
        run = open_run(client, base, f"q-{n}")
        runs.setdefault(owner(run), run)
        if len(runs) == 2:
            return runs
    raise AssertionError(f"64 connections all reached one worker: {runs}")


def workers_of(gateway: Served) -> dict[int, int]:
    """Each worker's pid, by its index, as the gateway's log says (the latest start)."""
    said = re.findall(r"worker (\d+) is process (\d+)", gateway.log.read_text())
    return {int(index): int(pid) for index, pid in said}


def test_any_worker_serves_any_run_and_each_run_is_recorded_once(gateway: Served) -> None:
    with fresh() as client:
        runs = runs_on_both(client, gateway.base)
        private = {i: run["url"].split("/runs/")[0] for i, run in runs.items()}
        assert len(set(private.values()) | {gateway.base}) == 3  # a port of its own each
        expected: dict[int, list[tuple[list[int], list[int], list[float]]]] = {0: [], 1: []}
        for i, run in runs.items():
            other = private[1 - i]
            for n, url in enumerate(
                [
                    run["url"],  # straight to its worker
                    f"{other}/runs/{run['run_id']}/v1",  # the other one: handed over
                    f"{gateway.base}/runs/{run['run_id']}/v1",  # either
                    f"{gateway.base}/runs/{run['run_id']}/v1",
                ]
            ):
                streamed = n % 2 == 0
                answer = client.post(f"{url}/chat/completions", json={**BODY, "stream": streamed})
                assert answer.status_code == 200, answer.text
                expected[i].append(gateway.llm.tokens())
            # the token is checked by every worker, also for a request handed over
            refused = httpx.post(f"{other}/runs/{run['run_id']}/v1/chat/completions", json=BODY)
            assert refused.status_code == 401
            assert httpx.get(f"{private[i]}/runs/{run['run_id']}").status_code == 401
            shown = client.get(f"{other}/runs/{run['run_id']}").json()
            assert (shown["calls"], shown["trainable_turns"]) == (4, 4)
            rewarded = client.put(f"{other}/runs/{run['run_id']}/reward", json={"reward": i + 1})
            assert rewarded.status_code == 200 and rewarded.json()["reward"] == i + 1
            closed = client.post(f"{gateway.base}/runs/{run['run_id']}/close").json()
            assert closed["journal"].startswith(str(gateway.out / f"worker-{i}"))
            gone = client.post(
                f"{gateway.base}/runs/{run['run_id']}/v1/chat/completions", json=BODY
            )
            assert gone.status_code == 404
    for i, run in runs.items():
        (journaled,) = [
            t
            for t in Journal(gateway.out / f"worker-{i}").finished(0).values()
            if t.example_id == run["example_id"]
        ]
        assert journaled.reward == i + 1 and journaled.trainable_turns == 4
        for call, (prompt, sampled, logprobs) in zip(journaled.calls, expected[i], strict=True):
            (choice,) = call.choices
            assert list(call.prompt_token_ids or ()) == prompt
            assert list(choice.token_ids or ()) == sampled
            assert list(choice.logprobs or ()) == pytest.approx(logprobs, rel=1e-6)
        elsewhere = Journal(gateway.out / f"worker-{1 - i}").finished(0).values()
        assert run["example_id"] not in {t.example_id for t in elsewhere}


def test_a_second_gateway_cannot_join_the_workers_port(gateway: Served, tmp_path: Path) -> None:
    """SO_REUSEPORT would let another gateway's workers share the port, splitting the runs
    between two gateways that know nothing of each other: it is refused as a port in use."""
    port = gateway.base.rsplit(":", 1)[1]
    command = ["gateway", "--upstream", "http://127.0.0.1:9/v1", "--port", port, "--workers", "2"]
    second = subprocess.run(
        [sys.executable, "-m", "arttrace.app.cli", *command, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 2 and "Another process listens there" in second.stderr


def test_a_dead_worker_is_restarted_and_its_runs_say_they_are_lost(gateway: Served) -> None:
    with fresh() as client:
        run = runs_on_both(client, gateway.base)[1]
        assert client.post(f"{run['url']}/chat/completions", json=BODY).status_code == 200
        before = workers_of(gateway)
        os.kill(before[1], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while True:  # until the worker is back: its socket holds the requests meanwhile
            shown = client.get(f"{gateway.base}/runs/{run['run_id']}", timeout=90)
            if shown.status_code == 410 or time.monotonic() > deadline:
                break
        assert shown.status_code == 410 and "died and was restarted" in shown.text
        after = runs_on_both(client, gateway.base)[1]
        assert after["run_id"].startswith("w1g1.")  # the restarted worker serves new runs
        assert client.post(f"{after['url']}/chat/completions", json=BODY).status_code == 200
    assert f"worker 1 (pid {before[1]}) died (killed by SIGKILL)" in gateway.log.read_text()
    workers = workers_of(gateway)
    gateway.process.send_signal(signal.SIGTERM)
    out, _ = gateway.process.communicate(timeout=60)
    assert gateway.process.returncode == 0 and "stopped" in out
    for pid in workers.values():  # every worker has ended with it
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
