"""How much of a training step is the Trainer's own work.

One step of 64 groups x 8 rollouts: an instrumented OpenAI-SDK agent (two LLM calls per run, a
tool call in between) against arttrace.testing's server on 127.0.0.1, in its own process, and a
backend that returns at once. This process is CPU-bound (the server answers in well under a
millisecond and uses ~20% of a core), so every millisecond the Trainer spends is a millisecond
of step. The run reports how busy this process, the server and any other process were.

Two measurements, in the same rounds:

- Direct: the Trainer's phases are timed where they run. Journal writes, the progress bar,
  conversion to ART (`Trajectory.to_art`), the garbage collector's passes between the
  conversion and the end of the step, freeing the step's ART objects, grouping, bookkeeping
  (step wall - rollouts - backend - the above: metrics, state files), and the background
  report (model.log; the plot's CPU time in its thread). trainer share = own time / wall of
  step + flush, summed over the rounds.
- Difference of walls: the same 512 rollouts as a bare `asyncio.gather` of `arttrace.trajectory`
  blocks (same concurrency bound, no conversion) against `Trainer.step()` + `flush()`, arms
  alternating first, paired per round; the same with process CPU time. It also sees what the
  Trainer costs inside the rollouts (the collector walking objects it holds), which the direct
  method cannot.

One Trainer runs all rounds' steps, as in a training run (its plot is redrawn at most every
30 s), after a step and a bare run to warm up. The torch objects `import art` brings are frozen
out of the garbage collector (`gc.freeze()`, `--no-freeze` to keep them in). Peak memory:
tracemalloc's peak during one more step (Python allocations), and the process's peak RSS.

    python bench/bench_trainer.py [--rounds N] [--no-freeze]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import http.server
import importlib
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import openai

import arttrace as at
from arttrace._journal import Journal
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

# where the Trainer's phases live (private modules: the bench follows them when they move)
step_module = importlib.import_module("arttrace.training._step")  # build_groups
report_module = importlib.import_module("arttrace.training._report")  # tqdm, reward_plot
trajectory_module = importlib.import_module("arttrace.capture._trajectory")

GROUPS, GROUP_SIZE, CONCURRENCY = 64, 8, 64
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


class InstantBackend:
    async def register(self, model: Any) -> None:
        pass

    async def train(self, model: Any, groups: Any, **kwargs: Any) -> art.TrainResult:
        return art.TrainResult(step=1, metrics={})


def responder(request: dict[str, Any]) -> Reply:
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"The answer is {last['content']}. " + "Some more words to answer. " * 8)
    return Reply(tool_calls=[ToolCall("lookup", {"q": last["content"]})])


def make_rollout(client: openai.AsyncOpenAI, models: tuple[str, str] = ("p", "p")) -> Any:
    """The agent: a call that asks for a tool to ``models[0]``, the answer from ``models[1]``."""

    @at.trainable
    async def agent(question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        first = await client.chat.completions.create(
            model=models[0], messages=messages, tools=TOOLS
        )
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages += [
            first.choices[0].message,
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        final = await client.chat.completions.create(
            model=models[1], messages=messages, tools=TOOLS
        )
        return final.choices[0].message.content or ""

    async def rollout(example: dict[str, Any]) -> float:
        answer = await agent(example["q"])
        return float(hash((example["id"], answer, time.perf_counter_ns())) % 2)

    return rollout


class Probe:
    """Seconds spent in wrapped functions, by phase: wall time on the event loop, CPU time
    (``thread_time``) for what runs in a worker thread."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.cpu: Counter[str] = Counter()
        """The same phases in CPU time of the thread they ran in (steady on a busy machine)."""
        self.calls: Counter[str] = Counter()

    def wrap(self, owner: Any, name: str, phase: str, clock: Callable[[], float]) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = clock(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += clock() - started
                self.cpu[phase] += time.thread_time() - cpu
                self.calls[phase] += 1

        setattr(owner, name, timed)

    def wrap_async(self, owner: Any, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return await original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started
                self.cpu[phase] += time.thread_time() - cpu
                self.calls[phase] += 1

        setattr(owner, name, timed)

    def take(self) -> tuple[Counter[str], Counter[str], Counter[str]]:
        seconds, cpu, calls = self.seconds, self.cpu, self.calls
        self.seconds, self.cpu, self.calls = Counter(), Counter(), Counter()
        return seconds, cpu, calls


PROBE = Probe()


class GCTimer:
    """Seconds spent in garbage collection, and how many full collections, via gc.callbacks."""

    def __init__(self) -> None:
        self.seconds, self.full = 0.0, 0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        out = self.seconds, self.full
        self.seconds, self.full = 0.0, 0
        return out


GC = GCTimer()


def install_probes() -> None:
    wall, cpu = time.perf_counter, time.thread_time
    PROBE.wrap(Journal, "record", "journal", wall)
    PROBE.wrap(step_module, "build_groups", "grouping", wall)
    PROBE.wrap(trajectory_module.Trajectory, "to_art", "to_art", wall)  # inside grouping
    groups = step_module.build_groups

    def grouped(*args: Any) -> Any:  # mark the collector's clock when the ART objects exist
        try:
            return groups(*args)
        finally:
            PROBE.seconds["gc at grouped"] = GC.seconds

    step_module.build_groups = grouped
    bar = report_module.text_bar  # the progress bar class the Trainer draws with
    for method in ("__init__", "update", "set_postfix", "close"):
        PROBE.wrap(bar, method, "progress", wall)
    PROBE.wrap(report_module, "reward_plot", "plot", cpu)  # in a worker thread
    PROBE.wrap_async(art.TrainableModel, "log", "model.log")
    PROBE.wrap_async(step_module, "finish", "finish")  # CPU: grouping, shipping, bookkeeping


def proc_cpu(pid: int | None = None) -> float | None:
    """CPU seconds used so far by process ``pid``, or by the whole machine (Linux /proc;
    None elsewhere)."""
    try:
        if pid is None:
            user, nice, system = Path("/proc/stat").read_text().split()[1:4]
            return (int(user) + int(nice) + int(system)) / os.sysconf("SC_CLK_TCK")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bare(rollout: Any, examples: list[dict[str, Any]]) -> None:
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def one(example: dict[str, Any]) -> None:
        async with semaphore, at.trajectory(example["id"]) as t:
            t.reward = await rollout(example)

    await asyncio.gather(*(one(e) for e in examples for _ in range(GROUP_SIZE)))


def make_trainer(rollout: Any, examples: list[dict[str, Any]], out: Path) -> at.Trainer:
    model = art.TrainableModel(
        name="bench",
        project="bench",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="bench",
        base_path=str(out / ".art"),
    )
    return at.Trainer(
        model,
        InstantBackend(),
        rollout,
        examples,
        group_size=GROUP_SIZE,
        groups_per_step=len(examples),
        max_concurrency=CONCURRENCY,
        output_dir=out / "run",
        progress=True,
        log_to_model=True,
    )


async def trainer_step(trainer: at.Trainer) -> dict[str, float]:
    """One step and its background report; the direct breakdown of the Trainer's own time."""
    PROBE.take()
    started, process_cpu = time.perf_counter(), time.process_time()
    result = await trainer.step()
    stepped, collector = time.perf_counter(), GC.seconds
    metrics = result.metrics
    freeing_cpu = time.thread_time()
    del result  # the last reference to the step's ART objects: time their freeing
    freeing = time.perf_counter() - stepped
    freeing_cpu = time.thread_time() - freeing_cpu
    await trainer.flush()  # its model.log and plot (when due) count too
    wall, process_cpu = time.perf_counter() - started, time.process_time() - process_cpu
    seconds, cpu, calls = PROBE.take()
    own_cpu = (
        cpu["journal"] + cpu["progress"] + cpu["finish"] + freeing_cpu + cpu["plot"]
    )  # model.log's CPU is in the event loop's, between its awaits: left out (< 1 ms)
    to_art = seconds["to_art"]
    collector -= seconds["gc at grouped"]
    phases = {
        "journal writes": seconds["journal"],
        "progress bar": seconds["progress"],
        "conversion to ART": to_art,
        "collector on the ART objects": collector,
        "freeing the ART objects": freeing,
        "grouping (less conversion)": seconds["grouping"] - to_art,
        "bookkeeping": (stepped - started)
        - metrics["rollout_seconds"]
        - metrics["train_seconds"]
        - seconds["grouping"]
        - collector,
        "plot (thread CPU)": seconds["plot"],
        "model.log": seconds["model.log"],
    }
    return {
        **phases,
        "own": sum(phases.values()),
        "wall": wall,
        "plots": calls["plot"],
        "own cpu": own_cpu,
        "process cpu": process_cpu,
        "conversion cpu": cpu["to_art"],
        "journal cpu": cpu["journal"],
    }


def run_server(port: Any) -> None:
    """The scripted model in its own process, so its CPU time is not the trainer's.

    Its handler writes each response in one send, as uvicorn (vLLM) does: the stock
    http.server handler sends the headers and the body apart, which made this process's
    per-request cost vary by +-12% from round to round (and ~35% higher)."""
    http.server.BaseHTTPRequestHandler.wbufsize = 1 << 16  # flushed once, after each request
    with serve(ScriptedLLM(responder)) as server:
        port.put(server.base_url)
        while True:
            time.sleep(3600)


async def timed(arm: Any, server_pid: int) -> tuple[Any, ...]:
    """``arm()``'s wall and process CPU seconds, the server's and the other processes' CPU
    seconds meanwhile (None without /proc), its result, and the garbage collector's
    (seconds, full collections)."""
    gc.collect()
    GC.take()
    machine, server = proc_cpu(), proc_cpu(server_pid)
    mine = proc_cpu(os.getpid())
    cpu, wall = time.process_time(), time.perf_counter()
    result = await arm()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = proc_cpu(), proc_cpu(server_pid), proc_cpu(os.getpid())
    server_cpu = others = None
    if None not in (machine, server, mine, *after):
        server_cpu = after[1] - server  # type: ignore[operator]
        others = after[0] - machine - server_cpu - (after[2] - mine)  # type: ignore[operator]
    return wall, cpu, server_cpu, result, GC.take(), others


async def main(rounds: int, freeze: bool) -> None:
    at.instrument()
    install_probes()
    examples = [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(GROUPS)]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    server = context.Process(target=run_server, args=(queue,), daemon=True)
    server.start()
    base_url = queue.get(timeout=900)  # the spawned server imports this module (ART: slow)
    assert server.pid is not None
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        rollout = make_rollout(client)
        trainer = make_trainer(rollout, examples, Path(tmp) / "train")
        await bare(rollout, examples)  # warm up: connections, imports, the heap's size
        await trainer.step()  # and the Trainer's first step, with its first plot
        await trainer.flush()
        if freeze:
            gc.collect()
            gc.freeze()  # the ~650k objects `import art` brings (torch): see the docstring
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            row: dict[str, Any] = {}
            for arm in ("bare", "trainer") if r % 2 else ("trainer", "bare"):
                if arm == "bare":
                    row["bare"] = await timed(lambda: bare(rollout, examples), server.pid)
                else:
                    row["trainer"] = await timed(lambda: trainer_step(trainer), server.pid)
            rows.append(row)
        gc.collect()
        tracemalloc.start()
        await trainer.step()
        await trainer.flush()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        await client.close()
    server.terminate()
    report(rows, peak, load_before, os.getloadavg(), freeze)


def report(
    rows: list[dict[str, Any]],
    peak: int,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
    freeze: bool,
) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    direct = [row["trainer"][3] for row in rows]
    bare_wall = [row["bare"][0] for row in rows]
    step_wall = [row["trainer"][0] for row in rows]
    wall_diff = [(t - b) / t for t, b in zip(step_wall, bare_wall, strict=True)]
    cpu_diff = [(row["trainer"][1] - row["bare"][1]) / row["trainer"][1] for row in rows]
    shares = [d["own"] / d["wall"] for d in direct]
    total_wall = sum(d["wall"] for d in direct)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(
        f"one step: {GROUPS} groups x {GROUP_SIZE} rollouts, 2 LLM calls each, over loopback"
        f" HTTP; max_concurrency={CONCURRENCY}; {len(rows)} rounds;"
        f" gc.freeze {'on' if freeze else 'off'}; load average {load_before[0]:.2f} -> "
        f"{load_after[0]:.2f}"
    )
    print(f"  rounds, ms: bare {[round(1000 * w) for w in bare_wall]}")
    print(f"          trainer {[round(1000 * w) for w in step_wall]}")
    for arm in ("bare", "trainer"):
        walls = [row[arm][0] for row in rows]
        client = median([row[arm][1] / row[arm][0] for row in rows])
        servers = [row[arm][2] / row[arm][0] for row in rows if row[arm][2] is not None]
        server = f"{100 * median(servers):.0f}%" if servers else "n/a"
        busy = [row[arm][5] / row[arm][0] for row in rows if row[arm][5] is not None]
        others = f"{100 * median(busy):.0f}%" if busy else "n/a"
        collected = median([row[arm][4][0] for row in rows])
        full = median([row[arm][4][1] for row in rows])
        print(
            f"  {arm:8s} wall {1000 * median(walls):6.0f} ms;"
            f" CPU busy: this process {100 * client:.0f}%, server {server},"
            f" other processes {others}; gc {1000 * collected:.0f} ms ({full:.0f} full)"
        )
    print("  the Trainer's own time per step (direct), mean ms:")
    extra = ("own", "wall", "plots", "own cpu", "process cpu", "conversion cpu", "journal cpu")
    for phase in [k for k in direct[0] if k not in extra]:
        print(f"    {phase:30s} {1000 * statistics.mean([d[phase] for d in direct]):7.1f}")
    print(
        f"    {'total':30s} {1000 * statistics.mean([d['own'] for d in direct]):7.1f}"
        f"   (plot drawn in {sum(d['plots'] for d in direct):.0f} of {len(direct)} steps)"
    )
    share = sum(d["own"] for d in direct) / total_wall
    art_objects = (
        sum(
            d["conversion to ART"]
            + d["collector on the ART objects"]
            + d["freeing the ART objects"]
            for d in direct
        )
        / total_wall
    )
    print(
        f"  trainer share of step wall (direct), all in   {100 * share:5.1f} %"
        f"  [rounds {100 * min(shares):.1f} .. {100 * max(shares):.1f}]"
        f"   target <= 5%  {'PASS' if share <= 0.05 else 'MISS'}"
    )
    print(
        f"    making, collecting, freeing the ART objects {100 * art_objects:5.1f} %"
        "   (any loop that ships to ART does it)"
    )
    rest = share - art_objects
    print(
        f"    the rest: journal, progress, plot, ...      {100 * rest:5.1f} %"
        f"                  target <= 5%  {'PASS' if rest <= 0.05 else 'MISS'}"
    )
    print(
        f"  trainer share, difference of walls          {100 * median(wall_diff):5.1f} %"
        f"  [{100 * min(wall_diff):.1f} .. {100 * max(wall_diff):.1f}]"
    )
    print(
        f"  trainer share, difference of CPU times      {100 * median(cpu_diff):5.1f} %"
        f"  [{100 * min(cpu_diff):.1f} .. {100 * max(cpu_diff):.1f}]"
    )
    own_cpu = sum(d["own cpu"] for d in direct)
    cpu_shares = [d["own cpu"] / d["process cpu"] for d in direct]
    print(
        f"  trainer share of the step's CPU (its own CPU / this process's CPU over step + "
        f"flush) {100 * own_cpu / sum(d['process cpu'] for d in direct):5.1f} %"
        f"  [rounds {100 * min(cpu_shares):.1f} .. {100 * max(cpu_shares):.1f}]"
    )
    rounds = len(direct)
    print(
        f"    own CPU per step {1000 * own_cpu / rounds:.0f} ms (conversion to ART "
        f"{1000 * sum(d['conversion cpu'] for d in direct) / rounds:.0f}, journal "
        f"{1000 * sum(d['journal cpu'] for d in direct) / rounds:.0f}); this process's CPU "
        f"per step {1000 * sum(d['process cpu'] for d in direct) / rounds:.0f} ms"
    )
    print(f"  peak Python memory during a step (tracemalloc)  {peak / 2**20:8.1f} MiB")
    print(f"  peak RSS of the process                          {rss:8.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-freeze", action="store_true", help="leave gc.freeze() out")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, not args.no_freeze))
