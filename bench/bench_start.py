"""Seconds from process start to the first rollout's first LLM call.

Each arm is a fresh interpreter; a prelude marks the first ``/chat/completions`` request any
httpx client sends (the OpenAI SDK's transport) and prints the time, and whether ART had
finished loading then. The arm is stopped there (the demos would go on for a minute). Arms:

- ``arttrace demo --backend dry-run``: the scripted calculator, a ``DryRunBackend`` and the
  model built by the Trainer once ART has loaded (target <= 5 s);
- a minimal user script: ``Trainer(model=factory, DryRunBackend(), ...)`` against a scripted
  server, ART imported in the background;
- the same script with ``import art`` at its top and the model built first, as scripts were
  written before (what a script that imports ART itself pays);
- with ``--cpu``: ``arttrace demo`` (the CPU backend): torch, the tiny model and a supervised
  warm-up through ART's own SFT pipeline come before its first rollout.

Wall seconds (min and median over ``--rounds``) and the machine's load average.

    python bench/bench_start.py [--rounds N] [--cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PRELUDE = """
import sys, time
import httpx

def _marked(send):
    def send_marked(self, request, *args, **kwargs):
        if request.url.path.endswith("/chat/completions") and not _seen:
            _seen.append(1)
            from arttrace.training import _art_import
            loading = _art_import._import
            loaded = "art" in sys.modules and (loading is None or loading.done.is_set())
            print(f"FIRST_LLM_CALL {time.time()!r} {loaded}", flush=True)
        return send(self, request, *args, **kwargs)
    return send_marked

_seen = []
httpx.Client.send = _marked(httpx.Client.send)
httpx.AsyncClient.send = _marked(httpx.AsyncClient.send)
"""

DEMO = (
    PRELUDE
    + """
from arttrace.app.cli import main
sys.exit(main(["demo", "--out", sys.argv[1]] + sys.argv[2:]))
"""
)

SCRIPT = """
import asyncio, sys
import openai
import arttrace as at
from arttrace.testing import Reply, ScriptedLLM, serve

def model():
    import art  # loaded in the background by then
    return art.TrainableModel(name="m", project="p", base_model="Qwen/Qwen2.5-0.5B-Instruct",
                              run_name="r", base_path=sys.argv[1] + "/.art")

async def main():
    at.instrument()
    with serve(ScriptedLLM(lambda request: Reply("hello"))) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)

        @at.trainable
        async def rollout(example):
            answer = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": example}])
            return float(len(answer.choices[0].message.content or "") % 2)

        trainer = at.Trainer(MODEL, at.DryRunBackend(sys.argv[1] + "/dry"), rollout,
                             ["a", "b"], group_size=2, groups_per_step=2,
                             output_dir=sys.argv[1] + "/run", progress=False)
        await trainer.step()

asyncio.run(main())
"""

ARMS = {
    "arttrace demo --backend dry-run": (DEMO, ["--backend", "dry-run"]),
    "script: Trainer(model=factory)": (PRELUDE + SCRIPT.replace("MODEL", "model"), []),
    "script: import art; model first": (
        PRELUDE + "import art\n" + SCRIPT.replace("MODEL", "model()"),
        [],
    ),
}
CPU_ARM = "arttrace demo (CPU backend)"


def first_call(code: str, args: list[str]) -> tuple[float, bool]:
    """Seconds from starting ``python -c code`` to its first LLM call, and whether ART had
    loaded by then; the child is stopped there."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with tempfile.TemporaryDirectory() as out:
        started = time.time()
        child = subprocess.Popen(
            [sys.executable, "-c", code, f"{out}/run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert child.stdout is not None
        try:
            for line in child.stdout:
                if line.startswith("FIRST_LLM_CALL "):
                    _, at, loaded = line.split()
                    return float(at) - started, loaded == "True"
            raise RuntimeError(f"no LLM call before the process ended ({child.wait()})")
        finally:
            child.kill()
            child.wait()


def main(rounds: int, cpu: bool) -> None:
    arms = dict(ARMS)
    if cpu:
        arms[CPU_ARM] = (DEMO, [])
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    loaded: dict[str, bool] = {}
    load = os.getloadavg()[0]
    for r in range(rounds):
        names = list(arms)
        for arm in names[r % len(names) :] + names[: r % len(names)]:
            took, loaded[arm] = first_call(*arms[arm])
            seconds[arm].append(took)
    print(
        f"seconds from process start to the first rollout's first LLM call; {rounds} rounds;"
        f" load average {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    for arm, values in seconds.items():
        target = "   target <= 5 s " + ("PASS" if min(values) <= 5 else "MISS")
        print(
            f"  {arm:34s} min {min(values):6.2f}  median {statistics.median(values):6.2f}"
            f"   ART loaded by then: {'yes' if loaded[arm] else 'no'}"
            + (target if arm.startswith("arttrace demo --backend") else "")
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="also the CPU demo (slow)")
    args = parser.parse_args()
    main(args.rounds, args.cpu)
