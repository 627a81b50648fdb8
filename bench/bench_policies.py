"""The Trainer's share of a step with two policies against one, per policy.

The agent of ``bench_trainer.py`` (two LLM calls per run, a tool call in between, against
arttrace.testing's server in its own process), with its first call sent to model ``a`` and its
second to model ``b``. Three arms, alternating in order each round, in one process:

- bare: the step's rollouts as an ``asyncio.gather`` of ``arttrace.trajectory`` blocks;
- one policy: ``Trainer(model_a, ...)``, which trains both calls (every policy turn is its);
- two policies: ``Trainer([Policy(model_a), Policy(model_b)], ...)``, each call its model's.

Two measures of the Trainer's share of a step's CPU (this process's; the server's is not
counted), per round: direct (the CPU time spent journaling runs and in the step's ``finish``:
conversion to ART, grouping, shipping, bookkeeping; over the step's CPU) and the difference
against the bare arm ((step - bare) / step, noisier: it holds the whole client's variance).
With two policies the Trainer converts each run twice and ships two sets of groups, so the
target is: two policies' share / 2 <= one policy's.

    python bench/bench_policies.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import art
import openai

import arttrace as at
from bench_trainer import InstantBackend, bare, make_rollout, run_server

GROUPS, GROUP_SIZE, CONCURRENCY = 32, 8, 64


def model(name: str, out: Path) -> art.TrainableModel[Any]:
    return art.TrainableModel(
        name=name,
        project="bench",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="bench",
        base_path=str(out / ".art"),
    )


def trainer(models: Any, rollout: Any, examples: list[dict[str, Any]], out: Path) -> Any:
    return at.Trainer(
        models,
        InstantBackend(),
        rollout,
        examples,
        group_size=GROUP_SIZE,
        groups_per_step=len(examples),
        max_concurrency=CONCURRENCY,
        output_dir=out,
        progress=False,
        log_to_model=False,
    )


OWN = [0.0]
"""CPU seconds of the event loop's thread spent in the Trainer's own code (see the docstring)."""


def probe() -> None:
    """Count the CPU time of ``Journal.record`` and of the step's ``finish`` into ``OWN``
    (``finish`` runs once the rollouts are done: nothing else runs on the loop then)."""
    journal = importlib.import_module("arttrace._journal").Journal
    step = importlib.import_module("arttrace.training._step")
    record, finish = journal.record, step.finish

    def timed_record(*args: Any) -> Any:
        started = time.thread_time()
        try:
            return record(*args)
        finally:
            OWN[0] += time.thread_time() - started

    async def timed_finish(*args: Any) -> Any:
        started = time.thread_time()
        try:
            return await finish(*args)
        finally:
            OWN[0] += time.thread_time() - started

    journal.record, step.finish = timed_record, timed_finish


async def cpu_of(arm: Any) -> tuple[float, float]:
    """``arm()``'s process CPU seconds and the Trainer's own in it."""
    gc.collect()
    OWN[0], started = 0.0, time.process_time()
    await arm()
    return time.process_time() - started, OWN[0]


async def main(rounds: int) -> None:
    at.instrument()
    probe()
    examples = [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(GROUPS)]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    server = context.Process(target=run_server, args=(queue,), daemon=True)
    server.start()
    base_url = queue.get(timeout=900)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        rollout = make_rollout(client, ("a", "b"))
        one = trainer(model("a", out), rollout, examples, out / "one")
        two = trainer(
            [at.Policy(model("a", out)), at.Policy(model("b", out))], rollout, examples, out / "two"
        )
        arms = {
            "bare": lambda: bare(rollout, examples),
            "one policy": one.step,
            "two policies": two.step,
        }
        for arm in arms.values():  # warm up
            await arm()
        cpu: dict[str, list[float]] = {name: [] for name in arms}
        own: dict[str, list[float]] = {name: [] for name in arms}
        names = list(arms)
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                spent, mine = await cpu_of(arms[name])
                cpu[name].append(spent)
                own[name].append(mine / spent)
        await client.close()
    server.terminate()

    def share(name: str) -> list[float]:
        return [(t - b) / t for t, b in zip(cpu[name], cpu["bare"], strict=True)]

    print(
        f"one step: {GROUPS} groups x {GROUP_SIZE} rollouts, 2 LLM calls each (models a, b), "
        f"over loopback HTTP; {rounds} rounds; CPU seconds of this process"
    )
    for name in arms:
        print(f"  {name:13s} median CPU per step {1000 * statistics.median(cpu[name]):7.0f} ms")

    def line(what: str, values: list[float]) -> None:
        print(
            f"  {what:44s} {100 * statistics.median(values):5.1f} %"
            f"  [{100 * min(values):.1f} .. {100 * max(values):.1f}]"
        )

    for name, measure in (("direct", own), ("difference", {n: share(n) for n in arms})):
        one, two_ = measure["one policy"], measure["two policies"]
        line(f"Trainer's share ({name}), one policy", one)
        line(f"Trainer's share ({name}), two policies", two_)
        ratio = statistics.median(t / 2 / o for t, o in zip(two_, one, strict=True))
        print(
            f"    per policy (two policies / 2) = {ratio:.2f} x one policy's"
            f"   target <= 1.00  {'PASS' if ratio <= 1 else 'MISS'}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(parser.parse_args().rounds))
