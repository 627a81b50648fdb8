"""CPUBackend on this machine: inference and training tokens/s for the demo model and a larger
configuration, peak memory, and one demo step split into rollouts and training.

    .venv/bin/python bench/bench_cpu_backend.py [--threads 1] [--steps 3]

Inference: tokens sampled per second through the OpenAI endpoint (one request of n=1, then
n=8), and in-process. Training: tokens per second of ``backend.train`` on 8 captured groups of
8 runs (ART's tokenize, pack, loss, backward and AdamW step). The machine's load average is
printed with the figures: on a shared machine they move with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import art
import openai

import arttrace as at

LARGER = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse."}]


async def measure(
    name: str, config: dict[str, Any] | None, threads: int, root: Path, frozen: bool
) -> None:
    """``frozen``: embeddings frozen, as the demo trains its model."""
    backend = at.CPUBackend(config=config, threads=threads, train_embeddings=not frozen)
    model: art.TrainableModel[Any] = art.TrainableModel(
        name="bench", project="bench", base_model="tiny", run_name=name, base_path=str(root)
    )
    await model.register(backend)
    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key="x")
    policy = backend.policy
    print(f"\n{name}: {policy.parameters / 1e6:.1f}M parameters, embeddings frozen: {frozen}")

    prompt = backend._server.chat.prompt(MESSAGES, None)  # type: ignore[union-attr]
    for n in (1, 8):
        started = time.perf_counter()
        sampled = sum(1 for _ in policy.generate(prompt, n=n, max_tokens=64, seed=0))
        rate = sampled / (time.perf_counter() - started)
        print(f"  inference in-process  n={n}: {rate:8.1f} tokens/s")
        started = time.perf_counter()
        response = await client.chat.completions.create(
            model="bench",
            messages=MESSAGES,
            n=n,
            max_tokens=64,
            logprobs=True,  # type: ignore[arg-type]
            extra_body={"return_token_ids": True},
        )
        assert response.usage is not None
        rate = response.usage.completion_tokens / (time.perf_counter() - started)
        print(f"  inference over HTTP   n={n}: {rate:8.1f} tokens/s")

    at.instrument()

    @at.trainable
    async def agent() -> None:
        await client.chat.completions.create(model="bench", messages=MESSAGES, max_tokens=32)  # type: ignore[arg-type]

    rng = random.Random(0)
    groups = []
    started = time.perf_counter()
    for g in range(8):
        runs = []
        for _ in range(8):
            with at.trajectory(f"g{g}") as t:
                await agent()
                t.reward = rng.random()
            runs.append(t.to_art())
        groups.append(art.TrajectoryGroup(runs))
    rollouts = time.perf_counter() - started
    at.uninstrument()
    started = time.perf_counter()
    result = await backend.train(model, groups, learning_rate=1e-4, save_checkpoint=False)
    seconds = time.perf_counter() - started
    m = result.metrics
    print(
        f"  64 rollouts of 32 tokens: {rollouts:.1f} s; train: {seconds:.2f} s for "
        f"{m['num_tokens']:.0f} tokens in {m['num_sequences']:.0f} packed rows "
        f"({m['num_tokens'] / seconds:.0f} tokens/s, "
        f"{m['num_trainable_tokens'] / seconds:.0f} trained tokens/s)"
    )
    await client.close()
    await backend.close()


async def demo_step(steps: int, root: Path) -> None:
    """The demo's own run, shortened: where a step's time goes."""
    from arttrace.app._greeter_demo import CPUSettings, run_greeter_demo

    settings = CPUSettings(steps=steps)
    summary = await run_greeter_demo(root / "demo", settings=settings)
    print(
        f"\ndemo ({steps} steps of {settings.examples} customers x {settings.rollouts} runs): "
        f"warm-up {summary['warm_up_seconds']:.1f} s; per step rollouts "
        f"{summary['rollout_seconds'] / steps:.2f} s, training "
        f"{summary['train_seconds'] / steps:.2f} s; whole run {summary['seconds']:.0f} s "
        f"(validation {summary['val_reward_step_0']:.2f} -> {summary['val_reward_last']:.2f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        asyncio.run(measure("demo model", None, args.threads, root, frozen=True))
        asyncio.run(measure("larger model", LARGER, args.threads, root, frozen=False))
        asyncio.run(demo_step(args.steps, root))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"\npeak memory (max RSS): {usage.ru_maxrss / 1024:.0f} MiB; CPU time "
        f"{usage.ru_utime + usage.ru_stime:.0f} s in {time.perf_counter() - started:.0f} s; "
        f"load {os.getloadavg()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
