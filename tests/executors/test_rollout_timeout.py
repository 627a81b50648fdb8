"""``Trainer(rollout_timeout=...)``: a run whose LLM call never answers (a real server on
127.0.0.1 that holds the request) is stopped at the limit, in process and on a Ray worker;
it fails with the cause naming the limit and the fix, counts under ``max_exceptions``, and is
journaled with the calls it had recorded. A worker whose event loop is blocked is given up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import arttrace as at
from arttrace._asgi_server import ServerThread
from arttrace.executors import RayExecutor, _ray
from arttrace.testing import LLMServer, ScriptedLLM, serve
from support import timeout_agents
from support.ray_cluster import RayCluster, ray_cluster_fixture  # noqa: F401  (the fixture)
from support.trainer import RecordingBackend, journaled, make

LIMIT = 5.0
"""Long enough for a run's answered call on a loaded 2-core machine; the held call waits."""
GROUP = 4


@pytest.fixture(autouse=True)
def _instrumented(instrumented: None) -> None:
    pass


class Held:
    """An OpenAI-compatible server on 127.0.0.1 that reads each request and never answers."""

    def __init__(self) -> None:
        self.requests = 0
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/chat/completions", self._hold, methods=["POST"])])
        self._server = ServerThread(app, "127.0.0.1", 0, name="the held test server")
        self._server.start()
        self.url = "http://{}:{}/v1".format(*self._server.address)

    async def _hold(self, request: Request) -> Response:
        await request.body()
        with self._lock:
            self.requests += 1
        try:
            while not await request.is_disconnected():  # the caller waits for good
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:  # the server stops (a sync run's thread still waits)
            pass
        return Response(status_code=503)

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture(scope="module")
def held() -> Iterator[Held]:
    server = Held()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def answers() -> Iterator[LLMServer]:
    with serve(ScriptedLLM()) as server:
        yield server


def examples(answers: LLMServer, held: Held, n: int = 1, **more: Any) -> list[dict[str, Any]]:
    return [
        {"id": f"ex-{i}", "q": f"question {i}", "answers": answers.base_url, "held": held.url}
        | more
        for i in range(n)
    ]


def trainer(
    tmp_path: Path, rollout: Callable[..., Any], data: list[dict[str, Any]], **kw: Any
) -> at.Trainer[Any]:
    agent: Any = SimpleNamespace(rollout=rollout)  # what make() takes: an agent's rollout
    return make(
        tmp_path,
        agent,
        RecordingBackend(),
        train_dataset=data,
        groups_per_step=len(data),
        group_size=GROUP,
        **kw,
    )


def check_timed_out(out: Path, sync: bool = False) -> None:
    """The odd runs failed on the limit and kept their calls; the even ones finished."""
    lines = {line["slot"][1]: line["trajectory"] for line in journaled(out, 0)}
    assert sorted(lines) == list(range(GROUP))
    for k, t in lines.items():
        calls = t["calls"]
        if k % 2 == 0:
            assert t["exception"] is None and t["reward"] == k / 2
            assert len(calls) == 1 and calls[0]["error"] is None
            continue
        error = t["exception"]
        assert error["type"] == "RolloutTimeoutError", error
        message = error["message"]
        assert message.startswith(f"the run took longer than rollout_timeout={LIMIT:g} s and was")
        assert (
            "Trainer(rollout_timeout=...)" in message and "openai.AsyncOpenAI(timeout=" in message
        )
        assert ("sync rollout's thread cannot be stopped" in message) is sync
        said = "1 LLM call it made and 1 still waiting" if sync else "2 LLM calls it made"
        assert f"; kept with the run: {said}" in message, message
        # the calls so far are kept: the answered one, then the one left waiting
        assert len(calls) == 2, calls
        assert calls[0]["error"] is None and calls[0]["choices"], calls[0]
        assert calls[1]["error"] and calls[1]["choices"] == [], calls[1]
        assert calls[1]["messages"][-1]["content"] == "and now?"


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_run_past_the_limit_fails_with_the_cause_and_keeps_its_calls(
    tmp_path, answers, held, kind
):
    rollout = timeout_agents.held_async if kind == "async" else timeout_agents.held_sync
    before = held.requests
    t = trainer(tmp_path, rollout, examples(answers, held), rollout_timeout=LIMIT, max_exceptions=2)
    started = time.perf_counter()
    result = await t.step()
    seconds = time.perf_counter() - started
    t.close()
    assert held.requests - before == GROUP // 2  # the odd runs reached the held call
    assert seconds < LIMIT + 20, seconds  # not the client's 600 s
    assert result.metrics["exceptions"] == GROUP // 2
    assert result.metrics["groups_kept"] == 1
    check_timed_out(tmp_path / "out", sync=kind == "sync")
    store = at.open_run(tmp_path / "out")
    kinds = sorted(str(r.exception_type) for r in store.trajectories(limit=10))
    assert kinds == ["None", "None", "RolloutTimeoutError", "RolloutTimeoutError"]


async def test_past_max_exceptions_the_step_fails_naming_the_limit(tmp_path, answers, held):
    t = trainer(
        tmp_path,
        timeout_agents.held_async,
        examples(answers, held),
        rollout_timeout=LIMIT,
        max_exceptions=0,
    )
    with pytest.raises(at.TrainingError) as caught:
        await t.step()
    t.close()
    message = str(caught.value)
    assert "step 0: 2 of 4 rollouts raised" in message
    assert f"RolloutTimeoutError: the run took longer than rollout_timeout={LIMIT:g} s" in message
    check_timed_out(tmp_path / "out")  # journaled all the same, for reading and resume


async def test_validation_runs_have_the_limit_too(tmp_path, answers, held):
    data = examples(answers, held, 2)
    t = trainer(tmp_path, timeout_agents.held_async, data, rollout_timeout=LIMIT)
    t.val_dataset = data
    metrics = await t.validate()
    t.close()
    assert metrics["examples"] == 2 and metrics["exceptions"] == 0  # rollout 0: no held call


def test_rollout_timeout_must_be_a_positive_number(tmp_path, answers, held):
    for bad in (0, -1.0, float("nan"), "30", True):
        with pytest.raises(at.ConfigurationError, match="rollout_timeout must be a positive"):
            trainer(tmp_path, timeout_agents.held_async, examples(answers, held),
                    rollout_timeout=bad)  # fmt: skip
    assert issubclass(at.RolloutTimeoutError, TimeoutError)


# -- on Ray ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def on_ray(ray_cluster: RayCluster) -> Iterator[RayExecutor]:
    """Four one-CPU actors, shared by this module's Ray tests (a new bind keeps them)."""
    executor = RayExecutor(num_cpus=1, max_in_flight=GROUP)
    yield executor
    executor.close()


async def test_on_ray_the_worker_stops_the_run_and_sends_back_its_calls(
    tmp_path, answers, held, on_ray
):
    before = held.requests
    t = trainer(
        tmp_path,
        timeout_agents.held_async,
        examples(answers, held),
        rollout_timeout=LIMIT,
        max_exceptions=2,
        executor=on_ray,
    )
    started = time.perf_counter()
    result = await t.step()
    seconds = time.perf_counter() - started
    assert held.requests - before == GROUP // 2
    assert seconds < LIMIT + 20, seconds
    assert result.metrics["exceptions"] == GROUP // 2 and result.metrics["groups_kept"] == 1
    check_timed_out(tmp_path / "out")


async def test_on_ray_a_worker_whose_loop_is_blocked_is_given_up(
    tmp_path, answers, held, on_ray, monkeypatch
):
    """An async rollout that blocks its event loop (a sync sleep) cannot be stopped on its
    worker: the driver waits the grace period past the limit, replaces the worker, and the
    run fails with the cause; its calls are lost with the worker."""
    monkeypatch.setattr(_ray, "_TIMEOUT_GRACE", 5.0)
    t = trainer(
        tmp_path,
        timeout_agents.blocks_its_loop,
        examples(answers, held, block=600),
        rollout_timeout=LIMIT,
        max_exceptions=2,
        executor=on_ray,
    )
    started = time.perf_counter()
    result = await t.step()
    seconds = time.perf_counter() - started
    assert LIMIT + 5 <= seconds < LIMIT + 5 + 20, seconds
    assert result.metrics["exceptions"] == GROUP // 2
    lines = {line["slot"][1]: line["trajectory"] for line in journaled(tmp_path / "out", 0)}
    for k in (1, 3):
        error = lines[k]["exception"]
        assert error["type"] == "RolloutTimeoutError"
        assert error["message"].startswith(
            f"the run took longer than rollout_timeout={LIMIT:g} s, and its Ray worker did not "
            "stop it within 5 s more: the rollout blocks its worker's event loop"
        )
        assert "The worker was replaced" in error["message"] and lines[k]["calls"] == []
    assert all(lines[k]["exception"] is None for k in (0, 2))
