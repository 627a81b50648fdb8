"""The ``arttrace`` command: one subcommand per job, each registered by a function below.

To add a command, write ``_add_<name>(commands)`` that calls :func:`._args.add_command` and sets
``run`` (a function of the parsed arguments and the parser, returning the exit code), and
list it in ``_COMMANDS``. Help texts are plain text; every option with a default shows it,
and one without (``None``) says in its help what happens without it. A command checks what it
can before it imports anything heavy (ART loads in about 30 s on 2 cores): a bad argument is
one error line, with its fix, under the command's own usage, and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .._errors import ConfigurationError
from . import gateway_command, serve_test_model
from ._args import HelpFormatter, add_command
from ._demo_checks import CPU_EXTRA, check_options, check_out, check_server, missing_cpu_module
from .export_command import add_export_command
from .runs_command import add_runs_command
from .view_command import add_view_command

_DESCRIPTION = (
    "arttrace captures what an existing LLM agent does and trains its model with "
    "reinforcement learning on OpenPipe ART. Documentation: the docs/ folder (mkdocs serve)."
)
type _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (default: the process's arguments); its exit status.

    An unknown option is named by the parser it belongs to: the command's (with its usage)
    when it comes after the command, else the top level's, with the list of commands."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = _build()
    args, unknown = parser.parse_known_args(argv)
    listed = (
        f"the commands: {', '.join(commands.choices)} ('arttrace COMMAND --help' for one's options)"
    )
    if args.command is None:
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}; {listed}")
        parser.error(f"a COMMAND is required; {listed}")
    command = commands.choices[args.command]
    if unknown:
        before = argv[: argv.index(args.command)] if args.command in argv else []
        owner = parser if any(arg in before for arg in unknown) else command
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = args.run
    return run(args, command)


def build_parser() -> argparse.ArgumentParser:
    """The ``arttrace`` parser, every command registered."""
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, _Subcommands]:
    parser = argparse.ArgumentParser(
        prog="arttrace",
        description=_DESCRIPTION,
        epilog="Run 'arttrace COMMAND --help' for a command's options.",
        formatter_class=HelpFormatter,
    )
    version = f"arttrace {importlib.metadata.version('arttrace')}"
    parser.add_argument("--version", action="version", version=version, help="print the version")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")  # none: main says so
    for add in _COMMANDS:
        add(commands)
    return parser, commands


# -- arttrace demo -------------------------------------------------------------------------


def _add_demo(commands: _Subcommands) -> None:
    demo = add_command(
        commands,
        "demo",
        "train a plain OpenAI agent with GRPO on this machine's CPU, offline",
        "Train a greeter agent (plain OpenAI SDK code, captured by arttrace) with GRPO "
        "through arttrace's Trainer. By default a tiny Qwen2 with random weights runs on this "
        "machine's CPU (CPUBackend): a short supervised warm-up teaches it four one-word "
        "greetings alike, then GRPO steps reward the house greeting; validation on held-out "
        "customers before and after shows it learned (about a minute and a half on 2 cores). "
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
        help="cpu: a tiny Qwen2 really learns on this machine's CPU (CPUBackend); dry-run: a "
        "scripted calculator model, each step written to disk (DryRunBackend), nothing learns "
        "(default: cpu; with --base-url, your server's runs written to disk as with dry-run)",
    )
    demo.add_argument(
        "--base-url",
        help="run the greeter's loop against your OpenAI-compatible server instead, e.g. a "
        "vLLM started with --return-tokens-as-token-ids (its /v1 URL; OPENAI_API_KEY is "
        "sent as its key); arttrace cannot update that server's weights, so each step is "
        "written to disk as ART's groups (DryRunBackend). Needs --model (default: none, the "
        "demo serves its own model)",
    )
    demo.add_argument(
        "--model",
        help="with --base-url: the model name your server serves (default: none; required "
        "with --base-url)",
    )
    demo.add_argument(
        "--examples",
        type=int,
        help="questions per step, one group each (default: cpu 8, dry-run 4)",
    )
    demo.add_argument(
        "--rollouts",
        type=int,
        help="runs per question, the group size (default: cpu 8, dry-run 4)",
    )
    demo.add_argument("--steps", type=int, help="GRPO steps (default: cpu 12, dry-run 2)")
    demo.add_argument(
        "--policies",
        type=int,
        choices=[1, 2],
        default=1,
        help="2: a front desk of two tiny models on the CPU backend that learn together, a "
        "router that picks the department and a greeter that answers, each with its own "
        "reward and validation curve (about twice the time of one)",
    )
    demo.add_argument(
        "--max-steps-off-policy",
        type=int,
        default=0,
        metavar="K",
        help="pipelined training: run the next K steps' rollouts while a step trains, each "
        "run sampling from a policy at most K steps old (default: 0, synchronous steps)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the model's initial weights, the customers, the scripted model's mistakes "
        "and the Trainer's shuffle: the same seed gives the same run",
    )
    demo.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the arguments, the folder, the extra and the server before ART loads (about 30 s
    on 2 cores), say what runs from the first second, then run it (progress on stderr, the
    summary on stdout)."""
    if min(v for v in (args.examples, args.rollouts, args.steps, 1) if v is not None) < 1:
        parser.error("--examples, --rollouts and --steps must be at least 1")
    if args.max_steps_off_policy < 0:
        parser.error("--max-steps-off-policy must be 0 (synchronous steps) or more")
    try:
        check_options(args.backend, args.base_url, args.model, args.policies)
        check_out(args.out)
    except ConfigurationError as error:
        parser.error(str(error))
    if args.base_url is not None:
        what = f"the greeter's loop against {args.model!r} at {args.base_url}"
    elif args.backend == "dry-run":
        what = "a scripted calculator agent, trained with GRPO on DryRunBackend (nothing learns)"
    else:
        what = (
            "a router and a greeter, two tiny models, learn together with GRPO"
            if args.policies == 2
            else "a greeter agent learns the house greeting with GRPO"
        ) + ", on this machine's CPU"
        if (missing := missing_cpu_module()) is not None:
            parser.error(
                f"No module named {missing!r}: the CPU backend needs the cpu extra (pip "
                "install 'arttrace[cpu]'); --backend dry-run runs without it"
            )
    _say(f"arttrace demo: {what}; output in {args.out}")
    if args.base_url is not None:
        _say(f"checking that {args.base_url} serves {args.model!r}")
        try:
            asyncio.run(check_server(args.base_url, args.model))
        except ConfigurationError as error:
            parser.error(str(error))
    started = time.perf_counter()
    try:
        from .demo import run_demo

        if args.backend == "dry-run" and args.base_url is None:
            _say("the rollouts start while ART loads in the background")
        else:  # the warm-up (or the dry-run report of a real server's runs) needs ART first
            _say("loading ART and torch (about 30 s on 2 cores)")
            from . import _greeter_demo  # noqa: F401

            _say(f"ART loaded in {time.perf_counter() - started:.0f} s")
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
                progress=True,
                max_steps_off_policy=args.max_steps_off_policy,
                policies=args.policies,
            )
        )
    except ValueError as error:
        parser.error(str(error))
    except ModuleNotFoundError as error:
        if error.name not in CPU_EXTRA:
            raise
        parser.error(
            f"{error}: the CPU backend needs the cpu extra (pip install 'arttrace[cpu]'); "
            "--backend dry-run runs without it"
        )
    _print_summary(summary, args.out)
    return 0


def _print_summary(summary: dict[str, object], out: Path) -> None:
    """The summary, one figure a line; ``<key>_step`` is shown as ``<key>``'s step."""
    steps = {k.removesuffix("_step"): v for k, v in summary.items() if k.endswith("_step")}
    shown = {k: v for k, v in summary.items() if not (k.endswith("_step") and k[:-5] in summary)}
    width = max(map(len, shown))
    print(f"arttrace demo: a plain OpenAI agent, trained with GRPO on {summary['backend']}")
    for key, value in shown.items():
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        if steps.get(key) is not None:
            text += f" (step {steps[key]})"
        print(f"  {key.replace('_', ' '):<{width}}  {text}")
    shipped = out / "dry_run"
    print(
        f"  metrics: {out / 'metrics.jsonl'}  validation: {out / 'validation.jsonl'}"
        f"\n  plot: {out / 'reward_plot.png'}  every run: {out / 'journal'}"
        + (f"\n  what ART would train on: {shipped}" if shipped.exists() else ""),
        flush=True,
    )


def _say(line: str) -> None:
    """What the command is doing, on stderr, at once."""
    print(line, file=sys.stderr, flush=True)


_COMMANDS: list[Callable[[_Subcommands], None]] = [
    _add_demo,
    gateway_command.add_parser,
    serve_test_model.add_parser,
    add_view_command,
    add_runs_command,
    add_export_command,
]
"""Each adds one subcommand; ``arttrace --help`` lists them in this order."""


if __name__ == "__main__":
    raise SystemExit(main())
