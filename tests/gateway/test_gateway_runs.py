"""Runs opened over HTTP (``POST /runs``), in-process and through ``arttrace gateway``: each
closed run is journaled as the Trainer journals its rollouts, and the Trainer can read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import arttrace as at
from arttrace._journal import Journal
from arttrace.gateway import Gateway
from arttrace.testing import ScriptedLLM, serve
from support.gateway import RecordingUpstream

BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def open_run(client: httpx.Client, base: str, **fields: Any) -> dict[str, Any]:
    response = client.post(f"{base}/runs", json=fields)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_runs_opened_over_http_are_journaled_for_the_trainer(tmp_path: Path) -> None:
    with (
        RecordingUpstream() as upstream,
        Gateway(upstream.base_url, out=tmp_path) as gateway,
        httpx.Client() as client,
    ):
        base = gateway.base_url
        runs = [open_run(client, base, example_id=e, metadata={"k": 1}) for e in "abab"]
        later = open_run(client, base, example_id="a", step=1)
        assert [r["slot"] for r in runs] == [[0, 0], [1, 0], [0, 1], [1, 1]]
        assert later["slot"] == [0, 0] and later["url"].endswith("/v1")
        for number, run in enumerate(runs):
            client.post(f"{run['url']}/chat/completions", json=BODY)
            shown = client.get(f"{base}/runs/{run['run_id']}").json()
            assert shown["calls"] == 1 and shown["trainable_turns"] == 1
            assert client.put(f"{base}/runs/{run['run_id']}/reward", json={"reward": number})
            closed = client.post(f"{base}/runs/{run['run_id']}/close", json={"metrics": {"m": 2}})
            assert closed.status_code == 200 and closed.json()["reward"] == number
            gone = client.post(f"{run['url']}/chat/completions", json=BODY)
            assert gone.status_code == 404
        with pytest.warns(at.NothingToTrainWarning, match="no call reached its gateway URL"):
            no_reward = client.post(f"{base}/runs/{later['run_id']}/close").json()
        assert "without a reward" in no_reward["warning"]
        assert "recorded no policy turn (no call reached its URL)" in no_reward["warning"]
        models_only = open_run(client, base, example_id="c", step=1)
        assert client.get(f"{models_only['url']}/models").status_code == 200
        with pytest.warns(at.NothingToTrainWarning, match="its gateway calls recorded no"):
            listed = client.post(f"{base}/runs/{models_only['run_id']}/close", json={"reward": 1})
        assert "recorded no policy turn (no call was a policy turn)" in listed.json()["warning"]

    journal = Journal(tmp_path)
    step0 = journal.finished(0)
    assert sorted(step0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [step0[s].example_id for s in sorted(step0)] == ["a", "a", "b", "b"]
    assert [step0[s].reward for s in sorted(step0)] == [0.0, 2.0, 1.0, 3.0]
    first = step0[0, 0]
    assert first.metadata == {"k": 1} and first.metrics == {"m": 2}
    assert first.trainable_turns == 1 and first.calls[0].streamed
    assert journal.finished(1)[0, 0].reward is None


def test_a_restarted_gateway_continues_the_steps_slots(tmp_path: Path) -> None:
    with RecordingUpstream() as upstream, httpx.Client() as client:
        for expected in ([0, 0], [0, 1]):
            with Gateway(upstream.base_url, out=tmp_path) as gateway:
                run = open_run(client, gateway.base_url, example_id="a")
                assert run["slot"] == expected
                client.post(f"{gateway.base_url}/runs/{run['run_id']}/close", json={"reward": 1})
    assert sorted(Journal(tmp_path).finished(0)) == [(0, 0), (0, 1)]


def test_the_run_api_says_what_is_wrong(tmp_path: Path) -> None:
    with (
        RecordingUpstream() as upstream,
        Gateway(upstream.base_url, out=tmp_path) as gateway,
        httpx.Client() as client,
    ):
        base = gateway.base_url

        def refused(method: str, path: str, status: int, match: str, **kw: Any) -> None:
            response = client.request(method, f"{base}{path}", **kw)
            assert response.status_code == status, response.text
            assert match in response.json()["error"]["message"]

        refused("POST", "/runs", 400, "example_id", json={"metadata": {}})
        json_body = {"Content-Type": "application/json"}
        refused("POST", "/runs", 400, "not JSON", content=b"{", headers=json_body)
        refused("POST", "/runs", 400, "metadata", json={"example_id": "a", "metadata": {"x": []}})
        refused("POST", "/runs", 400, "step", json={"example_id": "a", "step": -1})
        refused("PUT", "/runs/nope/reward", 404, "no open run", json={"reward": 1})
        run = open_run(client, base, example_id="a")
        refused("PUT", f"/runs/{run['run_id']}/reward", 400, "finite", json={"reward": "high"})
        refused("PUT", f"/runs/{run['run_id']}/reward", 400, "reward", json={})
        with at.trajectory("mine") as t:  # a run of the gateway's own process is ended there
            mine = gateway.url(t).split("/runs/")[1].removesuffix("/v1")
            refused("POST", f"/runs/{mine}/close", 409, "own process")
    with Gateway(upstream.base_url) as no_journal, httpx.Client() as client:
        response = client.post(f"{no_journal.base_url}/runs", json={"example_id": "a"})
        assert response.status_code == 409 and "--out" in response.json()["error"]["message"]


def test_one_writer_per_run_folder(tmp_path: Path) -> None:
    upstream = "http://127.0.0.1:9/v1"
    with Gateway(upstream, out=tmp_path), pytest.raises(RuntimeError, match="in use"):
        Gateway(upstream, out=tmp_path).start()


def test_the_arttrace_gateway_command(tmp_path: Path) -> None:
    with serve(ScriptedLLM()) as upstream:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "arttrace.app.cli",
                "gateway",
                "--upstream",
                upstream.base_url,
                "--port",
                "0",
                "--out",
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "ARTTRACE_GATEWAY_TOKEN": "gw-secret-42"},
        )
        try:
            assert process.stdout is not None and process.stderr is not None
            line = process.stdout.readline()
            assert "listening on http://127.0.0.1:" in line, line or process.stderr.read()
            base = line.split("listening on ")[1].split(" ")[0]
            auth = {"Authorization": "Bearer gw-secret-42"}
            with httpx.Client(headers=auth) as client:
                assert httpx.post(f"{base}/runs", json={"example_id": "a"}).status_code == 401
                run = open_run(client, base, example_id="q-7")
                answer = client.post(f"{run['url']}/chat/completions", json=BODY)
                assert answer.status_code == 200
                closed = client.post(f"{base}/runs/{run['run_id']}/close", json={"reward": 0.5})
                assert closed.json()["trainable_turns"] == 1
        finally:
            process.terminate()
            out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "stopped" in out and "gw-secret-42" not in out + err
    (journaled,) = Journal(tmp_path).finished(0).values()
    assert journaled.example_id == "q-7" and journaled.reward == 0.5
    assert journaled.trainable_turns == 1
