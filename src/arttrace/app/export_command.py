"""``arttrace export``: recorded runs as SFT data, a Parquet table, or OTel spans.

Every argument, the run folders and the output are checked before a run is read: a bad one is
one error line under the command's usage, exit status 2. A damaged journal or an endpoint that
refuses the spans is one error line, exit status 1. The summary line goes to stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from .._errors import ArttraceError, ConfigurationError
from ._args import add_command, checked

_DESCRIPTION = (
    "Export recorded runs (a Trainer's output_dir, an `arttrace gateway --out` folder, a "
    "trajectory saved with t.save(), or a folder of them). sft: JSONL in the OpenAI "
    "fine-tuning chat format with tools, one line per conversation with a trainable turn, as "
    "ART's train_sft_from_file and TRL's SFTTrainer read it; runs that raised are never "
    "exported. parquet: one row per run with its token ids, logprobs and training mask (as "
    "ART's tokenizer assembles them), its messages and outcome. otlp: each run as a trace of "
    "OTel GenAI spans (a root span per run, a span per LLM call, at their recorded times) sent "
    "to an OTLP/HTTP endpoint. Text shaped like a key is redacted in every export."
)


def _finite(value: float) -> str | None:
    return None if math.isfinite(value) else f"must be a finite number, got {value}"


def _header(text: str) -> str | None:
    name, equals, _ = text.partition("=")
    if equals and name.strip():
        return None
    return "takes NAME=VALUE, e.g. --header 'Authorization=Bearer ...' (the value is not shown)"


def add_export_command(subparsers: Any) -> None:
    """Register ``export`` on the ``arttrace`` command's subparsers."""
    parser = add_command(
        subparsers,
        "export",
        "export recorded runs as SFT data (JSONL), a Parquet table, or OTel GenAI spans "
        "sent to an OTLP endpoint",
        _DESCRIPTION,
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a run folder (journal/ inside), a saved trajectory .json, or a folder of them",
    )
    parser.add_argument(
        "--format", required=True, choices=["sft", "parquet", "otlp"], help="what to export"
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        help="the file to write (sft: a .jsonl name; parquet: e.g. runs.parquet); it is "
        "replaced whole when the export succeeds. Required for sft and parquet; not for otlp "
        "(default: none)",
    )
    parser.add_argument(
        "--best-per-group",
        action="store_true",
        help="only the best run of each group (a step's runs of one example: the highest "
        "reward, the first on a tie); with --min-reward, only if it reaches it",
    )
    parser.add_argument(
        "--min-reward",
        type=checked(float, _finite),
        metavar="X",
        help="only runs whose reward is X or more (default: any reward)",
    )
    parser.add_argument(
        "--split",
        choices=["train", "val", "all"],
        help="which runs: the training runs (and those that record no split: a gateway's, "
        "saved ones), the validation runs, or all (default: train for sft, all otherwise)",
    )
    parser.add_argument(
        "--policy",
        metavar="NAME",
        help="sft and parquet: the data of one policy of a system of several (its name, as "
        "@trainable(policy=...) or the Trainer journaled it, or its model's): only its turns "
        "are learned or trainable, the others context; its rewards choose the runs (default: "
        "every policy turn)",
    )
    parser.add_argument(
        "--endpoint",
        metavar="URL",
        help="otlp: the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318 "
        "(/v1/traces is added) (default: OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    parser.add_argument(
        "--header",
        action="append",
        type=checked(str, _header),
        metavar="NAME=VALUE",
        help="otlp: a header sent with every batch, e.g. an API key; repeat for more; never "
        "printed (default: OTEL_EXPORTER_OTLP_HEADERS)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the arguments, then export; the summary line on stdout."""
    from ..exports._source import check_paths
    from ..exports._summary import check_out

    fmt: str = args.format
    if fmt == "otlp":
        if args.out is not None:
            parser.error("--out is for --format sft and parquet; otlp sends to --endpoint")
        if args.policy is not None:
            parser.error("--policy is for --format sft and parquet (otlp sends every call)")
    else:
        if args.endpoint is not None or args.header:
            parser.error(f"--endpoint and --header are for --format otlp, not {fmt}")
        if args.out is None:
            example = "data.jsonl" if fmt == "sft" else "runs.parquet"
            parser.error(f"--format {fmt} needs --out, e.g. --out {example}")
        if (problem := check_out(args.out, ".jsonl" if fmt == "sft" else None)) is not None:
            hint = " (ART's train_sft_from_file reads only .jsonl)" if fmt == "sft" else ""
            parser.error(problem + hint)
    out: Path | None = args.out
    headers = dict(h.split("=", 1) for h in args.header or [])
    try:
        check_paths(args.run_dirs)
        if fmt == "otlp":
            from ..exports._otlp import endpoint_url

            endpoint_url(args.endpoint)
    except ConfigurationError as error:
        parser.error(str(error))
    selection: dict[str, Any] = {"best_per_group": args.best_per_group}
    selection["min_reward"] = args.min_reward
    if args.split is not None:
        selection["split"] = args.split
    try:
        if fmt == "otlp":
            from ..exports._otlp import export_otlp

            summary = export_otlp(args.run_dirs, args.endpoint, headers or None, **selection)
        else:
            assert out is not None  # checked above
            from ..exports._parquet import export_parquet
            from ..exports._sft import export_sft

            export = export_sft if fmt == "sft" else export_parquet
            summary = export(args.run_dirs, out, **selection, policy=args.policy)
    except ArttraceError as error:
        print(f"arttrace export: error: {error}", file=sys.stderr, flush=True)
        return 1
    print(summary.line(), flush=True)
    return 0
