"""Train a subprocess agent whose rollouts run on a Ray cluster: each rollout runs on a Ray
worker, which serves its runs' gateway URLs itself and starts `gateway_agent.py` there.

    python examples/ray_gateway_trainer.py                # a local Ray, scripted model
    python examples/ray_gateway_trainer.py --address auto --upstream http://vllm:8000/v1

Each worker process starts one `arttrace.Gateway` the first time a rollout needs it; the agent
it starts calls its run's URL on that worker, so the calls are recorded into the run right
there and travel back to the driver with it (exact tokens, as in-process). Every node must
reach the upstream: here the scripted vLLM-like server of `gateway_trainer.py`, served by the
driver on 127.0.0.1 (so one machine); on a cluster, your vLLM's URL. On a cluster the nodes
also need this folder: `RayExecutor(runtime_env={"working_dir": "examples"})`.
"""

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import art

import arttrace as at
from arttrace.testing import serve
from gateway_trainer import calculator_model

AGENT = Path(__file__).with_name("gateway_agent.py")


_gateways: dict[str, at.Gateway] = {}


def worker_gateway(upstream: str) -> at.Gateway:
    """One gateway per worker process, serving the runs of the rollouts on that worker; it
    stops when the worker does. (The rollout travels to each worker by value, this function
    and its dict with it: a worker keeps its own.)"""
    if upstream not in _gateways:
        _gateways[upstream] = at.Gateway(upstream).start()
    return _gateways[upstream]


def make_rollout(upstream: str) -> Any:
    async def rollout(example: dict[str, Any]) -> float:
        """One run, on a Ray worker: the agent, in its own process there, calls its run's
        URL on the worker's gateway."""
        url = worker_gateway(upstream).url(at.current_trajectory())
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            str(AGENT),
            f"What is {example['a']}+{example['b']}?",
            env={**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "local"},
            stdout=asyncio.subprocess.PIPE,
        )
        answer = (await agent.communicate())[0].decode().strip()
        return float(answer == f"The answer is {example['a'] + example['b']}.")

    return rollout


async def main(
    out: Path, address: str | None = None, upstream: str | None = None, steps: int = 1
) -> list[at.StepResult]:
    """Train ``steps`` steps in ``out`` (continuing the run there, if any) against
    ``upstream`` (default: the scripted model, served here)."""
    dataset = [{"id": f"q-{i}", "a": 10 + i, "b": 20 + i} for i in range(2)]
    with contextlib.ExitStack() as stack:
        if upstream is None:
            upstream = stack.enter_context(serve(calculator_model())).base_url
        model: art.TrainableModel[Any] = art.TrainableModel(
            name="calculator-policy",
            project="arttrace-gateway",
            base_model="Qwen/Qwen2.5-0.5B-Instruct",
            run_name="ray-gateway",
            base_path=str(out / ".art"),
        )
        backend = at.DryRunBackend(out / "dry_run")
        await model.register(backend)
        trainer = at.Trainer(  # closed (its Ray actors) when the stack closes
            model,
            backend,
            make_rollout(upstream),
            dataset,
            group_size=4,
            groups_per_step=2,
            output_dir=out,
            resume=True,  # run again after a crash: only the runs the journal lacks
            executor=at.RayExecutor(address, max_in_flight=4, num_cpus=0.5),
        )
        stack.enter_context(trainer)
        results = await trainer.train(num_steps=steps)

    print(f"{steps} GRPO step(s) over {len(dataset)} questions x 4 subprocess runs on Ray workers:")
    for result in results:
        print(f"  step {result.step}:", end="")
        for key in ("reward_mean", "groups_kept", "trainable_tokens"):
            print(f"  {key} {result.metrics[key]:g}", end="")
        print()
    print(f"  every run: {out / 'journal'}   what ART would train on: {out / 'dry_run'}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", help="a Ray cluster's address (default: a local Ray)")
    parser.add_argument("--out", type=Path, help="run folder (default: a new temporary one)")
    parser.add_argument("--upstream", help="the policy server's /v1 URL (default: scripted)")
    parser.add_argument("--steps", type=int, default=1, help="GRPO steps in all (default: 1)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp())
    asyncio.run(main(out, args.address, args.upstream, args.steps))
