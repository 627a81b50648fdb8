"""The ``arttrace`` command: one subcommand per job, each registered by a function below.

To add a command, write ``_add_<name>(commands)`` that calls :func:`_command` and sets
``run`` (a function of the parsed arguments and the parser, returning the exit code), and
list it in ``_COMMANDS``. Help texts are plain text; every option with a default shows it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

from .. import __version__
from . import gateway_command

_DESCRIPTION = (
    "arttrace captures what an existing LLM agent does and trains its model with "
    "reinforcement learning on OpenPipe ART. Documentation: the docs/ folder (mkdocs serve)."
)
type _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default shown after its help."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = args.run
    return run(args, parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arttrace",
        description=_DESCRIPTION,
        epilog="Run 'arttrace COMMAND --help' for a command's options.",
        formatter_class=_Formatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"arttrace {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(commands)
    return parser


def _command(
    commands: _Subcommands, name: str, summary: str, description: str
) -> argparse.ArgumentParser:
    """A subcommand with the shared formatter: ``summary`` in ``arttrace --help``,
    ``description`` in ``arttrace <name> --help``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=description, formatter_class=_Formatter
    )
    return parser


# -- arttrace demo -------------------------------------------------------------------------


def _add_demo(commands: _Subcommands) -> None:
    demo = _command(
        commands,
        "demo",
        "train a plain OpenAI agent for a few GRPO steps, offline",
        "Train a calculator agent (plain OpenAI SDK code, one tool) for a few GRPO steps "
        "against arttrace's scripted vLLM-compatible server on 127.0.0.1, shipping each step "
        "to DryRunBackend, which writes what ART would train on. Needs no GPU and no network.",
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="output folder: metrics, reward plot, journal of every run, dry-run groups "
        "(an earlier demo there is replaced; any other non-empty folder is refused)",
    )
    demo.add_argument(
        "--backend",
        choices=["cpu", "dry-run"],
        default="dry-run",
        help="cpu: a tiny Qwen2 really learns a task on this machine's CPU (CPUBackend); "
        "dry-run: a scripted model, steps written to disk (DryRunBackend)",
    )
    demo.add_argument(
        "--examples", type=int, help="questions per step, one group each (cpu 8, dry-run 4)"
    )
    demo.add_argument(
        "--rollouts", type=int, help="runs per question, the group size (cpu 8, dry-run 4)"
    )
    demo.add_argument("--steps", type=int, help="GRPO steps (cpu 12, dry-run 2)")
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the questions, the scripted model's mistakes and the Trainer's shuffle: "
        "the same seed gives the same run",
    )
    demo.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if min(v for v in (args.examples, args.rollouts, args.steps, 1) if v is not None) < 1:
        parser.error("--examples, --rollouts and --steps must be at least 1")

    from .demo import run_demo

    try:
        summary = asyncio.run(
            run_demo(args.out, args.examples, args.rollouts, args.steps, args.seed, args.backend)
        )
    except ValueError as error:
        parser.error(str(error))
    width = max(map(len, summary))
    print(f"arttrace demo: a plain OpenAI agent, trained with GRPO on the {args.backend} backend")
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"  {key.replace('_', ' '):<{width}}  {shown}")
    print(
        f"  metrics: {args.out / 'metrics.jsonl'}  plot: {args.out / 'reward_plot.png'}\n"
        f"  every run: {args.out / 'journal'}"
        + (
            f"  what ART would train on: {args.out / 'dry_run'}"
            if args.backend == "dry-run"
            else ""
        )
    )
    return 0


_COMMANDS: list[Callable[[_Subcommands], None]] = [_add_demo, gateway_command.add_parser]
"""Each adds one subcommand; ``arttrace --help`` lists them in this order."""


if __name__ == "__main__":
    raise SystemExit(main())
