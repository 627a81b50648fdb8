"""The ``arttrace`` command."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arttrace", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="capture a plain OpenAI agent against the scripted server and save its runs"
    )
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output directory")
    demo.add_argument("--examples", type=int, default=4, help="questions to ask")
    demo.add_argument("--rollouts", type=int, default=4, help="runs per question (group size)")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.examples < 1 or args.rollouts < 1:
        parser.error("--examples and --rollouts must be at least 1")

    from .demo import run_demo

    summary = asyncio.run(run_demo(args.out, args.examples, args.rollouts, args.seed))
    width = max(map(len, summary))
    print("arttrace demo: a plain OpenAI agent, captured for ART")
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"  {key.replace('_', ' '):<{width}}  {shown}")
    print(f"  runs: {args.out / 'trajectories'}  ART groups: {args.out / 'art_groups.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
