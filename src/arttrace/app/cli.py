"""The ``arttrace`` command."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arttrace", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train a plain OpenAI agent for a few GRPO steps against the scripted server, "
        "shipping to a dry-run backend",
    )
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output directory")
    demo.add_argument("--examples", type=int, default=4, help="questions to ask")
    demo.add_argument("--rollouts", type=int, default=4, help="runs per question (group size)")
    demo.add_argument("--steps", type=int, default=2, help="GRPO steps")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.examples, args.rollouts, args.steps) < 1:
        parser.error("--examples, --rollouts and --steps must be at least 1")

    from .demo import run_demo

    try:
        summary = asyncio.run(
            run_demo(args.out, args.examples, args.rollouts, args.steps, args.seed)
        )
    except ValueError as error:
        parser.error(str(error))
    width = max(map(len, summary))
    print("arttrace demo: a plain OpenAI agent, trained with GRPO steps on a dry-run backend")
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"  {key.replace('_', ' '):<{width}}  {shown}")
    print(
        f"  metrics: {args.out / 'metrics.jsonl'}  plot: {args.out / 'reward_plot.png'}\n"
        f"  every run: {args.out / 'journal'}  what ART would train on: {args.out / 'dry_run'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
