"""``arttrace runs``: run folders in a table, and the runs in them found by step, reward,
example, untrainable cause or text. Loads no ART: the store imports only the capture core."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._args import add_command

if TYPE_CHECKING:
    from ..store import RunStore

ORDERS = ("step", "-step", "reward", "-reward", "id", "-id")
"""``arttrace.store.ORDERS``' names, here so that building the parser imports nothing."""
_FILTERS = (
    "step",
    "split",
    "example",
    "min_reward",
    "max_reward",
    "cause",
    "text",
    "node",
    "policy",
)
_DESCRIPTION = (
    "Summarise run folders: a Trainer's output_dir, an `arttrace gateway --out` folder, a saved "
    "trajectory (.json) or a folder of them. One line per folder: steps, runs, mean reward of "
    "the first and last step, groups shipped and dropped, trainable tokens, runs that raised, "
    "untrainable causes. --steps, --groups, --trajectories, --count, --causes and --show look "
    "inside; a filter alone lists the runs that pass it. The first look at a folder indexes it "
    "(.arttrace-index.sqlite in the folder, or in ~/.cache/arttrace when it is not writable); "
    "later ones read only what was appended since."
)
_EPILOG = """\
examples:
  arttrace runs runs/train runs/train-lr2          two runs side by side
  arttrace runs runs/train --steps                 reward, groups, tokens, loss per step
  arttrace runs runs/train --groups --step 3       each group: rewards, spread, why not shipped
  arttrace runs runs/train --step 3 --min-reward 0.5 --text refund
  arttrace runs runs/train --cause "no logprobs" --json | jq .id
  arttrace runs runs/train --policy planner        runs holding a turn of the planner
  arttrace runs runs/train --show 201326593        one run whole (JSON), by its id
"""


def add_runs_command(subparsers: Any) -> None:
    """Register ``runs`` on the ``arttrace`` command's subparsers."""
    parser = add_command(
        subparsers,
        "runs",
        "summarise run folders (Trainer, gateway, saved trajectories) and query their runs",
        _DESCRIPTION,
        _EPILOG,
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="a Trainer's output_dir, an `arttrace gateway --out` folder, a saved trajectory "
        ".json, or a folder of them",
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--steps",
        action="store_true",
        help="one line per step: reward, groups shipped, trainable tokens, loss, policy lag, "
        "seconds in rollouts and training, validation reward",
    )
    view.add_argument(
        "--groups",
        action="store_true",
        help="one line per group (of --step, else of every step): rewards, spread, trainable "
        "tokens, shipped or why not",
    )
    view.add_argument(
        "--trajectories", action="store_true", help="list the runs that pass the filters"
    )
    view.add_argument("--count", action="store_true", help="how many runs pass the filters")
    view.add_argument(
        "--causes",
        action="store_true",
        help="each untrainable cause and how many runs have it",
    )
    view.add_argument(
        "--show",
        type=int,
        metavar="ID",
        help="print run ID whole, as its file holds it (JSON); ids are in --trajectories "
        "(default: none, the summary)",
    )
    filters = parser.add_argument_group("filters (of --trajectories and --count)")
    filters.add_argument(
        "--step",
        type=int,
        help="runs of this step (with --groups: this step's groups) (default: every step)",
    )
    filters.add_argument(
        "--split", help='runs of this split ("train" in a Trainer\'s folder) (default: any)'
    )
    filters.add_argument(
        "--example", metavar="EXAMPLE_ID", help="runs of this example id (default: any)"
    )
    filters.add_argument(
        "--min-reward", type=float, help="runs with at least this reward (default: any)"
    )
    filters.add_argument(
        "--max-reward", type=float, help="runs with at most this reward (default: any)"
    )
    filters.add_argument(
        "--cause",
        help="runs with this untrainable cause, as --causes lists it (exact) (default: any)",
    )
    filters.add_argument(
        "--text",
        help="runs whose messages (user, assistant, tool, tool call arguments) hold every word "
        "of TEXT (whole words, word* for a prefix) (default: any text)",
    )
    filters.add_argument(
        "--node",
        help="runs made on this Ray node (RayExecutor), by its id or its address (default: any)",
    )
    filters.add_argument(
        "--policy",
        metavar="NAME",
        help="runs holding a turn of this policy (a Trainer of several policies, whose summary "
        "line names them); with --groups, that policy's groups (default: any)",
    )
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="step",
        help="order of --trajectories (-: descending; runs without reward last)",
    )
    parser.add_argument("--limit", type=int, default=50, help="at most this many runs (0: all)")
    parser.add_argument("--offset", type=int, default=0, help="skip this many runs first")
    parser.add_argument("--json", action="store_true", help="JSON lines: one object per row")
    parser.set_defaults(run=run_runs)


def run_runs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Check the arguments, open each folder (indexing what is new), print what was asked."""
    if args.limit < 0 or args.offset < 0:
        parser.error("--limit and --offset must be 0 or more")
    if args.show is not None and len(args.run_dirs) > 1:
        parser.error("--show takes one RUN_DIR (a run's id belongs to its folder)")
    filtered = any(getattr(args, name) is not None for name in _FILTERS)
    listing = args.trajectories or (
        filtered and not (args.count or args.groups or args.steps or args.causes)
    )
    if filtered and args.show is None and not (listing or args.count or args.groups):
        parser.error("filters apply to --trajectories, --count and (--step) --groups")
    from .._errors import ConfigurationError, JournalError
    from ..store import open_run

    out = _Output(args.json)
    for path in args.run_dirs:
        try:
            with open_run(path) as store:
                for problem in store.problems:
                    print(f"arttrace runs: {problem} (left out)", file=sys.stderr)
                if args.show is not None:
                    print(json.dumps(_show(store, args.show, parser)))
                elif listing:
                    _trajectories(store, args, out, len(args.run_dirs) > 1)
                elif args.count:
                    out.row(store, {"runs": store.count(**_filters(args))})
                elif args.steps:
                    _steps(store, out)
                elif args.groups:
                    _groups(store, args.step, args.policy, out)
                elif args.causes:
                    for cause, runs in store.causes().items():
                        out.row(store, {"cause": cause, "runs": runs})
                    if not store.causes() and not out.json:
                        out.note(f"{store.path}: every policy turn of every run is trainable")
                else:
                    out.row(store, _summary(store))
        except ConfigurationError as error:
            parser.error(str(error))
        except JournalError as error:
            out.flush()
            print(f"arttrace runs: {error}", file=sys.stderr)
            return 1
        out.table_break()
    out.flush()
    return 0


def _show(store: RunStore, row_id: int, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        return store.trajectory_dict(row_id)
    except KeyError:
        parser.error(
            f"{store.path} has no run {row_id}: take an id from "
            f"`arttrace runs {store.path} --trajectories`"
        )


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "step": args.step,
        "split": args.split,
        "example_id": args.example,
        "min_reward": args.min_reward,
        "max_reward": args.max_reward,
        "cause": args.cause,
        "text": args.text,
        "node": args.node,
        "policy": args.policy,
    }


def _trajectories(store: RunStore, args: argparse.Namespace, out: _Output, many: bool) -> None:
    rows = store.trajectories(
        **_filters(args), order=args.order, limit=args.limit or None, offset=args.offset
    )
    located = any(row.node_id for row in rows)
    several = len(store.policies()) > 1
    for row in rows:
        if out.json:
            data = dataclasses.asdict(row)
            out.row(store, {**data, "file": str(row.file)})
            continue
        shown = {
            "id": row.id,
            "step": row.step,
            "slot": "" if row.position is None else f"{row.position}/{row.rollout}",
            "example": _cut(row.example_id, 32),
            "reward": row.reward,
            "calls": row.calls,
            "trainable": f"{row.trainable_turns} turns, {row.trainable_tokens} tok",
            "causes": "; ".join(row.causes),
            "exception": "" if row.exception_type is None else row.exception_type,
        }
        if several:  # a Trainer of several policies: each run's, and its reward for each
            shown["policies"] = " ".join(
                f"{p}={_text(row.reward_for(p))}" if row.policy_rewards else p for p in row.policies
            )
        if located:  # made on Ray: the node (address, id's start) and worker process
            shown["ran on"] = (
                f"{row.node_address} {row.node_id[:8]} pid {row.worker_pid}" if row.node_id else ""
            )
        out.row(store, shown, labelled=many)
    if not out.json:
        total = store.count(**_filters(args))
        if total > len(rows):
            shown_to = args.offset + len(rows)
            out.note(f"runs {args.offset + 1}-{shown_to} of {total} (--limit, --offset)")


def _steps(store: RunStore, out: _Output) -> None:
    validations = store.validations()
    validation = {v.step: v.reward_mean for v in validations}
    steps = store.steps()
    policies = [p for p in store.policies() if any(f"{p}/reward_mean" in s.metrics for s in steps)]
    by_policy = {p: {v.step: v.of_policy(p).reward_mean for v in validations} for p in policies}
    for s in steps:
        if out.json:
            own = {
                p: {**dataclasses.asdict(s.of_policy(p)), "val_reward": by_policy[p].get(s.step)}
                for p in policies
            }
            extra = {"policies": own} if own else {}
            out.row(store, {**dataclasses.asdict(s), "val_reward": validation.get(s.step), **extra})
            continue
        each: dict[str, Any] = {}
        for p in policies:  # several policies: each one's reward, validation and groups
            mine = s.of_policy(p)
            each[f"{p} reward"] = _pm(mine.reward_mean, mine.reward_std)
            each[f"{p} val"] = by_policy[p].get(s.step)
            each[f"{p} shipped"] = f"{mine.groups_kept}/{mine.groups_total}"
        out.row(
            store,
            {
                "step": s.step,
                "epoch": s.epoch,
                "reward": _pm(s.reward_mean, s.reward_std),
                "val reward": validation.get(s.step),
                "groups shipped": f"{s.groups_kept}/{s.groups_total}",
                "trainable tokens": s.trainable_tokens,
                "loss": s.loss,
                "policy lag": s.policy_lag,
                "rollout s": s.rollout_seconds,
                "train s": s.train_seconds,
                **each,
            },
            labelled=False,
        )
    if not out.json and not store.steps():
        out.note(f"{store.path}: no step recorded ({store.kind}: no metrics.jsonl line yet)")


def _groups(store: RunStore, step: int | None, policy: str | None, out: _Output) -> None:
    steps = [step] if step is not None else store.journal_steps()
    for s in steps:
        for g in store.groups(s, policy):
            if out.json:
                out.row(store, dataclasses.asdict(g))
                continue
            out.row(
                store,
                {
                    "step": g.step,
                    "pos": g.position,
                    **({} if g.policy is None else {"policy": g.policy}),
                    "example": _cut(g.example_id, 32),
                    "rewards": " ".join("-" if r is None else f"{r:g}" for r in g.rewards),
                    "spread": g.spread,
                    "tokens": g.trainable_tokens,
                    "raised": g.exceptions,
                    "shipped": "yes" if g.shipped else f"no: {g.why_not}",
                },
                labelled=False,
            )


def _summary(store: RunStore) -> dict[str, Any]:
    s = store.summary()
    causes = ", ".join(f"{cause} ({n})" for cause, n in list(s.causes.items())[:3])
    if len(s.causes) > 3:
        causes += f", {len(s.causes) - 3} more"
    return {
        "run": str(s.path),
        "kind": s.kind,
        "steps": s.steps,
        "runs": s.runs,
        "reward first": s.reward_first,
        "reward last": s.reward_last,
        "groups shipped": s.groups_shipped,
        "groups dropped": s.groups_dropped,
        "trainable tokens": s.trainable_tokens,
        "exceptions": s.exceptions,
        "untrainable causes": causes or "none",
        **({"policies": ", ".join(s.policies)} if len(s.policies) > 1 else {}),
    }


class _Output:
    """Rows as an aligned table (printed when a table ends) or as JSON lines (at once)."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json
        self._rows: list[dict[str, str]] = []
        self._notes: list[str] = []

    def row(self, store: RunStore, values: dict[str, Any], *, labelled: bool = True) -> None:
        """One row; as JSON it always says its folder (``run``), in a table when ``labelled``."""
        if self.json:
            record = values if "run" in values else {"run": str(store.path), **values}
            print(json.dumps(_nulled(record), default=str))
            return
        label = {"run": str(store.path)} if labelled and "run" not in values else {}
        self._rows.append({**label, **{k: _text(v) for k, v in values.items()}})

    def note(self, line: str) -> None:
        self._notes.append(line)

    def table_break(self) -> None:
        """Tables of one kind per folder print together only for the summary (one line each)."""
        if self._rows and "kind" not in self._rows[0]:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            _print_table(self._rows)
            self._rows = []
        for line in self._notes:
            print(line)
        self._notes = []


def _print_table(rows: Sequence[dict[str, str]]) -> None:
    columns = list(dict.fromkeys(c for r in rows for c in r))  # a column some rows lack: "-"
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r.get(c, "-").ljust(widths[c]) for c in columns).rstrip())


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" + ("" if std is None else f" ± {std:.3f}")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _nulled(value: Any) -> Any:
    """NaN and infinities as ``null``: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, Iterable) and not isinstance(value, str):
        return [_nulled(v) for v in value]
    return value
