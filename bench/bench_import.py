"""What ``import arttrace; arttrace.instrument()`` costs a process that only captures.

Each measurement is a fresh interpreter (``python -X importtime`` is not used: it slows the
import it measures). In each round, in rotating order:

- ``python -c pass``: the interpreter's own start, the baseline;
- ``import arttrace; arttrace.instrument()``: the capture core (target: <= 0.3 s above the
  baseline, and neither ``art`` nor ``torch`` loaded);
- ``import arttrace; arttrace.Trainer``: the first access to the Trainer, which must not load
  ART either (a Trainer imports it in a background thread when it is built);
- ``import art``: what ART (and torch through it) costs the process that trains, paid in the
  background by a Trainer; for information, in the first ``--training-rounds`` rounds only
  (it takes seconds, and the first one may read ART and torch from a cold file cache).

Each child reports, from ``sys.modules`` at its end, which heavy modules it loaded. The
figures are the wall and CPU times (user + system) of the whole child process (start, import,
exit), min and median over the rounds; "above baseline" is the median of per-round
differences, so the arms share the machine's load. On a busy machine the CPU time is the
steadier figure; the target is on the wall time.

    python bench/bench_import.py [--rounds N] [--training-rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HEAVY = ("art", "torch", "openai", "wrapt", "transformers", "opentelemetry.sdk", "httpx")
REPORT = f"import json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
ARMS = {
    "python -c pass": "pass",
    "import arttrace; instrument()": f"import arttrace; arttrace.instrument(); {REPORT}",
    "import arttrace; .Trainer": f"import arttrace; arttrace.Trainer; {REPORT}",
    "import art": f"import art; {REPORT}",
}
BASELINE, CORE, TRAINER, TRAINING = ARMS


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(code: str) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds of a fresh ``python -c code``, and the heavy modules it reports."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    seconds, cpu = time.perf_counter() - started, children_cpu() - cpu
    last = done.stdout.strip().splitlines()[-1:] or ["[]"]
    return seconds, cpu, json.loads(last[0])


def main(rounds: int, training_rounds: int) -> None:
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpus: dict[str, list[float]] = {arm: [] for arm in ARMS}
    loaded: dict[str, list[str]] = {}
    names = list(ARMS)
    load_before = os.getloadavg()[0]
    for r in range(rounds):
        for arm in names[r % len(names) :] + names[: r % len(names)]:
            if arm == TRAINING and len(times[TRAINING]) >= training_rounds:
                continue
            seconds, cpu, modules = run(ARMS[arm])
            times[arm].append(seconds)
            cpus[arm].append(cpu)
            loaded[arm] = modules

    print(
        f"{rounds} rounds, each arm a fresh `{os.path.basename(sys.executable)} -c ...`;"
        f" load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    print(f"  (the training import runs in the first {training_rounds} rounds only: it is slow)")
    for clock, values in (("wall", times), ("CPU", cpus)):
        print(f"  {clock} seconds of the whole child process:")
        base = values[BASELINE]
        for arm in [a for a in names if values[a]]:  # --training-rounds 0: none
            walls = values[arm]
            above = [w - b for w, b in zip(walls, base, strict=False)]  # training: fewer rounds
            line = f"    {arm:31s} min {min(walls):6.3f}  median {statistics.median(walls):6.3f}"
            if arm != BASELINE:
                line += f"   above baseline: median {statistics.median(above):6.3f}"
                line += f" [{min(above):.3f} .. {max(above):.3f}]"
            print(line)
    for arm in names[1:]:
        print(f"  {arm} loads: {', '.join(loaded[arm]) or 'none of ' + ', '.join(HEAVY)}")
    core = statistics.median(w - b for w, b in zip(times[CORE], times[BASELINE], strict=True))
    core_cpu = statistics.median(w - b for w, b in zip(cpus[CORE], cpus[BASELINE], strict=True))
    heavy = [m for m in ("art", "torch") if m in loaded[CORE] or m in loaded[TRAINER]]
    print(
        f"  capture core: {core:.3f} s wall ({core_cpu:.3f} s CPU) above the interpreter"
        " (target <= 0.3 s)"
        f" {'PASS' if core <= 0.3 else 'MISS'};"
        f" art/torch loaded (with arttrace.Trainer too): {', '.join(heavy) or 'neither'}"
        f" {'MISS' if heavy else 'PASS'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--training-rounds", type=int, default=3)
    args = parser.parse_args()
    main(args.rounds, args.training_rounds)
