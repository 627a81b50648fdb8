"""How much of a training step is the Trainer's own work.

One step of 64 groups x 8 rollouts: an instrumented OpenAI-SDK agent (two LLM calls per run)
against arttrace.testing's server on 127.0.0.1 (in its own process), and a backend that returns
at once. The same
512 rollouts, run as a bare `asyncio.gather` of `arttrace.trajectory` blocks with the same
concurrency bound, are the baseline, measured in the same run. The Trainer's own time (journal,
grouping, conversion to ART, metrics, plot, progress) is the difference:

    trainer share = (trainer step wall - bare rollouts wall) / trainer step wall   target <= 5%

Peak memory: tracemalloc's peak during the step (Python allocations), and the process's
peak RSS.

    python bench/bench_trainer.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import openai

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

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


def make_rollout(client: openai.AsyncOpenAI) -> Any:
    @at.trainable
    async def agent(question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        first = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message,
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        final = await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        return final.choices[0].message.content or ""

    async def rollout(example: dict[str, Any]) -> float:
        answer = await agent(example["q"])
        return float(hash((example["id"], answer, time.perf_counter_ns())) % 2)

    return rollout


async def bare(rollout: Any, examples: list[dict[str, Any]]) -> float:
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def one(example: dict[str, Any]) -> None:
        async with semaphore, at.trajectory(example["id"]) as t:
            t.reward = await rollout(example)
        t.to_art()  # what any loop shipping to ART must do too

    started = time.perf_counter()
    await asyncio.gather(*(one(e) for e in examples for _ in range(GROUP_SIZE)))
    return time.perf_counter() - started


async def trainer_step(
    rollout: Any, examples: list[dict[str, Any]], out: Path
) -> tuple[float, dict[str, float]]:
    model = art.TrainableModel(
        name="bench",
        project="bench",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="bench",
        base_path=str(out / ".art"),
    )
    trainer = at.Trainer(
        model,
        InstantBackend(),
        rollout,
        examples,
        group_size=GROUP_SIZE,
        groups_per_step=GROUPS,
        max_concurrency=CONCURRENCY,
        output_dir=out / "run",
        progress=True,
        log_to_model=True,
    )
    started = time.perf_counter()
    result = await trainer.step()
    await trainer.flush()  # its plot and model.log count too
    return time.perf_counter() - started, result.metrics


def run_server(port: Any) -> None:
    """The scripted model in its own process, so its CPU time is not the trainer's."""
    with serve(ScriptedLLM(responder)) as server:
        port.put(server.base_url)
        while True:
            time.sleep(3600)


async def main(rounds: int, freeze: bool) -> None:
    at.instrument()
    examples = [{"id": f"ex-{i}", "q": f"question {i}"} for i in range(GROUPS)]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    server = context.Process(target=run_server, args=(queue,), daemon=True)
    server.start()
    base_url = queue.get(timeout=60)
    with tempfile.TemporaryDirectory() as tmp:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
        rollout = make_rollout(client)
        await bare(rollout, examples[:8])  # warm up: connections, imports
        await trainer_step(rollout, examples[:8], Path(tmp) / "warm")
        if freeze:
            gc.collect()
            gc.freeze()  # the ~650k objects `import art` brings (torch): see the module docstring
        bare_times, step_times = [], []
        metrics: dict[str, float] = {}
        for r in range(rounds):  # alternate which arm goes first
            for arm in ("bare", "trainer") if r % 2 else ("trainer", "bare"):
                gc.collect()
                if arm == "bare":
                    bare_times.append(await bare(rollout, examples))
                else:
                    seconds, metrics = await trainer_step(rollout, examples, Path(tmp) / f"r{r}")
                    step_times.append(seconds)
        gc.collect()
        tracemalloc.start()
        await trainer_step(rollout, examples, Path(tmp) / "memory")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        await client.close()
    server.terminate()

    bare_s, step_s = statistics.median(bare_times), statistics.median(step_times)
    share = (step_s - bare_s) / step_s
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"one step: {GROUPS} groups x {GROUP_SIZE} rollouts, 2 LLM calls each, over loopback HTTP;"
        f" max_concurrency={CONCURRENCY}; median of {rounds} rounds"
    )
    print(
        "  rounds, ms: bare",
        [round(t * 1000) for t in bare_times],
        "trainer",
        [round(t * 1000) for t in step_times],
    )
    print(f"  bare rollouts (gather of trajectories)  {bare_s * 1000:8.0f} ms")
    print(f"  Trainer.step (instant backend)         {step_s * 1000:8.0f} ms")
    print(
        f"  trainer share of step wall time        {100 * share:8.1f} %   target <= 5%  "
        f"{'PASS' if share <= 0.05 else 'MISS'}"
    )
    print(
        f"  step phases (last round): rollouts {metrics['rollout_seconds'] * 1000:.0f} ms,"
        f" backend {metrics['train_seconds'] * 1000:.0f} ms, trainable tokens"
        f" {metrics['trainable_tokens']:.0f}"
    )
    print(f"  peak Python memory during a step (tracemalloc)  {peak / 2**20:8.1f} MiB")
    print(f"  peak RSS of the process                          {rss:8.1f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-freeze", action="store_true", help="leave gc.freeze() out")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, not args.no_freeze))
