"""What pipelined training and Ray rollouts buy, each against its baseline in the same run.

1. Pipelined against synchronous steps: ``Trainer.train`` with ``max_steps_off_policy`` k = 1
   and 2 against k = 0. A step's rollouts take R and its training T, for R/T = 1/3, 1 and 3
   with R + T = 0.6 s: a backend whose ``train`` sleeps T (it answers ``_get_step`` as ART's
   do), and 2 groups x 4 rollouts per step, each making one short LLM call to the scripted
   server (a run needs a trainable token to ship) and then waiting until R has passed since
   it started. Rewards alternate within each group, so every group ships. ``max_concurrency``
   is one step's 8 rollouts: the rollout fleet does one step's worth at a time, so the ideal
   speed-up is (R + T) / max(R, T), at most 2x. Steps per hour two ways: over the whole run
   (from ``train()``'s call to the end of the last step's training: it includes filling the
   pipeline), next to the ideal of that schedule (simulated with no overhead); and in steady
   state, from the end of step 2's training to the end of the last (before it the pipeline
   fills and the first reward plot is waited for), next to (R + T) / max(R, T). Also: how
   long each step waited for the other side (the steps' ``trainer_wait_seconds`` and
   ``rollout_wait_seconds``), how stale the runs were (``off_policy_steps_mean``), and this
   process's CPU per step (it runs the LLM calls' client side and the Trainer's own work,
   on one event loop). The arms of one R/T run back
   to back, in rotating order, after an unmeasured warm-up run; ``--rounds N`` repeats them
   (medians of the per-round ratios).
2. Ray (``RayExecutor``), on a local Ray instance started here with 16 logical CPUs (the
   machine may have fewer cores: these rollouts wait more than they compute).
   a. Scaling: 4 x n rollouts that each wait 1 s (a sandbox, a remote model) submitted at
      once to ``RayExecutor(max_in_flight=n, num_cpus=1)`` directly (``executor.run``, as a
      Trainer step submits a step's rollouts; no Trainer, so only the executor is timed),
      for n = 1, 2, 4, 8, 16 workers (``--quick``: 1 and 8), after every actor has started
      and run once: runs per second against the ideal n per second, and against
      ``InProcessExecutor(n)`` on the same runs (measured while the Ray actors start: it only
      waits). Also the seconds from ``RayExecutor`` to all n actors started. Target:
      >= 0.8 x n up to 16.
   b. Added cost per rollout: the same rollout run one at a time through
      ``InProcessExecutor`` and through ``RayExecutor`` (one warm actor), in alternating
      blocks of 10; a trivial rollout (returns its reward at once) and one making a real LLM
      call to the scripted server (its own process, over loopback HTTP). p50 and p99 ms,
      the difference of the p50s, and this process's CPU per run. Then this process's CPU
      per trivial run when 16 and 512 are submitted at once to the one worker: what a
      waiting run costs the driver. Target: <= 5 ms p50.
   c. Driver memory per journaled token: Trainer steps of 4 groups x 8 rollouts, one LLM
      call each answered with 256 tokens, through a Trainer with each executor (4 in
      flight), arms alternating, after a warm-up step each. Under tracemalloc (Python
      allocations of this process; Ray's own C++ memory is not in it): what the finished
      runs hold and the peak so far when the rollouts end (before the conversion to ART),
      and the peak over the whole step. Then, in a step without tracemalloc, the growth of
      this process's peak RSS over the step (it sees Ray's memory too; the allocator makes
      it rough). Each per journaled completion token. Target: Ray / in-process <= 1.1 for
      the step's peak.

The scripted model (``arttrace.testing``) runs in its own process, so its CPU and memory are
not this process's. Importing ART (for the Trainer) and starting Ray are not timed. The
rollouts are defined in this script, so Ray sends them by value (cloudpickle).

    python bench/bench_scale.py [--quick] [--rounds N] [--only pipeline|ray|scaling|overhead|memory]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import gc
import importlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import openai

import arttrace as at
from arttrace.executors._rollout import RolloutRunner  # the executors' input (private)

step_module = importlib.import_module("arttrace.training._step")  # build_groups (private)

PER_STEP = (2, 4)  # section 1: groups per step, rollouts per group
CYCLE = 0.6  # section 1: R + T, seconds
MEMORY_STEP = (4, 8)  # section 2c
MEMORY_IN_FLIGHT = 4
LONG_REPLY_TOKENS = 256
QUEUED = (16, 512)  # section 2b: runs submitted at once to one worker

SERVER = """
import http.server, sys
from arttrace.testing import Reply, ScriptedLLM, serve
# SimpleChatTokenizer: 128 words and 127 spaces, and the end token: 256 sampled tokens
LONG = " ".join(f"w{i}" for i in range(128))
def reply(body):
    return Reply(LONG if body["messages"][-1]["content"].startswith("long") else "ok")
# each response in one send, as uvicorn (vLLM) does (see bench_trainer.py)
http.server.BaseHTTPRequestHandler.wbufsize = 1 << 16
with serve(ScriptedLLM(reply)) as server:
    print(server.base_url, flush=True)
    sys.stdin.read()  # until the bench closes it
"""


@contextlib.contextmanager
def model_server() -> Iterator[str]:
    """The scripted model in a process of its own; its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)


class Agent:
    """A rollout: one LLM call to the scripted model (answered with 256 tokens if ``long``,
    else a few), then a wait until ``seconds`` have passed since it started; its reward
    alternates within a group.

    Picklable for Ray: its client (one per event loop, kept across runs, as an agent keeps
    its client) is left out of the pickle."""

    def __init__(self, base_url: str, *, seconds: float = 0.0, long: bool = False) -> None:
        self.base_url, self.seconds = base_url, seconds
        self.prompt = "long" if long else "short"
        self._clients: dict[int, openai.AsyncOpenAI] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_clients": {}}

    def _client(self) -> openai.AsyncOpenAI:
        loop = id(asyncio.get_running_loop())
        if loop not in self._clients:
            self._clients[loop] = openai.AsyncOpenAI(
                base_url=self.base_url, api_key="bench", max_retries=0
            )
        return self._clients[loop]

    @at.trainable
    async def _ask(self, question: str) -> str:
        reply = await self._client().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"{self.prompt} {question}"}]
        )
        return reply.choices[0].message.content or ""

    async def __call__(self, example: dict[str, Any]) -> float:
        deadline = time.monotonic() + self.seconds
        await self._ask(example["q"])
        if (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(left)
        return float(int(str(at.current_trajectory().metadata["rollout"])) % 2)


class SleepingBackend:
    """An ART backend whose ``train`` takes ``seconds`` (a GPU step), recording when each
    call ended; it answers ``_get_step`` as ART's backends do."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ended: list[float] = []

    async def register(self, model: Any) -> None:
        pass

    async def _get_step(self, model: Any) -> int:
        return len(self.ended)

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        await asyncio.sleep(self.seconds)
        self.ended.append(time.perf_counter())
        return art.TrainResult(step=len(self.ended), metrics={})


def dataset(n: int) -> list[dict[str, Any]]:
    return [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(n)]


def make_trainer(
    out: Path, rollout: Any, backend: Any, per_step: tuple[int, int], **kwargs: Any
) -> at.Trainer[Any]:
    groups, size = per_step
    model: art.TrainableModel[Any] = art.TrainableModel(
        name="bench",
        run_name="bench",
        project="bench",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        base_path=str(out / ".art"),
    )
    return at.Trainer(
        model,
        backend,
        rollout,
        dataset(4 * groups),
        group_size=size,
        groups_per_step=groups,
        output_dir=out / "run",
        progress=False,
        log_to_model=False,
        **kwargs,
    )


# -- 1: pipelined against synchronous steps --------------------------------------------------


def ideal_ends(rollout: float, train: float, k: int, steps: int) -> list[float]:
    """When each step's training ends, with no overhead: step t's rollouts start once step
    t - k - 1 has trained (``Pipeline``'s rule) and the previous step's rollouts are done (the
    fleet does one step at a time); a step trains once its rollouts and the previous
    step's training are done."""
    rolled: list[float] = []
    trained: list[float] = []
    for t in range(steps):
        allowed = 0.0 if t <= k else trained[t - k - 1]
        rolled.append(max(allowed, rolled[-1] if rolled else 0.0) + rollout)
        trained.append(max(rolled[-1], trained[-1] if trained else 0.0) + train)
    return trained


STEADY_FROM = 2
"""Steady state is timed from the end of this step's training: before it, the pipeline fills
and the reward plot drawn after step 0 is waited for (``Reporter.report`` flushes it)."""


async def pipelined_arm(
    out: Path, url: str, rollout: float, train: float, k: int, steps: int
) -> dict[str, Any]:
    backend = SleepingBackend(train)
    groups, size = PER_STEP
    trainer = make_trainer(
        out,
        Agent(url, seconds=rollout),
        backend,
        PER_STEP,
        max_concurrency=groups * size,
        max_steps_off_policy=k,
    )
    started, cpu = time.perf_counter(), time.process_time()
    results = await trainer.train(num_steps=steps)
    returned, cpu = time.perf_counter(), time.process_time() - cpu
    trainer.close()
    ended = backend.ended
    assert len(ended) == steps, "every step shipped"
    later = [r.metrics for r in results[1:]]
    return {
        "whole": ended[-1] - started,
        "steady": (ended[-1] - ended[STEADY_FROM]) / (steps - 1 - STEADY_FROM),
        "tail": returned - ended[-1],
        "cpu": cpu / steps,
        "R": statistics.median(r.metrics["rollout_seconds"] for r in results),
        "T": statistics.median(r.metrics["train_seconds"] for r in results),
        "trainer_wait": statistics.mean(m["trainer_wait_seconds"] for m in later),
        "rollout_wait": statistics.mean(m["rollout_wait_seconds"] for m in later),
        "off_policy": statistics.mean(m["off_policy_steps_mean"] for m in later),
    }


def across(
    runs: list[dict[int, dict[str, Any]]], k: int, figure: str, ratio_to: int | None = None
) -> float:
    """The median over rounds of arm ``k``'s ``figure``, or of arm ``ratio_to``'s divided by
    it (paired per round)."""
    if ratio_to is None:
        return float(statistics.median(r[k][figure] for r in runs))
    return float(statistics.median(r[ratio_to][figure] / r[k][figure] for r in runs))


async def section_pipeline(url: str, steps: int, rounds: int, tmp: Path) -> None:
    total, ks = CYCLE, (0, 1, 2)
    print(
        f"\n1. Pipelined vs synchronous steps: {steps} steps of {PER_STEP[0]} groups x "
        f"{PER_STEP[1]} rollouts, R + T = {total} s, max_concurrency = one step's rollouts;"
        f" {rounds} round(s), medians (ratios: of the per-round ratios)"
    )
    # warm up: connections, the first plot (matplotlib's import), the first Trainer's imports
    await pipelined_arm(tmp / "warm", url, 0.05, 0.05, 1, 4)
    print(
        "                             whole run              "
        f"steady state (from step {STEADY_FROM})     mean wait s\n"
        "  R/T   k  rollouts s  train s  steps/h  vs k=0  ideal   steps/h  vs k=0  ideal"
        "   trainer  rollouts  off-policy"
    )
    targets: list[tuple[str, list[float], float]] = []
    tails: list[float] = []
    arm = 0
    for ratio in (1 / 3, 1.0, 3.0):
        rollout = total * ratio / (1 + ratio)
        train = total - rollout
        runs: list[dict[int, dict[str, Any]]] = []
        for _ in range(rounds):
            rows: dict[int, dict[str, Any]] = {}
            for k in ks[arm % 3 :] + ks[: arm % 3]:  # rotating order
                rows[k] = await pipelined_arm(tmp / f"{arm}-{k}", url, rollout, train, k, steps)
                tails.append(rows[k]["tail"])
            runs.append(rows)
            arm += 1
        median = functools.partial(across, runs)

        synchronous = ideal_ends(rollout, train, 0, steps)
        for k in ks:
            ends = ideal_ends(rollout, train, k, steps)
            ideal_whole = synchronous[-1] / ends[-1]
            ideal_steady = (synchronous[-1] - synchronous[STEADY_FROM]) / (
                ends[-1] - ends[STEADY_FROM]
            )
            print(
                f"  {ratio:4.2f}  {k}  {median(k, 'R'):10.3f}  {median(k, 'T'):7.3f}"
                f"  {3600 * steps / median(k, 'whole'):7.0f}  {median(k, 'whole', 0):5.2f}x"
                f" {ideal_whole:5.2f}x  {3600 / median(k, 'steady'):7.0f}"
                f"  {median(k, 'steady', 0):5.2f}x {ideal_steady:5.2f}x"
                f"   {median(k, 'trainer_wait'):7.3f}  {median(k, 'rollout_wait'):8.3f}"
                f"  {median(k, 'off_policy'):10.2f}"
            )
            if ratio == 1.0 and k == 1:
                targets += [
                    ("whole run", [r[0]["whole"] / r[1]["whole"] for r in runs], ideal_whole),
                    ("steady state", [r[0]["steady"] / r[1]["steady"] for r in runs], ideal_steady),
                ]
        overhead = 1000 * (median(0, "steady") - total)
        cpu = ", ".join(f"{1000 * median(k, 'cpu'):.0f}" for k in ks)
        print(
            f"        k=0: each step took {overhead:.0f} ms more than R + T;"
            f" this process's CPU per step, k = 0, 1, 2: {cpu} ms"
        )
    for what, got, ideal in targets:
        verdict = "PASS" if round(statistics.median(got), 2) >= 1.8 else "MISS"
        print(
            f"  R = T, k = 1, {what}: {statistics.median(got):.2f}x k=0 (ideal {ideal:.2f}x)"
            f"   target >= 1.8x  {verdict}"
            + (f"   rounds: {', '.join(f'{g:.2f}' for g in got)}" if rounds > 1 else "")
        )
    print(
        f"  after the last step, train() took {1000 * statistics.median(tails):.0f} ms more"
        " (median; the final reward plot), not counted above"
    )


# -- 2: Ray --------------------------------------------------------------------------------


async def waiting(example: dict[str, Any]) -> float:
    """A rollout that waits ``example["wait"]`` seconds (a sandbox, a remote model) and
    calls no model; it imports nothing an actor would not have (no openai)."""
    if example["wait"]:
        await asyncio.sleep(example["wait"])
    return float(int(str(at.current_trajectory().metadata["rollout"])) % 2)


def start_ray(cpus: int, temp: str) -> None:
    """A local Ray of this benchmark's own, on loopback only: Ray binds 127.0.0.1 alone for
    a node at that address, which it uses when told Ray is for this machine alone
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; else it binds every interface at the machine's
    network address). Nothing of it is reachable from the network, so token authentication
    stays off (nothing written to ~/.ray)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when Ray is imported
    import ray

    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # in case Ray was imported before
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        object_store_memory=200 * 2**20,
        _temp_dir=temp,
    )


def bound_ray(rollout: Any, n: int, examples: list[dict[str, Any]]) -> tuple[Any, float]:
    """A RayExecutor of ``n`` actors, bound, once every actor has started; and the seconds
    that took."""
    import ray

    started = time.perf_counter()
    executor = at.RayExecutor(max_in_flight=n, num_cpus=1)
    executor.bind(RolloutRunner(rollout, None, n), examples, n)
    assert executor._pool is not None
    ray.get([member.ready for member in executor._pool.members])  # all started (private)
    return executor, time.perf_counter() - started


def bound_local(rollout: Any, n: int, examples: list[dict[str, Any]]) -> at.InProcessExecutor:
    executor = at.InProcessExecutor(n)
    executor.bind(RolloutRunner(rollout, None, n), examples, n)
    return executor


async def run_many(executor: Any, examples: list[dict[str, Any]], count: int) -> float:
    """Wall seconds for ``count`` rollouts submitted at once (as a Trainer step submits
    them: the executor bounds how many run); each must succeed."""
    started = time.perf_counter()
    runs = await asyncio.gather(
        *(
            executor.run(e["id"], e, functools.partial(dict, split="train", step=0, rollout=i))
            for i in range(count)
            for e in [examples[i % len(examples)]]
        )
    )
    wall = time.perf_counter() - started
    failed = [t.exception for t in runs if t.exception is not None]
    assert not failed, failed[0]
    return wall


async def section_scaling(workers: list[int], per_worker: int) -> None:
    print(
        f"\n2a. Scaling: {per_worker} x n rollouts submitted at once, each waiting 1 s, through "
        "the executor directly (executor.run), after every actor has started and run once"
    )
    print(
        "  workers  actors start s  Ray runs/s  / n   in-process runs/s  / n"
        "   Ray / in-process   target (Ray / n)"
    )
    examples = [{"id": f"ex-{i}", "wait": 1.0} for i in range(16)]
    for n in workers:
        # the actors start (other processes) while the in-process arm runs (it only waits)
        binding = asyncio.ensure_future(asyncio.to_thread(bound_ray, waiting, n, examples))
        local = bound_local(waiting, n, examples)
        local_rate = per_worker * n / await run_many(local, examples, per_worker * n)
        ray_executor, startup = await binding
        await run_many(ray_executor, examples, n)  # each actor's first run (instrument())
        ray_rate = per_worker * n / await run_many(ray_executor, examples, per_worker * n)
        ray_executor.close()
        verdict = "PASS" if ray_rate >= 0.8 * n else "MISS"
        print(
            f"  {n:7d}  {startup:14.1f}  {ray_rate:10.2f}  {ray_rate / n:4.2f}"
            f"   {local_rate:17.2f}  {local_rate / n:4.2f}   {ray_rate / local_rate:16.2f}"
            f"   >= 0.8  {verdict}"
        )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def section_overhead(count: int, url: str) -> None:
    print(
        f"\n2b. Added cost per rollout: {count} runs per arm, one at a time, in alternating"
        " blocks of 10 (after 20 to warm up); Ray: one actor"
    )
    print(
        "  rollout         in-process p50 / p99 ms   Ray p50 / p99 ms   Ray - in-process p50"
        "   this process's CPU per run ms: in-process, Ray"
    )
    examples = [{"id": f"ex-{i}", "q": f"question {i}", "wait": 0.0} for i in range(4)]
    for name, rollout in (("trivial", waiting), ("one LLM call", Agent(url))):
        arms = {
            "in-process": bound_local(rollout, 1, examples),
            "Ray": bound_ray(rollout, 1, examples)[0],
        }
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        cpu: dict[str, float] = dict.fromkeys(arms, 0.0)
        for executor in arms.values():
            for i in range(20):
                await executor.run("warm", examples[0], functools.partial(dict, rollout=i))
        for block in range(count // 10):
            for arm in list(arms) if block % 2 else list(arms)[::-1]:
                started_cpu = time.process_time()
                for i in range(10):
                    started = time.perf_counter()
                    t = await arms[arm].run(
                        "x", examples[i % 4], functools.partial(dict, rollout=i)
                    )
                    times[arm].append(time.perf_counter() - started)
                    assert t.exception is None, t.exception
                cpu[arm] += time.process_time() - started_cpu
        if rollout is waiting:
            queued = {arm: await queueing(executor, examples) for arm, executor in arms.items()}
        arms["Ray"].close()
        local, ray_ = times["in-process"], times["Ray"]
        added = 1000 * (statistics.median(ray_) - statistics.median(local))
        verdict = "PASS" if added <= 5 else "MISS"
        p50, p99 = statistics.median, functools.partial(percentile, q=0.99)
        print(
            f"  {name:14s}  {ms(p50(local)):8.2f} / {ms(p99(local)):6.2f}"
            f"        {ms(p50(ray_)):6.2f} / {ms(p99(ray_)):6.2f}"
            f"  {added:8.2f} ms  <= 5 {verdict}"
            f"   {ms(cpu['in-process'] / len(local)):6.2f}, {ms(cpu['Ray'] / len(ray_)):6.2f}"
        )
    print(
        "  this process's CPU per trivial run when all are submitted at once (one actor; the"
        " others wait in the executor):"
    )
    for arm, figures in queued.items():
        shown = ", ".join(f"{count} at once {ms(cpu):.3f} ms" for count, cpu in figures.items())
        print(f"    {arm:10s}  {shown}")


def ms(seconds: float) -> float:
    return 1000 * seconds


async def queueing(executor: Any, examples: list[dict[str, Any]]) -> dict[int, float]:
    """This process's CPU seconds per run when ``count`` runs are submitted at once to an
    executor that runs one at a time: what each waiting run costs the driver."""
    cpu = {}
    for count in QUEUED:
        started = time.process_time()
        await run_many(executor, examples, count)
        cpu[count] = (time.process_time() - started) / count
    return cpu


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def settle() -> None:
    """Collect, and hand freed memory back to the system, so each measurement starts low."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RolloutsDone:
    """tracemalloc's figures when a step's rollouts have all finished (``build_groups``
    starts converting them to ART): the peak so far, and what is still allocated after a
    full collection (the finished runs, and whatever else the rollouts left)."""

    def __init__(self) -> None:
        self.current = self.peak = 0
        original = step_module.build_groups

        def marked(*args: Any) -> Any:
            if tracemalloc.is_tracing():
                self.peak = tracemalloc.get_traced_memory()[1]
                gc.collect()  # what the runs hold, not garbage the collector has not reached
                self.current = tracemalloc.get_traced_memory()[0]
            return original(*args)

        setattr(step_module, "build_groups", marked)  # noqa: B010  (a module's name)


async def measured_step(trainer: at.Trainer[Any], done: RolloutsDone) -> dict[str, float]:
    """One step under tracemalloc, then one step without it (peak RSS), in bytes per
    journaled completion token. The step's report (its plot, when one is due) runs after
    the measurement: ``flush`` waits for it outside."""
    settle()
    tracemalloc.start()
    result = await trainer.step()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    await trainer.flush()
    traced_tokens = int(result.metrics["trainable_tokens"])
    del result
    settle()
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM)
    before = status_kib("VmRSS")
    result = await trainer.step()
    rss = 1024 * (status_kib("VmHWM") - before)
    await trainer.flush()
    tokens = int(result.metrics["trainable_tokens"])
    return {
        "held when the rollouts finish": done.current / traced_tokens,
        "peak during the rollouts": done.peak / traced_tokens,
        "peak during the step": peak / traced_tokens,
        "peak RSS growth over the step": rss / tokens,
    }


async def section_memory(rounds: int, url: str, tmp: Path) -> None:
    groups, size = MEMORY_STEP
    print(
        f"\n2c. Driver memory per journaled token: Trainer steps of {groups} groups x {size}"
        f" rollouts, one {LONG_REPLY_TOKENS}-token LLM call each, {MEMORY_IN_FLIGHT} in flight;"
        f" {rounds} round(s) of one traced and one untraced step per arm, arms alternating"
    )
    rollout = Agent(url, long=True)
    trainers = {
        "in-process": make_trainer(
            tmp / "m-local",
            rollout,
            SleepingBackend(0.0),
            MEMORY_STEP,
            max_concurrency=MEMORY_IN_FLIGHT,
        ),
        "Ray": make_trainer(
            tmp / "m-ray",
            rollout,
            SleepingBackend(0.0),
            MEMORY_STEP,
            max_concurrency=MEMORY_IN_FLIGHT,
            executor=at.RayExecutor(max_in_flight=MEMORY_IN_FLIGHT, num_cpus=1),
        ),
    }
    for trainer in trainers.values():
        await trainer.step()  # warm: connections, actors, the first step's allocations
        await trainer.flush()  # and its report: the first plot
    done = RolloutsDone()
    figures: dict[str, list[dict[str, float]]] = {arm: [] for arm in trainers}
    for r in range(rounds):
        for arm in list(trainers) if r % 2 == 0 else list(trainers)[::-1]:
            figures[arm].append(await measured_step(trainers[arm], done))
    for trainer in trainers.values():
        trainer.close()
    print(
        f"  {MEMORY_STEP[0] * MEMORY_STEP[1] * LONG_REPLY_TOKENS} completion tokens journaled"
        " per step\n  bytes per journaled token (median)  in-process     Ray   Ray / in-process"
    )
    for what in figures["in-process"][0]:
        local = statistics.median(f[what] for f in figures["in-process"])
        ray_ = statistics.median(f[what] for f in figures["Ray"])
        ratio = ray_ / local if local > 0 else float("nan")
        verdict = "target <= 1.1  " + ("PASS" if ratio <= 1.1 else "MISS")
        print(
            f"  {what:33s} {local:10.0f} {ray_:7.0f}   {ratio:6.2f}"
            f"   {verdict if what == 'peak during the step' else ''}"
        )


def process_age() -> float:
    """Seconds since this process started (Linux /proc)."""
    started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK")


async def main(args: argparse.Namespace) -> None:
    at.instrument()
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} logical CPUs, load average {load[0]:.2f}; "
        f"{'--quick' if args.quick else 'full run'}"
    )
    with model_server() as url, tempfile.TemporaryDirectory(prefix="bs-", dir="/tmp") as tmp:
        if args.only in (None, "pipeline"):
            started = time.perf_counter()
            await section_pipeline(url, 6 if args.quick else 12, args.rounds, Path(tmp))
            print(f"  ({time.perf_counter() - started:.0f} s)")
        ray_parts = {"ray": ("scaling", "overhead", "memory")}.get(args.only, (args.only,))
        if args.only is None or args.only != "pipeline":
            started = time.perf_counter()
            start_ray(16, str(Path(tmp) / "ray"))
            took = time.perf_counter() - started
            print(f"\nRay: a local instance with 16 logical CPUs started in {took:.1f} s")
            parts = {
                "scaling": functools.partial(
                    section_scaling, [1, 8] if args.quick else [1, 2, 4, 8, 16], 4
                ),
                "overhead": functools.partial(section_overhead, 60 if args.quick else 300, url),
                "memory": functools.partial(section_memory, 1 if args.quick else 2, url, Path(tmp)),
            }
            for name, part in parts.items():
                if args.only is None or name in ray_parts:
                    started = time.perf_counter()
                    await part()
                    print(f"  ({time.perf_counter() - started:.0f} s)")
            import ray

            ray.shutdown()
    load = os.getloadavg()
    took = process_age()
    print(f"\nload average at the end {load[0]:.2f}; {took:.0f} s in all, importing ART included")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer steps, workers and runs")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of section 1's arms (tighter figures)"
    )
    parser.add_argument(
        "--only",
        choices=("pipeline", "ray", "scaling", "overhead", "memory"),
        help="one section (ray: scaling, overhead and memory)",
    )
    asyncio.run(main(parser.parse_args()))
