"""``arttrace demo``: a plain OpenAI-SDK agent trained with GRPO, offline.

With the CPU backend (the default) a tiny Qwen2 model really learns: a greeter agent answers
each customer with one word (:mod:`._greeter_demo`); a supervised warm-up teaches four
greetings alike, so validation starts near chance, and GRPO steps through the
:class:`~arttrace.Trainer` reward the house greeting. With ``policies=2`` two tiny models on one
CPU backend learn together (:mod:`._front_desk_demo`): a router picks the department, a
greeter answers, each rewarded on its own. With ``backend="dry-run"`` a scripted
calculator agent runs against the scripted vLLM-compatible server: the scripted model sometimes
copies the numbers wrong, so rewards differ between runs of the same question, and the Trainer
ships the groups to a :class:`~arttrace.DryRunBackend`, which writes what ART would train on
(nothing learns).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai

from .._instrument import instrument
from .._journal import Journal
from ..capture._trainable import trainable
from ..testing import Reply, ScriptedLLM, ToolCall, serve
from ._demo_checks import check_options, fresh

if TYPE_CHECKING:
    import art  # the dry-run demo's rollouts start while ART loads in the background

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def scripted_model(seed: int) -> ScriptedLLM:
    """A model that calls ``add`` (with a typo one time in three), then reports the result."""
    rng = random.Random(seed)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        a, b = (int(x) for x in last["content"].removeprefix("What is ").rstrip("?").split("+"))
        if rng.random() < 1 / 3:
            b += 1
        return Reply(tool_calls=[ToolCall("add", {"a": a, "b": b})])

    return ScriptedLLM(respond, seed=seed)


def make_agent(client: openai.AsyncOpenAI) -> Any:
    @trainable
    async def calculator(question: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": "You are a calculator. Use the add tool."},
            {"role": "user", "content": question},
        ]
        while True:
            response = await client.chat.completions.create(
                model="demo-policy",
                messages=messages,
                tools=TOOLS,  # type: ignore[arg-type]
            )
            message = response.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)  # type: ignore[union-attr]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
                )

    return calculator


async def run_demo(
    out: Path,
    examples: int | None = None,
    rollouts: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    backend: str | None = None,
    base_url: str | None = None,
    model: str | None = None,
    *,
    progress: bool = False,
    max_steps_off_policy: int = 0,
    policies: int = 1,
) -> dict[str, Any]:
    """Run the demo and return the run's summary.

    ``backend``: ``"cpu"`` (the default: a tiny model learns the house greeting on this
    machine's CPU) or ``"dry-run"`` (the scripted calculator). ``base_url`` and ``model``: run
    the greeter's loop against your OpenAI-compatible server instead (a vLLM serving
    ``model``), shipping to a :class:`~arttrace.DryRunBackend`. Writes under ``out`` the
    Trainer's outputs (metrics, validation, plot, journal of every run); ``None`` sizes take
    the backend's defaults. A previous demo run in ``out`` is replaced. ``progress``: tell
    on stderr what the demo is doing (each step's line, a progress bar of its runs).
    ``max_steps_off_policy``: the Trainer's (pipelined training from 1). ``policies=2``:
    the front desk of two policies on the CPU backend, a router and a greeter that both learn.
    """
    check_options(backend, base_url, model, policies)
    if backend == "dry-run" and base_url is None:
        return await run_dry_run_demo(
            out,
            examples or 4,
            rollouts or 4,
            steps or 2,
            seed,
            progress=progress,
            max_steps_off_policy=max_steps_off_policy,
        )
    from ._greeter_demo import CPUSettings, run_greeter_demo

    defaults = CPUSettings()
    settings = dataclasses.replace(
        defaults,
        examples=examples or defaults.examples,
        rollouts=rollouts or defaults.rollouts,
        steps=steps or defaults.steps,
        max_steps_off_policy=max_steps_off_policy,
    )
    if policies == 2:
        from ._front_desk_demo import run_front_desk_demo

        return await run_front_desk_demo(out, seed, settings=settings, progress=progress)
    return await run_greeter_demo(
        out, seed, settings=settings, base_url=base_url, served_model=model, progress=progress
    )


async def run_dry_run_demo(
    out: Path,
    examples: int = 4,
    rollouts: int = 4,
    steps: int = 2,
    seed: int = 0,
    *,
    progress: bool = False,
    max_steps_off_policy: int = 0,
) -> dict[str, Any]:
    """Train for ``steps`` GRPO steps on a dry-run backend; return the run's summary.

    Writes under ``out`` the Trainer's outputs (metrics, plot, journal of every run) and, in
    ``out/dry_run``, the groups ART would train on with their report. A previous demo run in
    ``out`` is replaced. The rollouts start at once: the Trainer builds the model (and ART
    loads) in the background, as a user's script can (``Trainer(model=factory)``).
    """
    fresh(out)
    instrument()
    rng = random.Random(seed)
    dataset = [
        {"id": f"q-{i}", "a": rng.randint(1, 50), "b": rng.randint(1, 50)} for i in range(examples)
    ]
    with serve(scripted_model(seed)) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="demo")
        agent = make_agent(client)

        async def rollout(example: dict[str, Any]) -> float:
            answer = await agent(f"What is {example['a']}+{example['b']}?")
            return 1.0 if answer == f"The answer is {example['a'] + example['b']}." else 0.0

        def model() -> art.TrainableModel[Any]:
            """Called by the Trainer once ART has loaded, in the background."""
            import art

            return art.TrainableModel(
                name="demo-policy",
                project="arttrace-demo",
                base_model="Qwen/Qwen2.5-0.5B-Instruct",
                run_name="demo",
                base_path=str(out / ".art"),
            )

        from ..training import DryRunBackend, Trainer

        trainer = Trainer(
            model,
            DryRunBackend(out / "dry_run"),
            rollout,
            dataset,
            group_size=rollouts,
            groups_per_step=examples,
            output_dir=out,
            seed=seed,
            progress=progress,
            max_steps_off_policy=max_steps_off_policy,
        )
        results = await trainer.train(num_steps=steps)
        await client.close()

    journal = Journal(out)
    runs = [t for r in results for t in journal.finished(r.step).values()]
    rewards = [t.reward or 0.0 for t in runs]
    return {
        "backend": "dry-run (DryRunBackend; a scripted model, which does not learn)",
        "steps": len(results),
        "runs": len(runs),
        "llm_calls": sum(len(t.calls) for t in runs),
        "trainable_turns": sum(t.trainable_turns for t in runs),
        "completion_tokens": sum(c.completion_tokens for t in runs for c in t.calls),
        "reward_mean": sum(rewards) / len(rewards),
        "groups_shipped": sum(int(r.metrics["groups_kept"]) for r in results),
        "groups_dropped": sum(int(r.metrics["groups_dropped"]) for r in results),
        "trainable_tokens_shipped": sum(int(r.metrics["trainable_tokens"]) for r in results),
        "output": str(out),
    }
