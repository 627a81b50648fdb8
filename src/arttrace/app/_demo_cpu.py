"""The demo on :class:`~arttrace.CPUBackend`: a tiny Qwen2 learns "even or odd" with GRPO.

The agent is plain OpenAI SDK code, captured by arttrace's shim like a user's. The model is
random at first; a short supervised warm-up on answers picked at random teaches it to answer
with one word, ``even`` or ``odd``, but not which, so validation starts near 0.5. GRPO then
rewards the right word: the rule (the last digit decides) holds for held-out numbers too.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import art
import openai

import arttrace as at

SYSTEM = "Answer with one word: even or odd."
MODEL_NAME = "demo-policy"


def question(number: int) -> str:
    return f"Is {number} even or odd?"


def answer(number: int) -> str:
    return "odd" if number % 2 else "even"


def parity_reward(number: int, reply: str) -> float:
    return 1.0 if reply.strip().lower() == answer(number) else 0.0


def make_agent(client: openai.AsyncOpenAI, model: str) -> Any:
    @at.trainable
    async def parity(text: str) -> str:
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
            max_tokens=4,
        )
        return response.choices[0].message.content or ""

    return parity


def warm_up_trajectories(numbers: list[int], rng: random.Random) -> list[art.Trajectory]:
    """Each question twice, answered ``even`` once and ``odd`` once: the best the policy can do
    is answer in the right format with even odds, so it learns the format, not the rule."""
    pairs = [(n, word) for n in numbers for word in ("even", "odd")]
    rng.shuffle(pairs)
    return [
        art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question(n)},
                {"role": "assistant", "content": word},
            ],
            reward=0.0,
        )
        for n, word in pairs
    ]


def split(seed: int, train: int, val: int) -> tuple[list[int], list[int]]:
    """Disjoint train and validation numbers below 1000."""
    numbers = random.Random(seed).sample(range(1000), train + val)
    return numbers[:train], numbers[train:]


async def run_parity_demo(
    out: Path,
    examples: int | None = None,
    rollouts: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    *,
    validation: int = 64,
    learning_rate: float = 1e-3,
    warm_up_steps: int = 20,
    backend: Any = None,
    reward: Callable[[int, str], float] = parity_reward,
) -> dict[str, Any]:
    """Warm up, then ``steps`` GRPO steps of ``examples`` questions x ``rollouts`` runs on
    :class:`~arttrace.CPUBackend`, validating on held-out numbers before and after.
    ``reward(number, reply)`` scores a run (default: the right word for the number's parity)."""
    from .demo import fresh

    examples, rollouts, steps = examples or 8, rollouts or 8, steps or 12
    fresh(out)
    at.instrument()
    started = time.perf_counter()
    backend = backend or at.CPUBackend(seed=seed, threads=1, train_embeddings=False)
    model: art.TrainableModel[Any] = art.TrainableModel(
        name=MODEL_NAME,
        project="arttrace-demo",
        base_model="arttrace/tiny-qwen2",
        run_name="demo",
        base_path=str(out / ".art"),
    )
    await model.register(backend)
    train_numbers, val_numbers = split(seed, max(examples * steps, 64), validation)
    rng = random.Random(seed)
    warm_started = time.perf_counter()
    await model.train_sft(
        warm_up_trajectories(train_numbers[: 4 * warm_up_steps], rng),
        config=art.TrainSFTConfig(learning_rate=5e-3, batch_size=8),
        log_metrics=False,
    )
    warm_up_seconds = time.perf_counter() - warm_started

    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key="cpu")
    agent = make_agent(client, MODEL_NAME)

    async def rollout(number: int) -> float:
        return reward(number, await agent(question(number)))

    trainer = at.Trainer(
        model,
        backend,
        rollout,
        train_numbers,
        val_dataset=val_numbers,
        example_id=lambda n: f"n-{n}",
        group_size=rollouts,
        groups_per_step=examples,
        learning_rate=learning_rate,
        output_dir=out,
        seed=seed,
        progress=False,
        log_to_model=False,
    )
    results = await trainer.train(num_steps=steps)
    await client.close()
    await backend.close()

    validations = [json.loads(line) for line in (out / "validation.jsonl").open()]
    losses = [r.metrics.get("train/loss") for r in results if "train/loss" in r.metrics]
    return {
        "backend": "cpu",
        "model": f"tiny Qwen2, {backend.policy.parameters / 1e6:.1f}M parameters",
        "steps": len(results),
        "runs": steps * examples * rollouts,
        "val_reward_step_0": validations[0]["reward_mean"],
        "val_reward_last": validations[-1]["reward_mean"],
        "train_reward_first": results[0].metrics["reward_mean"],
        "train_reward_last": results[-1].metrics["reward_mean"],
        "loss_first": losses[0] if losses else float("nan"),
        "loss_last": losses[-1] if losses else float("nan"),
        "warm_up_seconds": warm_up_seconds,
        "rollout_seconds": sum(r.metrics["rollout_seconds"] for r in results),
        "train_seconds": sum(r.metrics["train_seconds"] for r in results),
        "seconds": time.perf_counter() - started,
        "output": str(out),
    }
