"""Train an agent that runs in another process: each rollout starts `gateway_agent.py` with its
run's gateway URL as OPENAI_BASE_URL, and the Trainer trains on what the agent's calls were.

    python examples/gateway_trainer.py           # offline: scripted model, dry-run backend

The upstream is arttrace's scripted vLLM-like server (it copies a number wrong one time in
three, so the runs of a question get different rewards); point `Gateway(upstream=...)` at
your vLLM / ART inference server and use a real backend to train a real model.
"""

import asyncio
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import art

import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

AGENT = Path(__file__).with_name("gateway_agent.py")


def calculator_model(seed: int = 0) -> ScriptedLLM:
    """Calls `add` (with a typo one time in three), then reports the tool's result."""
    rng = random.Random(seed)

    def respond(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(f"The answer is {last['content']}.")
        a, b = (int(x) for x in last["content"].removeprefix("What is ").rstrip("?").split("+"))
        return Reply(tool_calls=[ToolCall("add", {"a": a, "b": b + (rng.random() < 1 / 3)})])

    return ScriptedLLM(respond, seed=seed)


async def main(out: Path) -> None:
    dataset = [{"id": f"q-{i}", "a": 10 + i, "b": 20 + i} for i in range(2)]
    with serve(calculator_model()) as upstream, at.Gateway(upstream.base_url) as gateway:

        async def rollout(example: dict[str, Any]) -> float:
            """One run: the agent, in its own process, talks to its run's URL."""
            url = gateway.url(at.current_trajectory())
            agent = await asyncio.create_subprocess_exec(
                sys.executable,
                str(AGENT),
                f"What is {example['a']}+{example['b']}?",
                env={**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "local"},
                stdout=asyncio.subprocess.PIPE,
            )
            answer = (await agent.communicate())[0].decode().strip()
            return float(answer == f"The answer is {example['a'] + example['b']}.")

        model: art.TrainableModel[Any] = art.TrainableModel(
            name="calculator-policy",
            project="arttrace-gateway",
            base_model="Qwen/Qwen2.5-0.5B-Instruct",
            run_name="gateway",
            base_path=str(out / ".art"),
        )
        backend = at.DryRunBackend(out / "dry_run")
        await model.register(backend)
        trainer = at.Trainer(
            model, backend, rollout, dataset, group_size=4, groups_per_step=2, output_dir=out
        )
        (result,) = await trainer.train(num_steps=1)

    print(f"1 GRPO step over {len(dataset)} questions x 4 subprocess runs:")
    for key in ("reward_mean", "groups_kept", "groups_dropped", "trainable_tokens"):
        print(f"  {key:<18} {result.metrics[key]:g}")
    print(f"  every run: {out / 'journal'}   what ART would train on: {out / 'dry_run'}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())))
