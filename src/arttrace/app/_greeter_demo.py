"""The demo that learns: a greeter agent (plain OpenAI SDK code) trained with GRPO to use the
house greeting.

On :class:`~arttrace.CPUBackend` (the default) the model is a tiny Qwen2 with random weights. A
short supervised warm-up answers every customer with each of four greetings alike, so the
policy starts near chance between four well-formed replies (validation 0.02-0.39 over seeds
0-2); the reward
is 1 for the house greeting, and GRPO steps through the :class:`~arttrace.Trainer` make it the
policy's choice. Validation greets held-out customers. (A tiny random model does not learn a
task that depends on what the user wrote, such as a review's sentiment, in a few minutes on
two cores: see ``docs/cpu_backend.md``.) With ``base_url`` the same loop runs against a
server you started (vLLM serving a real model); arttrace cannot change that server's weights,
so the groups go to a :class:`~arttrace.DryRunBackend`, which writes what ART would train on.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import art
import openai

from .._instrument import instrument
from ..capture._trainable import trainable
from ._demo_checks import api_key, check_server, fresh

if TYPE_CHECKING:
    from ..training import StepResult

SYSTEM = "Greet the customer."
MODEL_NAME = "demo-policy"
GREETINGS = ["Hello", "Hi", "Welcome", "Hey"]
"""One token each in Qwen2.5's vocabulary: a short warm-up teaches a tiny model those."""
HOUSE_GREETING = "Welcome"
NAMES = [
    "Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
    "Mo", "Nia", "Oto", "Pia", "Quin", "Ravi", "Sol", "Tess", "Uma", "Vic", "Wes", "Xia",
    "Yara", "Zed", "Amir", "Bea", "Cruz", "Dana", "Emil", "Fern",
]  # fmt: skip
REQUESTS = [
    "Hi, I am {}.", "Hello, this is {}.", "{} here, good morning.", "My name is {}.",
    "Hey, {} speaking.", "Good evening, I am {}.",
]  # fmt: skip


@dataclass(frozen=True)
class CPUSettings:
    """The CPU run's knobs; the defaults are the demo's (see ``docs/cpu_backend.md``)."""

    examples: int = 8
    rollouts: int = 8
    steps: int = 12
    learning_rate: float = 3e-3
    warm_up_batches: int = 20
    warm_up_learning_rate: float = 5e-3
    validation: int = 64
    config: dict[str, Any] | None = None
    max_steps_off_policy: int = 0


def house_style_reward(customer: str, reply: str) -> float:
    """1 for the house greeting (case, spaces and a final "!" or "." aside), else 0."""
    return 1.0 if reply.strip().rstrip("!.").lower() == HOUSE_GREETING.lower() else 0.0


def split(seed: int, val: int) -> tuple[list[str], list[str]]:
    """Disjoint training and held-out customer messages (each a name in a phrasing)."""
    every = [r.format(n) for n in NAMES for r in REQUESTS]
    random.Random(seed).shuffle(every)
    return every[val:], every[:val]


def make_agent(client: openai.AsyncOpenAI, model: str) -> Any:
    """The agent a user would write: one Chat Completions call, its reply is the answer."""

    @trainable
    async def greeter(customer: str) -> str:
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": customer}],
            max_tokens=4,
        )
        return response.choices[0].message.content or ""

    return greeter


def warm_up_trajectories(
    customers: list[str],
    count: int,
    rng: random.Random,
    *,
    system: str = SYSTEM,
    answers: Sequence[str] = GREETINGS,
) -> list[art.Trajectory]:
    """``count`` customers (cycled), each answered with every greeting once: the best the
    policy can do is pick among the four alike, so it learns the format, not the house style.
    ``system`` and ``answers``: another role's prompt and one-word replies (the router's)."""
    cycled = list(itertools.islice(itertools.cycle(customers), count))
    pairs = [(c, g) for c in cycled for g in answers]
    rng.shuffle(pairs)
    return [
        art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": system},
                {"role": "user", "content": c},
                {"role": "assistant", "content": g},
            ],
            reward=0.0,
        )
        for c, g in pairs
    ]


async def run_greeter_demo(
    out: Path,
    seed: int = 0,
    *,
    settings: CPUSettings | None = None,
    backend: Any = None,
    base_url: str | None = None,
    served_model: str | None = None,
    reward: Callable[[str, str], float] = house_style_reward,
    progress: bool = False,
) -> dict[str, Any]:
    """Train the greeter and return the run's summary.

    Without ``base_url``: warm up, then ``settings.steps`` GRPO steps of ``settings.examples``
    customers x ``settings.rollouts`` runs on ``backend`` (default: a :class:`~arttrace.CPUBackend`
    with the tiny model), validating on held-out customers before and after. With ``base_url``
    and ``served_model``: the same steps against that OpenAI-compatible server, shipped to a
    :class:`~arttrace.DryRunBackend` in ``out/dry_run``. ``reward(customer, reply)`` scores a run.
    ``progress``: tell on stderr what the run is doing (the Trainer's lines and progress bars).
    """
    from ..training import DryRunBackend

    s = settings or CPUSettings()
    fresh(out)
    instrument()
    started = time.perf_counter()
    train_set, val_set = split(seed, s.validation)
    if base_url is not None:
        assert served_model, "run_demo checks that --base-url comes with --model"
        await check_server(base_url, served_model)
        backend = DryRunBackend(out / "dry_run", inference_base_url=base_url)
        name = served_model
    else:
        from ..training import CPUBackend

        _say(progress, "building the policy: a tiny Qwen2 with random weights (CPUBackend)")
        backend = backend or CPUBackend(
            config=s.config, seed=seed, threads=1, train_embeddings=False, keep_checkpoints=1
        )
        name = MODEL_NAME
    model: art.TrainableModel[Any] = art.TrainableModel(
        name=MODEL_NAME,
        project="arttrace-demo",
        base_model=served_model or "arttrace/tiny-qwen2",
        run_name="demo",
        base_path=str(out / ".art"),
    )
    await model.register(backend)
    warm_up_seconds = 0.0
    if base_url is None:
        _say(
            progress,
            f"warm-up: supervised training on {2 * s.warm_up_batches} customers x "
            f"{len(GREETINGS)} greetings alike, so the policy starts at chance between them",
        )
        warm_started = time.perf_counter()
        await model.train_sft(
            warm_up_trajectories(train_set, 2 * s.warm_up_batches, random.Random(seed)),
            config=art.TrainSFTConfig(learning_rate=s.warm_up_learning_rate, batch_size=8),
            log_metrics=False,
        )
        warm_up_seconds = time.perf_counter() - warm_started
        _say(progress, f"warm-up done in {warm_up_seconds:.0f} s")
    _say(
        progress,
        f"GRPO: {s.steps} steps of {s.examples} customers x {s.rollouts} runs, rewarding "
        f"{HOUSE_GREETING!r}; validation on {len(val_set)} held-out customers before and after",
    )

    client = openai.AsyncOpenAI(
        base_url=model.inference_base_url, api_key=api_key(base_url), max_retries=0
    )
    agent = make_agent(client, name)

    async def rollout(customer: str) -> float:
        return reward(customer, await agent(customer))

    results, validations = await train(
        model, backend, rollout, (train_set, val_set), s, out, seed, progress, client
    )
    if base_url is None:
        label = f"cpu (CPUBackend: tiny Qwen2, {backend.policy.parameters / 1e6:.1f}M parameters)"
    else:
        label = f"dry-run (DryRunBackend; rollouts from {served_model} at {base_url})"
    summary: dict[str, Any] = {
        "backend": label,
        "task": f"greet customers with the house greeting {HOUSE_GREETING!r}",
        "steps": len(results),
        "runs": sum(int(r.metrics["trajectories_scored"]) for r in results),
        "val_reward_step_0": validations[0]["reward_mean"],
        "val_reward_last": validations[-1]["reward_mean"],
        "train_reward_first": results[0].metrics["reward_mean"],
        "train_reward_last": results[-1].metrics["reward_mean"],
        **loss_figures(results, "train/loss", ""),
        "warm_up_seconds": warm_up_seconds,
        "rollout_seconds": sum(r.metrics["rollout_seconds"] for r in results),
        "train_seconds": sum(r.metrics["train_seconds"] for r in results),
        "seconds": time.perf_counter() - started,
        "output": str(out),
    }
    redraw_plot(out, f"greeter learns the house greeting, on {label}", validations)
    return summary


async def train(
    models: Any,
    backend: Any,
    rollout: Any,
    sets: tuple[list[str], list[str]],
    s: CPUSettings,
    out: Path,
    seed: int,
    progress: bool,
    client: openai.AsyncOpenAI,
) -> tuple[list[StepResult], list[dict[str, Any]]]:
    """The demo's GRPO steps on ``models`` (one, or several policies), and its validations as
    written; closes ``client`` and ``backend`` after."""
    from ..training import Trainer

    train_set, val_set = sets
    trainer = Trainer(
        models,
        backend,
        rollout,
        train_set,
        val_dataset=val_set,
        example_id=str,
        group_size=s.rollouts,
        groups_per_step=s.examples,
        learning_rate=s.learning_rate,
        output_dir=out,
        seed=seed,
        progress=progress,
        log_to_model=False,
        max_steps_off_policy=s.max_steps_off_policy,
    )
    try:
        results = await trainer.train(num_steps=s.steps)
    finally:
        await client.close()
        await backend.close()
    validations = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    return results, validations


def loss_figures(results: list[StepResult], key: str, prefix: str) -> dict[str, Any]:
    """The first and last loss ``key`` the steps reported, and their steps."""
    losses = [(r.step, r.metrics[key]) for r in results if key in r.metrics]
    return {
        f"{prefix}loss_first": losses[0][1] if losses else float("nan"),
        f"{prefix}loss_first_step": losses[0][0] if losses else None,
        f"{prefix}loss_last": losses[-1][1] if losses else float("nan"),
        f"{prefix}loss_last_step": losses[-1][0] if losses else None,
    }


def redraw_plot(out: Path, title: str, validations: list[dict[str, Any]]) -> None:
    """The Trainer's plot again, titled with the task and the backend that ran."""
    from ..training._plot import reward_plot

    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    reward_plot(out / "reward_plot.png", steps, validations, title=title)


def _say(progress: bool, line: str) -> None:
    """A line on stderr about what the demo is doing, where the Trainer writes its own."""
    if progress:
        print(line, file=sys.stderr, flush=True)
