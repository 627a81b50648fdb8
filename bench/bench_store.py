"""What the run store costs on a large run: index build time and size, memory while indexing,
a refresh with nothing new, and query times.

A synthetic Trainer folder is written from one real captured trajectory (the dry-run demo's
calculator agent: a tool call, the tool's result, the answer; captured through the OpenAI
shim from the scripted model over HTTP), varied run by run: example ids (1,000 examples, 16
groups x 8 runs per step), rewards, the numbers in the question and the answer, ~1% of runs
raising, ~4% with an
untrainable turn ("generation aborted") and ~2% with no policy turn. Each run's token arrays
are stretched to ``--tokens`` tokens (prompt ids + sampled ids over its calls), and its user
message and answer hold ~0.5 words per token, Zipf-drawn from a 2,000-word vocabulary (the
text search's index grows with the text); each step has its ``metrics.jsonl`` line and
``shipped.json``.

Then, each in a fresh process (so its peak RSS is its own): indexing the folder from scratch
(wall time, peak RSS as ``VmHWM``, index size after the last connection closed), a refresh with
nothing new, and the queries (p50 / p99 over ``--repeat`` rounds).

    python bench/bench_store.py --runs 10000 --tokens 1000 [--dir /tmp/bench_store]
    python bench/bench_store.py --runs 100000 --tokens 1000
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

GROUPS, GROUP_SIZE = 16, 8
EXAMPLES = 1000
VOCABULARY = [f"{a}{b}" for a in ("zeb", "kor", "mal", "tin", "pra") for b in range(400)]
_ZIPF = [1 / rank for rank in range(1, len(VOCABULARY) + 1)]
TEXT_WORDS = 0.5
"""Words of message text per token of the run (prompts and samples): each run's user message
and answer are padded with vocabulary words to about this many (a 1,000-token run holds ~500
words of text for the search index, most of an agent's prompt being messages)."""


def template() -> dict[str, Any]:
    """A real captured run: the dry-run demo's first journal line (made here if needed)."""
    demo = Path(os.environ.get("BENCH_STORE_DEMO", "/tmp/bench_store_demo"))
    journal = demo / "journal" / "step-00000" / "rollouts.jsonl"
    if not journal.exists():
        arttrace = Path(sys.executable).with_name("arttrace")
        command = [
            str(arttrace),
            "demo",
            "--backend",
            "dry-run",
            "--out",
            str(demo),
            "--steps",
            "1",
        ]
        subprocess.run(command, check=True, capture_output=True)
    return dict(json.loads(journal.read_text().splitlines()[0])["trajectory"])


def stretch(trajectory: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The run with each call's prompt and sampled ids (and logprobs) cycled to ~``tokens``
    in all, in the same proportions."""
    t = copy.deepcopy(trajectory)
    calls = t["calls"]
    now = sum(len(c["prompt_token_ids"]) + len(c["choices"][0]["token_ids"]) for c in calls)
    for call in calls:
        call["prompt_token_ids"] = _cycled(call["prompt_token_ids"], tokens / now)
        choice = call["choices"][0]
        choice["token_ids"] = _cycled(choice["token_ids"], tokens / now)
        choice["logprobs"] = _cycled(choice["logprobs"], tokens / now)
        call["usage"] = {
            "prompt_tokens": len(call["prompt_token_ids"]),
            "completion_tokens": len(choice["token_ids"]),
            "total_tokens": len(call["prompt_token_ids"]) + len(choice["token_ids"]),
        }
    return t


def _cycled(values: list[Any], factor: float) -> list[Any]:
    n = max(1, round(len(values) * factor))
    return (values * (n // len(values) + 1))[:n]


def _words(rng: random.Random, n: int) -> list[str]:
    """``n`` words of the vocabulary, Zipf-distributed as words of text are."""
    return rng.choices(VOCABULARY, weights=_ZIPF, k=n)


def write_run(folder: Path, runs: int, tokens: int, seed: int = 0) -> dict[str, float]:
    """A Trainer folder of ``runs`` journaled runs; returns its size figures."""
    rng = random.Random(seed)
    base = stretch(template(), tokens)
    per_step = GROUPS * GROUP_SIZE
    text_words = round(TEXT_WORDS * tokens)
    steps = -(-runs // per_step)
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "journal").mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"completed_steps": steps}))
    first, second = base["calls"]
    question = first["messages"][1]
    answer = second["choices"][0]["message"]
    arguments = first["choices"][0]["message"]["tool_calls"][0]["function"]
    tool = second["messages"][3]
    written = sampled = 0
    with open(folder / "metrics.jsonl", "wb") as metrics:
        for step in range(steps):
            directory = folder / "journal" / f"step-{step:05d}"
            directory.mkdir()
            rewards: list[float] = []
            count = min(per_step, runs - step * per_step)
            with open(directory / "rollouts.jsonl", "wb") as out:
                for i in range(count):
                    position, k = divmod(i, GROUP_SIZE)
                    a, b = rng.randrange(100), rng.randrange(100)
                    words = _words(rng, text_words)
                    cut = len(words) // 5
                    question["content"] = f"What is {a}+{b}? {' '.join(words[:cut])}"
                    second["messages"][1]["content"] = question["content"]
                    arguments["arguments"] = json.dumps({"a": a, "b": b})
                    tool["content"] = str(a + b)
                    answer["content"] = f"The answer is {a + b}. {' '.join(words[cut:])}"
                    reward = rng.choice((0.0, 0.5, 1.0))
                    roll = rng.random()
                    base["exception"] = (
                        {"type": "ValueError", "message": "boom", "traceback": "..."}
                        if roll < 0.01
                        else None
                    )
                    first["trainable"] = second["trainable"] = not 0.01 <= roll < 0.03
                    second["choices"][0]["finish_reason"] = "abort" if roll >= 0.96 else "stop"
                    base["example_id"] = f"ex-{(step * GROUPS + position) % EXAMPLES}"
                    base["reward"] = reward
                    base["metadata"] = {
                        "split": "train",
                        "step": step,
                        "rollout": k,
                        "policy_step": step,
                    }
                    base["started_at"] = 1.8e9 + step * 60 + i * 0.1
                    base["ended_at"] = base["started_at"] + 2.0
                    line = orjson.dumps({"slot": [position, k], "trajectory": base}) + b"\n"
                    out.write(line)
                    written += len(line)
                    sampled += sum(
                        len(c["prompt_token_ids"]) + len(c["choices"][0]["token_ids"])
                        for c in base["calls"]
                    )
                    rewards.append(reward)
            mean = statistics.fmean(rewards)
            record = {
                "step": step,
                "epoch": 0,
                "reward_mean": mean,
                "reward_std": statistics.pstdev(rewards),
                "groups_total": GROUPS,
                "groups_kept": GROUPS,
                "groups_dropped": 0,
                "trainable_tokens": 1000,
                "rollout_seconds": 10.0,
                "train_seconds": 5.0,
                "off_policy_steps_mean": 0.0,
            }
            metrics.write(orjson.dumps(record) + b"\n")
            shipped = {"groups": GROUPS, "metrics": record, "trainable_tokens": {}}
            (directory / "shipped.json").write_text(json.dumps(shipped))
    return {"bytes": written, "tokens": sampled, "steps": steps}


# -- measured in a child process ------------------------------------------------------------


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child_index(folder: Path) -> dict[str, Any]:
    from arttrace.store import open_run

    before = _rss_mb()
    started, cpu = time.perf_counter(), time.process_time()
    store = open_run(folder)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    runs = store.count()
    store.close()
    index = folder / ".arttrace-index.sqlite"
    size = sum(p.stat().st_size for p in folder.glob(".arttrace-index.sqlite*") if p.exists())
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "runs": runs,
        "rss_before_mb": before,
        "peak_rss_mb": _peak_rss_mb(),
        "index_mb": size / 2**20,
        "index_file": str(index),
    }


def child_queries(folder: Path, repeat: int) -> dict[str, Any]:
    from arttrace.store import open_run

    started = time.perf_counter()
    store = open_run(folder)
    opened = time.perf_counter() - started
    last = store.steps()[-1].step
    examples = min(EXAMPLES, (last + 1) * GROUPS)
    ids = [r.id for r in store.trajectories(step=last // 2, limit=50)]
    rng = random.Random(1)
    cases: dict[str, Any] = {
        "refresh, nothing new": lambda: store.refresh(),
        "count()": lambda: store.count(),
        "count(min_reward=0.5)": lambda: store.count(min_reward=0.5),
        "count(cause=...)": lambda: store.count(cause="generation aborted"),
        "count(text=rare word)": lambda: store.count(text=rng.choice(VOCABULARY[1000:])),
        "count(text=common word)": lambda: store.count(text=VOCABULARY[0]),
        "count(text=word in every run)": lambda: store.count(text="answer"),
        "trajectories(step=s)": lambda: store.trajectories(step=rng.randrange(last + 1)),
        "trajectories() first page": lambda: store.trajectories(limit=50),
        "trajectories(offset=deep)": lambda: store.trajectories(limit=50, offset=50_000),
        "trajectories(min_reward=1, order=-reward)": lambda: store.trajectories(
            min_reward=1.0, order="-reward", limit=50
        ),
        "trajectories(example_id=...)": lambda: store.trajectories(
            example_id=f"ex-{rng.randrange(examples)}"
        ),
        "trajectories(cause=...)": lambda: store.trajectories(cause="generation aborted", limit=50),
        "trajectories(text=rare word)": lambda: store.trajectories(
            text=rng.choice(VOCABULARY[1000:]), limit=50
        ),
        "trajectories(text=two common words)": lambda: store.trajectories(
            text=f"{VOCABULARY[0]} {VOCABULARY[1]}", limit=50
        ),
        "trajectories(text=rare word, min_reward=0.5)": lambda: store.trajectories(
            text=rng.choice(VOCABULARY[1000:]), min_reward=0.5, limit=50
        ),
        "groups(step)": lambda: store.groups(rng.randrange(last + 1)),
        "steps()": lambda: store.steps(),
        "causes()": lambda: store.causes(),
        "summary()": lambda: store.summary(),
        "trajectory(id)": lambda: store.trajectory(rng.choice(ids)),
    }
    out: dict[str, Any] = {"open_seconds": opened, "rss_mb": 0.0, "queries": {}}
    for name, run in cases.items():
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        out["queries"][name] = {
            "p50_ms": times[len(times) // 2],
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
        }
    out["rss_mb"] = _rss_mb()
    out["peak_rss_mb"] = _peak_rss_mb()
    store.close()
    return out


def _child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per run (about)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench_store"))
    parser.add_argument("--repeat", type=int, default=100, help="rounds per query")
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    parser.add_argument("--child", choices=["index", "queries"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = args.dir / f"run-{args.runs}"
    if args.child == "index":
        print(json.dumps(child_index(folder)))
        return
    if args.child == "queries":
        print(json.dumps(child_queries(folder, args.repeat)))
        return
    started = time.perf_counter()
    size = write_run(folder, args.runs, args.tokens)
    print(
        f"wrote {args.runs} runs, {size['steps']} steps: {size['bytes'] / 2**20:.0f} MiB of "
        f"journal, {size['tokens'] / 1e6:.1f}M tokens ({size['tokens'] / args.runs:.0f} per run) "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    common = ["--runs", str(args.runs), "--dir", str(args.dir), "--repeat", str(args.repeat)]
    built = _child([*common, "--child", "index"])
    print(
        f"index built in {built['seconds']:.1f} s, {built['cpu_seconds']:.1f} s of CPU "
        f"({built['runs'] / built['seconds']:.0f} runs/s, "
        f"{size['bytes'] / 2**20 / built['seconds']:.0f} MiB/s); index {built['index_mb']:.1f} "
        f"MiB ({built['index_mb'] * 2**20 / built['runs']:.0f} bytes per run); peak RSS "
        f"{built['peak_rss_mb']:.0f} MiB (after imports {built['rss_before_mb']:.0f} MiB)",
        flush=True,
    )
    queried = _child([*common, "--child", "queries"])
    print(
        f"open_run on the built index: {queried['open_seconds'] * 1000:.1f} ms; RSS after all "
        f"queries {queried['rss_mb']:.0f} MiB (peak {queried['peak_rss_mb']:.0f} MiB)"
    )
    width = max(map(len, queried["queries"]))
    print(f"  {'query':<{width}}  {'p50 ms':>8}  {'p99 ms':>8}")
    for name, t in queried["queries"].items():
        print(f"  {name:<{width}}  {t['p50_ms']:8.2f}  {t['p99_ms']:8.2f}")
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
