"""The demo with two policies that both learn: a front desk of two tiny models, a router that
picks the department for each customer and a greeter that answers them.

One :class:`~arttrace.CPUBackend` hosts both models (each its own copy of the tiny Qwen2). The
agent is plain OpenAI SDK code: the router's call goes to ``demo-router``, the greeter's to
``demo-greeter``, and the Trainer gives each turn to the policy whose model it was sent to. A
warm-up teaches each model its four one-word replies alike (the router four departments, the
greeter four greetings), so neither starts with its house rule. The rollout returns one reward
per policy (``{"router": ..., "greeter": ...}``): the router is rewarded for sending a customer
who only introduces themselves to Support (the house rule), the greeter for the house
greeting. Each GRPO step trains both, and each policy's validation on held-out customers rises
(``router/reward_mean`` and ``greeter/reward_mean`` in ``validation.jsonl``, a curve each in
the plot): with seed 0, the router 0.05 -> 1.00 and the greeter 0.44 -> 1.00 in 12 steps.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import art
import openai

from .._instrument import instrument
from ..capture._trainable import trainable
from ._demo_checks import fresh
from ._greeter_demo import (
    GREETINGS,
    HOUSE_GREETING,
    SYSTEM,
    CPUSettings,
    _say,
    house_style_reward,
    loss_figures,
    redraw_plot,
    split,
    train,
    warm_up_trajectories,
)

ROUTER_SYSTEM = "Pick the department for the customer."
DEPARTMENTS = ["Support", "Sales", "Billing", "Returns"]
"""One token each in Qwen2.5's vocabulary, as the greetings are."""
HOUSE_DEPARTMENT = "Support"
"""The house rule: a customer who only introduces themselves has no request yet, and goes to
Support, the desk that asks how it can help."""
ROUTER_MODEL, GREETER_MODEL = "demo-router", "demo-greeter"
POLICIES = ("router", "greeter")


def routing_reward(customer: str, department: str) -> float:
    """1 for the house department (case, spaces and a final "!" or "." aside), else 0."""
    return 1.0 if department.strip().rstrip("!.").lower() == HOUSE_DEPARTMENT.lower() else 0.0


def house_rules(customer: str, department: str, greeting: str) -> dict[str, float]:
    """Each policy's reward: the router's for the department, the greeter's for the greeting."""
    return {
        "router": routing_reward(customer, department),
        "greeter": house_style_reward(customer, greeting),
    }


def make_front_desk(client: openai.AsyncOpenAI) -> Any:
    """The agent a user would write: the router's call picks the department, the greeter's
    call answers the customer; each on its own model name."""

    @trainable
    async def front_desk(customer: str) -> tuple[str, str]:
        routed = await client.chat.completions.create(
            model=ROUTER_MODEL,
            messages=[
                {"role": "system", "content": ROUTER_SYSTEM},
                {"role": "user", "content": customer},
            ],
            max_tokens=4,
        )
        greeted = await client.chat.completions.create(
            model=GREETER_MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": customer}],
            max_tokens=4,
        )
        return routed.choices[0].message.content or "", greeted.choices[0].message.content or ""

    return front_desk


async def run_front_desk_demo(
    out: Path,
    seed: int = 0,
    *,
    settings: CPUSettings | None = None,
    rewards: Callable[[str, str, str], Mapping[str, float]] = house_rules,
    progress: bool = False,
) -> dict[str, Any]:
    """Train the router and the greeter together on one :class:`~arttrace.CPUBackend` and
    return the run's summary: warm up each model, then ``settings.steps`` GRPO steps of
    ``settings.examples`` customers x ``settings.rollouts`` runs, each step training both
    policies, validating on held-out customers before and after. ``rewards(customer,
    department, greeting)`` scores a run, one reward per policy."""
    from ..training import CPUBackend, Policy

    s = settings or CPUSettings()
    fresh(out)
    instrument()
    started = time.perf_counter()
    train_set, val_set = split(seed, s.validation)
    _say(progress, "building the policies: two copies of a tiny Qwen2 on one CPUBackend")
    backend = CPUBackend(
        config=s.config, seed=seed, threads=1, train_embeddings=False, keep_checkpoints=1
    )
    models: dict[str, art.TrainableModel[Any]] = {
        policy: art.TrainableModel(
            name=name,
            project="arttrace-demo",
            base_model="arttrace/tiny-qwen2",
            run_name=policy,
            base_path=str(out / ".art"),
        )
        for policy, name in zip(POLICIES, (ROUTER_MODEL, GREETER_MODEL), strict=True)
    }
    for model in models.values():
        await model.register(backend)

    _say(
        progress,
        f"warm-up: supervised training on {2 * s.warm_up_batches} customers, the router with "
        f"{len(DEPARTMENTS)} departments alike, the greeter with {len(GREETINGS)} greetings "
        "alike, so neither starts with its house rule",
    )
    warm_started = time.perf_counter()
    customers = 2 * s.warm_up_batches
    roles = {"router": (ROUTER_SYSTEM, DEPARTMENTS), "greeter": (SYSTEM, GREETINGS)}
    for policy, (system, answers) in roles.items():  # in turn: 2 cores, 1 thread each is best
        await models[policy].train_sft(
            warm_up_trajectories(
                train_set, customers, random.Random(seed), system=system, answers=answers
            ),
            config=art.TrainSFTConfig(learning_rate=s.warm_up_learning_rate, batch_size=8),
            log_metrics=False,
        )
    warm_up_seconds = time.perf_counter() - warm_started
    _say(progress, f"warm-up done in {warm_up_seconds:.0f} s")
    _say(
        progress,
        f"GRPO: {s.steps} steps of {s.examples} customers x {s.rollouts} runs, each training "
        f"both policies: the router rewarded for {HOUSE_DEPARTMENT!r}, the greeter for "
        f"{HOUSE_GREETING!r}; validation on {len(val_set)} held-out customers before and after",
    )

    client = openai.AsyncOpenAI(
        base_url=models["router"].inference_base_url, api_key="cpu", max_retries=0
    )
    agent = make_front_desk(client)

    async def rollout(customer: str) -> Mapping[str, float]:
        return rewards(customer, *await agent(customer))

    policies = [Policy(models[p], name=p) for p in POLICIES]
    results, validations = await train(
        policies, backend, rollout, (train_set, val_set), s, out, seed, progress, client
    )
    label = (
        f"cpu (CPUBackend: two tiny Qwen2 policies, {backend.policy.parameters / 1e6:.1f}M "
        "parameters each)"
    )
    summary: dict[str, Any] = {
        "backend": label,
        "task": f"send customers to {HOUSE_DEPARTMENT!r} (router) and greet them with "
        f"{HOUSE_GREETING!r} (greeter)",
        "steps": len(results),
        "runs": sum(int(r.metrics["trajectories_scored"]) for r in results),
    }
    for p in POLICIES:
        summary[f"{p}_val_reward_step_0"] = validations[0][f"{p}/reward_mean"]
        summary[f"{p}_val_reward_last"] = validations[-1][f"{p}/reward_mean"]
    for p in POLICIES:
        summary[f"{p}_train_reward_first"] = results[0].metrics[f"{p}/reward_mean"]
        summary[f"{p}_train_reward_last"] = results[-1].metrics[f"{p}/reward_mean"]
        summary |= loss_figures(results, f"{p}/train/loss", f"{p}_")
    summary |= {
        "warm_up_seconds": warm_up_seconds,
        "rollout_seconds": sum(r.metrics["rollout_seconds"] for r in results),
        "train_seconds": sum(r.metrics["train_seconds"] for r in results),
        "seconds": time.perf_counter() - started,
        "output": str(out),
    }
    redraw_plot(
        out,
        f"router learns {HOUSE_DEPARTMENT!r}, greeter {HOUSE_GREETING!r}: two tiny Qwen2 "
        "policies on one CPUBackend",
        validations,
    )
    return summary
