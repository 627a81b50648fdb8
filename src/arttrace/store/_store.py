"""``open_run(path)``: a run folder's steps, validations, groups and runs as typed rows, from
an index that grows with the journal (``_index``), for the viewer, the exports and
``arttrace runs``."""

from __future__ import annotations

import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypedDict, Unpack

from .._errors import ConfigurationError, JournalError
from .._journal import advantages, loads, read_json
from ..capture._trajectory import Trajectory
from . import _scan
from ._index import SEPARATOR, Index
from ._rows import GroupRow, Kind, RunSummary, StepRow, TrajectoryRow, ValidationRow

ORDERS = {
    "step": "runs.step, position, rollout, runs.id",
    "-step": "runs.step DESC, position, rollout, runs.id",
    "reward": "reward NULLS LAST, runs.id",
    "-reward": "reward DESC, runs.id DESC",
    "id": "runs.id",
    "-id": "runs.id DESC",
}
"""The orders :meth:`RunStore.trajectories` takes (``-``: descending; no reward last)."""
_COLUMNS = (
    "runs.id, runs.step, position, rollout, split, example_id, reward, exception_type, "
    "exception_message, policy_step, calls, trainable_turns, completion_tokens, "
    "trainable_tokens, causes, sources, started_at, ended_at, node_id, node_address, "
    "worker_pid, files.path, runs.start, length, runs.set_aside, runs.policies, per_policy, "
    "policy_rewards"
)
_FROM = "runs JOIN files ON files.id = runs.file_id"
_WHY_NOT = {
    "flat": "flat: every run got the same reward",
    "below_min_spread": "flat: reward spread {spread:.4g} is below min_reward_spread",
    "curriculum": "excluded by the curriculum",
}
"""The words for a :data:`~arttrace._journal.WhyNot` (``failed``, ``no_trainable_token``: see
``_Shipping._why_not``)."""
_TOKEN = re.compile(r"[^\W_]+")
"""A token as SQLite's unicode61 tokenizer sees one: a run of letters and digits."""


def open_run(path: str | os.PathLike[str]) -> RunStore:
    """The run at ``path``, indexed up to what its files hold now.

    ``path``: a Trainer's ``output_dir``, an ``arttrace gateway --out`` folder, a saved
    trajectory (``Trajectory.save``) or a folder of them. Raises :class:`ConfigurationError`
    for a path that is none of these, and the journal's :class:`JournalError` (naming the file
    and line) for a damaged line, once everything else is indexed."""
    store = RunStore(path)
    try:
        store.refresh()
    except BaseException:
        store.close()
        raise
    return store


class Filters(TypedDict, total=False):
    """The filters of :meth:`RunStore.trajectories` and :meth:`RunStore.count`; a run passes
    when it passes every one given (``None``: no filter)."""

    step: int | None
    split: str | None
    example_id: str | None
    min_reward: float | None
    max_reward: float | None
    cause: str | None
    """An untrainable cause the run has (:meth:`RunStore.causes`)."""
    text: str | None
    """Every word of it appears in the run's messages (user, assistant and tool contents, tool
    call names and arguments, reasoning; not the system prompt). With FTS5, words as SQLite's
    tokenizer splits them (runs of letters and digits: ``"1+2"`` is ``1`` and ``2``,
    anywhere), case- and accent-insensitive, ``word*`` a prefix; without FTS5, substrings,
    case-insensitive for ASCII."""
    node: str | None
    """Made on the Ray node of that id or address."""
    policy: str | None
    """Holds a turn of this policy (a call the Trainer journaled as that policy's)."""


_FILTERS = tuple(Filters.__annotations__)


class RunStore:
    """A run folder, read through its index. Safe to share between threads (one lock); each
    process has its own, and any number may index and read one folder at once.

    Use :func:`open_run`, which indexes what is there; call :meth:`refresh` to index what
    was appended since (cheap when nothing was)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self.kind: Kind = _scan.detect(self.path)
        self._single = self.path.is_file()
        self.root = self.path.parent if self._single else self.path
        """The folder the journal's paths are relative to."""
        self.problems: list[str] = []
        """Saved files left out at the last refresh, and why (not JSON, not a trajectory)."""
        self._lock = threading.RLock()
        self._parsed: dict[str, tuple[tuple[int, int, float], list[Any]]] = {}
        """Rows of the metrics and validation lines, and the lines' figures they came from."""
        self._paths: dict[str, Path] = {}
        """Each journal file's path, made once (rows of one file share it)."""
        self._index = Index(self.root, self.path.name if self._single else None)

    @property
    def index_path(self) -> Path | None:
        """The index file (in the run folder, or in the user's cache when the folder is not
        writable; ``None`` for a single saved trajectory, indexed in memory)."""
        return self._index.location

    @property
    def text_search(self) -> str:
        """``"fts5"`` (SQLite full-text search) or ``"like"`` (a build without FTS5)."""
        return self._index.mode

    # -- indexing --------------------------------------------------------------------------

    def refresh(self) -> int:
        """Index the lines appended since the last refresh; returns how many new runs."""
        with self._lock:
            if not self.path.exists():
                raise ConfigurationError(f"{self.path} no longer exists")
            if not self._single:
                self.kind = _scan.detect(self.path)  # a Trainer resuming a gateway's journal
            new, self.problems = self._index.refresh(self.kind)
            if self.kind == "saved" and self.problems and not self._count_all():
                raise ConfigurationError(
                    f"{self.path} holds no saved trajectory: " + "; ".join(self.problems[:3])
                )
            return new

    def close(self) -> None:
        with self._lock:
            self._index.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        with self._lock:
            return self._index.db.execute(sql, params).fetchall()

    def _count_all(self) -> int:
        return int(self._query("SELECT count(*) FROM runs")[0][0])

    # -- steps and validations ---------------------------------------------------------------

    def _records[R](self, kind: str, row: Callable[[dict[str, Any]], R]) -> list[R]:
        """``row`` of each line of ``metrics.jsonl`` or ``validation.jsonl``, in order, made
        once per change of the file's indexed lines."""
        ((count, last, size),) = self._query(
            "SELECT count(*), max(line), total(length(record)) FROM lines WHERE file = ?", (kind,)
        )
        cached = self._parsed.get(kind)
        if cached is None or cached[0] != (count, last, size):
            rows = self._query("SELECT record FROM lines WHERE file = ? ORDER BY line", (kind,))
            cached = self._parsed[kind] = ((count, last, size), [row(loads(r)) for (r,) in rows])
        return list(cached[1])

    def steps(self) -> list[StepRow]:
        """One row per line of ``metrics.jsonl``, by step (a step recorded twice: its last)."""
        by_step = {s.step: s for s in self._records("metrics", StepRow.from_metrics)}
        return [by_step[s] for s in sorted(by_step)]

    def validations(self) -> list[ValidationRow]:
        """One row per line of ``validation.jsonl``, in order."""
        return self._records("validation", ValidationRow.from_metrics)

    # -- trajectories ----------------------------------------------------------------------

    def trajectories(
        self,
        *,
        order: str = "step",
        limit: int | None = 100,
        offset: int = 0,
        **filters: Unpack[Filters],
    ) -> list[TrajectoryRow]:
        """The indexed runs that pass every filter given (see :class:`Filters`), in ``order``
        (see :data:`ORDERS`), ``limit`` from ``offset`` (``limit=None``: all)."""
        if order not in ORDERS:
            raise ConfigurationError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        where, params = self._where(_known(filters), listing=True)
        sql = f"SELECT {_COLUMNS} FROM {_FROM}{where} ORDER BY {ORDERS[order]} LIMIT ? OFFSET ?"
        rows = self._query(sql, [*params, -1 if limit is None else limit, offset])
        return [self._row(row) for row in rows]

    def count(self, **filters: Unpack[Filters]) -> int:
        """How many runs pass the filters (see :class:`Filters`)."""
        # One filter alone is counted in its own table (each of its rows is one run's): ~5x
        # faster than testing each run against it.
        cause, words = _known(filters).get("cause"), (filters.get("text") or "").split()
        if all(v is None for k, v in filters.items() if k not in ("cause", "text")):
            if cause is not None and not words:
                return int(
                    self._query("SELECT count(*) FROM causes WHERE cause = ?", (cause,))[0][0]
                )
            query = _fts_query(words) if self._index.mode == "fts5" else ""
            if cause is None and query:
                sql = "SELECT count(*) FROM texts WHERE texts MATCH ?"
                return int(self._query(sql, (query,))[0][0])
        where, params = self._where(filters)
        return int(self._query(f"SELECT count(*) FROM runs{where}", params)[0][0])

    def _where(self, filters: Filters, *, listing: bool = False) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if (node := filters.get("node")) is not None:
            clauses.append("(node_id = ? OR node_address = ?)")
            params += [node, node]
        for clause, key in (
            ("runs.step = ?", "step"),
            ("split = ?", "split"),
            ("example_id = ?", "example_id"),
            ("reward >= ?", "min_reward"),
            ("reward <= ?", "max_reward"),
            (
                f"{'+' if listing else ''}runs.id IN (SELECT run_id FROM causes WHERE cause = ?)",
                "cause",
            ),
            (
                f"{'+' if listing else ''}runs.id IN "
                "(SELECT run_id FROM policies WHERE policy = ?)",
                "policy",
            ),
        ):
            if (value := filters.get(key)) is not None:
                clauses.append(clause)
                params.append(value)
        words = (filters.get("text") or "").split()
        if words and self._index.mode == "fts5":
            query = _fts_query(words)
            # In a listing, "+" keeps SQLite on the order's index, testing each run against the
            # matches, rather than sorting every match: a word in most runs costs no sort.
            plus = "+" if listing else ""
            if query:
                clauses.append(f"{plus}runs.id IN (SELECT rowid FROM texts WHERE texts MATCH ?)")
                params.append(query)
            else:
                clauses.append("0")  # only punctuation: no word to find
        elif words:
            for word in words:
                clauses.append("runs.id IN (SELECT rowid FROM texts WHERE body LIKE ? ESCAPE '\\')")
                params.append("%" + _like_escaped(word) + "%")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def _row(self, row: tuple[Any, ...]) -> TrajectoryRow:
        (
            row_id, step, position, rollout, split, example_id, reward, exception_type,
            exception_message, policy_step, calls, trainable_turns, completion_tokens,
            tokens, causes, sources, started, ended, node_id, node_address, worker_pid, path,
            start, length, set_aside, policies, per_policy, policy_rewards,
        ) = row  # fmt: skip
        own = loads(per_policy) if per_policy else {}
        return TrajectoryRow(
            id=row_id,
            step=step,
            position=position,
            rollout=rollout,
            split=split,
            example_id=example_id,
            reward=reward,
            exception_type=exception_type,
            exception_message=exception_message,
            policy_step=policy_step,
            calls=calls,
            trainable_turns=trainable_turns,
            completion_tokens=completion_tokens,
            trainable_tokens=tokens,
            causes=tuple(causes.split(SEPARATOR)) if causes else (),
            sources=tuple(sources.split(SEPARATOR)) if sources else (),
            started_at=started,
            ended_at=ended,
            node_id=node_id,
            node_address=node_address,
            worker_pid=worker_pid,
            file=self._paths.get(path) or self._paths.setdefault(path, self.root / path),
            offset=start,
            length=length,
            set_aside=bool(set_aside),
            policies=tuple(policies.split(SEPARATOR)) if policies else (),
            policy_turns={p: int(n[0]) for p, n in own.items()},
            policy_tokens={p: int(n[1]) for p, n in own.items()},
            policy_rewards=loads(policy_rewards) if policy_rewards else {},
        )

    def row(self, row_id: int) -> TrajectoryRow:
        """The indexed row ``row_id``; ``KeyError`` if the index has none."""
        rows = self._query(f"SELECT {_COLUMNS} FROM {_FROM} WHERE runs.id = ?", (row_id,))
        if not rows:
            raise KeyError(f"no run {row_id} in the index of {self.path}")
        return self._row(rows[0])

    def trajectory_dict(self, row_id: int) -> dict[str, Any]:
        """Run ``row_id`` as its file holds it (``Trajectory.to_dict``'s form), read from its
        line alone; a run given a group reward has it as its reward, its own as the metric
        ``independent_reward`` (as the Trainer shipped it)."""
        row = self.row(row_id)
        try:
            with open(row.file, "rb") as file:
                file.seek(row.offset)
                data = file.read(row.length)
            record = loads(data)
            trajectory = record if row.step is None else record["trajectory"]
            if not isinstance(trajectory, dict):
                raise TypeError("not an object")
            if row.step is not None and record["slot"] != [row.position, row.rollout]:
                raise ValueError(f"slot {record['slot']} where the index has another")
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise JournalError(
                f"{row.file} changed since it was indexed (run {row_id} at byte {row.offset} "
                f"no longer reads: {error!r}); open the run again to index it anew"
            ) from None
        _scan.resolve(trajectory, _scan.claims(self._declared()))
        own = trajectory.get("reward")
        if row.step is not None and row.reward is not None and own != row.reward:
            metrics = trajectory.setdefault("metrics", {})
            metrics.setdefault("independent_reward", own)
            trajectory["reward"] = row.reward
        return trajectory

    def trajectory(self, row_id: int) -> Trajectory:
        """Run ``row_id`` whole (its calls, tokens and logprobs), read from its line alone."""
        return Trajectory.from_dict(self.trajectory_dict(row_id))

    def journal_steps(self) -> list[int]:
        """The steps with journaled runs, in order (a gateway's journal has no metrics line)."""
        rows = self._query("SELECT DISTINCT step FROM runs WHERE step IS NOT NULL ORDER BY step")
        return [int(step) for (step,) in rows]

    def causes(self) -> dict[str, int]:
        """Each untrainable cause and how many runs have it, most common first."""
        rows = self._query(
            "SELECT cause, count(*) AS n FROM causes GROUP BY cause ORDER BY n DESC, cause"
        )
        return {cause: n for cause, n in rows}

    def policies(self) -> list[str]:
        """The run's policies: those its Trainer declared (``state.json``'s settings, in their
        order), then any other its calls were journaled under (by name); ``[]`` when no call
        names one (a folder written before calls had a policy, or a gateway's)."""
        declared = [p["name"] for p in self._declared() if isinstance(p.get("name"), str)]
        found = self._query("SELECT DISTINCT policy FROM policies ORDER BY policy")
        return declared + [p for (p,) in found if p not in declared]

    def trained_policies(self) -> list[str] | None:
        """The policies whose turns train, when the Trainer declared several (a turn of a
        frozen policy, or one no policy claimed, is context); ``None`` for a run of one
        policy (every policy turn trains)."""
        declared = self._declared()
        if len(declared) < 2:
            return None
        return [p["name"] for p in declared if p.get("frozen") is not True]

    def frozen_policies(self) -> list[str]:
        """The declared policies served but not trained (``Policy(frozen=True)``)."""
        return [p["name"] for p in self._declared() if p.get("frozen") is True]

    def _declared(self) -> list[dict[str, Any]]:
        """``state.json``'s ``settings.policies`` (a Trainer's folder; ``[]`` elsewhere)."""
        if self.kind != "trainer" or self._single:
            return []
        return _scan.declared(self.root)

    # -- groups ----------------------------------------------------------------------------

    def groups(self, step: int, policy: str | None = None) -> list[GroupRow]:
        """The step's groups, one per example position (a run of several policies: one per
        position and trained policy, that policy's rewards and decision), and what became of
        each (see :class:`GroupRow` for the reasons a group did not ship). ``policy``: only
        that policy's groups."""
        rows = self._query(
            "SELECT set_aside, position, rollout, example_id, reward, exception_type, "
            "trainable_tokens, causes, policy_rewards, per_policy FROM runs WHERE step = ? "
            "ORDER BY set_aside, position, rollout",
            (step,),
        )
        if rows and not rows[0][0]:
            rows = [r for r in rows if not r[0]]  # set-aside runs only when the step has no other
        by_position: dict[int, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_position.setdefault(row[1], []).append(row)
        ship = _Shipping(self, step, set_aside=bool(rows and rows[0][0]))
        policies: list[str | None] = list(ship.policies)
        if not policies:  # not shipped yet: the policies the Trainer trains, when several
            declared = self._declared()
            trained = [p["name"] for p in declared if p.get("frozen") is not True]
            policies = list(trained) if len(declared) > 1 else [None]
        if policy is not None:
            policies = [p for p in policies if p == policy]
        return [
            ship.group(step, position, runs, p)
            for position, runs in by_position.items()
            for p in policies
        ]

    # -- the run in one line -----------------------------------------------------------------

    def summary(self) -> RunSummary:
        """What ``arttrace runs`` shows of the run: size, reward first and last, groups
        shipped and dropped, trainable tokens, exceptions, untrainable causes."""
        (runs, tokens, exceptions), *_ = self._query(
            "SELECT count(*), coalesce(sum(trainable_tokens), 0), count(exception_type) FROM runs"
        )
        steps = self.steps()
        first = last = shipped = dropped = None
        if self.kind == "trainer":
            first, last = (steps[0].reward_mean, steps[-1].reward_mean) if steps else (None, None)
            shipped = sum(s.groups_kept for s in steps)
            dropped = sum(s.groups_total - s.groups_kept for s in steps)
            tokens = sum(s.trainable_tokens for s in steps)
            count = len(steps)
        elif self.kind == "gateway":
            means = self._query(
                "SELECT step, avg(reward) FROM runs WHERE NOT set_aside GROUP BY step ORDER BY step"
            )
            count = len(means)
            first, last = (means[0][1], means[-1][1]) if means else (None, None)
        else:
            ((first,),) = self._query("SELECT avg(reward) FROM runs")
            last, count = first, 0
        return RunSummary(
            self.path, self.kind, count, runs, first, last, shipped, dropped, tokens,
            exceptions, self.causes(), tuple(self.policies()),
        )  # fmt: skip


class _Shipping:
    """What the journal says of a step's shipping: the Trainer's decision for each group and
    its trainable tokens (``shipped.json``), or why the step has not shipped."""

    def __init__(self, store: RunStore, step: int, *, set_aside: bool) -> None:
        self.kind, self.set_aside = store.kind, set_aside
        self.folder = folder = store.root / "journal" / f"step-{step:05d}"
        shipped = read_json(folder / "shipped.json") if self.kind == "trainer" else None
        self.shipped = shipped if isinstance(shipped, dict) else None
        shipping = read_json(folder / "shipping.json") if self.kind == "trainer" else None
        self.shipping = shipping if isinstance(shipping, dict) else None
        summary = self.shipped or {}
        tokens = summary.get("trainable_tokens")
        self.tokens: dict[str, Any] = tokens if isinstance(tokens, dict) else {}
        decisions = summary.get("decisions")
        self.decisions: list[Any] = decisions if isinstance(decisions, list) else []
        self.by_policy: dict[str, list[Any]] = {}
        """The decisions of a run of several policies (one per example and policy), by policy,
        each policy's in position order; empty when they name no policy (an older folder)."""
        for decision in self.decisions:
            if isinstance(decision, dict) and isinstance(decision.get("policy"), str):
                self.by_policy.setdefault(decision["policy"], []).append(decision)
        self.policies = tuple(self.by_policy)

    def _decided(self, position: int, example_id: str, policy: str | None) -> Any:
        """The Trainer's decision for the group, ``None`` if none is recorded."""
        if not self.by_policy:
            decided = self.decisions[position] if position < len(self.decisions) else None
            return decided if isinstance(decided, dict) else None
        listed = self.by_policy.get(policy or "", [])
        decided = listed[position] if position < len(listed) else None
        if isinstance(decided, dict) and decided.get("position", position) == position:
            return decided
        return next(  # a policy without a decision for every position: by its place
            (
                d
                for d in listed
                if d.get("position") == position
                or ("position" not in d and d.get("example_id") == example_id)
            ),
            None,
        )

    def _tokens(self, example_id: str, policy: str | None) -> int | None:
        """The Trainer's count of the group's trainable tokens, if it recorded one (a run of
        several policies: under ``<policy>/<example id>``)."""
        if policy is not None and self.by_policy:
            tokens = self.tokens.get(f"{policy}/{example_id}")
        else:
            tokens = self.tokens.get(example_id)
        return tokens if isinstance(tokens, int) else None

    def group(
        self, step: int, position: int, runs: list[tuple[Any, ...]], policy: str | None = None
    ) -> GroupRow:
        """The group's figures, and what became of it: the Trainer's decision, or (a step not
        decided yet, a gateway's) the reason its own runs tell. ``policy``: the group of that
        policy, its rewards (``Trajectory.policy_rewards``, else the run's) and tokens."""
        if policy is not None:
            runs = [_for_policy(r, policy) for r in runs]
        ok = [r[5] is None and r[4] is not None for r in runs]  # the runs the Trainer groups
        scored = [r[4] for r, grouped in zip(runs, ok, strict=True) if grouped]
        spread = max(scored) - min(scored) if len(scored) > 1 else 0.0
        example_id = str(runs[0][3])
        tokens = self._tokens(example_id, policy)
        if tokens is None:
            tokens = sum(r[6] for r, grouped in zip(runs, ok, strict=True) if grouped)
        decided = self._decided(position, example_id, policy)
        if isinstance(decided, dict) and decided.get("example_id") == example_id:
            why, recorded = decided.get("why_not"), list(decided.get("advantages") or ())
            by_run = [recorded[r[2]] if r[2] < len(recorded) else None for r in runs]
        else:
            decided, found = None, iter(advantages(scored))
            by_run = [next(found) if grouped else None for grouped in ok]
            why = "failed" if len(scored) < min(2, len(runs)) else "flat" if spread == 0 else None
            why = why or ("no_trainable_token" if tokens == 0 else None)
        return GroupRow(
            step=step,
            position=position,
            example_id=example_id,
            runs=len(runs),
            rewards=tuple(r[4] for r in runs),
            reward_mean=math.fsum(scored) / len(scored) if scored else None,
            spread=spread,
            advantages=tuple(by_run),
            trainable_tokens=tokens,
            exceptions=sum(r[5] is not None for r in runs),
            shipped=decided is not None and why is None,
            why_not=self._why_not(why, decided is not None, runs, spread, policy),
            policy=policy,
        )

    def _why_not(
        self,
        why: Any,
        decided: bool,
        runs: list[tuple[Any, ...]],
        spread: float,
        policy: str | None = None,
    ) -> str | None:
        """``why`` (a :data:`~arttrace._journal.WhyNot`, ``None`` if none) in words."""
        if why == "failed":
            raised = sum(r[5] is not None for r in runs)
            unscored = sum(r[5] is None and r[4] is None for r in runs)
            return (
                f"failed runs: {raised} of {len(runs)} raised"
                + (f", {unscored} have no reward" if unscored else "")
                + "; fewer than two runs were scored, so the group has no spread"
            )
        if why == "no_trainable_token":
            return "no trainable token: " + _most_common([c for r in runs for c in _split(r[7])])
        if why is not None:
            return _WHY_NOT.get(why, str(why)).format(spread=spread)
        return None if decided else self._unshipped(policy)

    def _unshipped(self, policy: str | None = None) -> str:
        if self.shipped is not None:
            return (
                "not recorded: the step shipped, but its run folder was written before arttrace "
                "recorded what it decided for each group"
            )
        if self.kind == "gateway":
            return (
                "the step did not ship (a gateway's journal: a Trainer resuming from this "
                "folder trains it)"
            )
        if self.set_aside:
            return (
                "the step did not ship (no group with learning signal held a trainable token; "
                "its runs were set aside in rollouts-nothing-to-train.jsonl)"
            )
        if policy is not None and self.kind == "trainer" and not self.set_aside:
            own = read_json(self.folder / f"shipping-{policy}.json")
            if (self.folder / f"trained-{policy}.json").exists():
                return (
                    f"the step did not ship yet ({policy} trained; the step's other policies "
                    "have not finished training)"
                )
            if isinstance(own, dict) and own.get("failed"):
                return f"the step did not ship ({policy}: backend.train failed: {own['failed']})"
            if isinstance(own, dict):
                return f"the step did not ship ({policy}: backend.train began and has not finished)"
        if self.shipping is not None and self.shipping.get("failed"):
            return f"the step did not ship (backend.train failed: {self.shipping['failed']})"
        if self.shipping is not None:
            return "the step did not ship (backend.train began and has not finished)"
        return (
            "the step did not ship (not trained yet: its rollouts are running, or the run stopped)"
        )


def _for_policy(row: tuple[Any, ...], policy: str) -> tuple[Any, ...]:
    """A group query's row as ``policy``'s: its reward for that policy, and its trainable
    tokens of that policy's turns."""
    rewards = loads(row[8]) if row[8] else {}
    tokens = loads(row[9]) if row[9] else {}
    reward = rewards.get(policy, row[4])
    own = tokens.get(policy, (0, 0))[1]
    return (*row[:4], reward, row[5], own, *row[7:])


def _split(causes: str) -> list[str]:
    return causes.split(SEPARATOR) if causes else []


def _most_common(causes: list[str]) -> str:
    if not causes:
        return "no cause recorded"
    (cause, count), total = Counter(causes).most_common(1)[0], len(causes)
    return cause if count == total else f"{cause} ({count} of {total} causes)"


def _known(filters: Filters) -> Filters:
    """``filters``, a :class:`TypeError` naming one that is not a filter."""
    if unknown := sorted(filters.keys() - Filters.__optional_keys__):
        raise TypeError(f"unexpected filter {unknown[0]!r} (filters: {', '.join(_FILTERS)})")
    return filters


def _fts_query(words: list[str]) -> str:
    """The FTS5 query for ``words``: each token of each word (what SQLite's unicode61
    tokenizer splits them into: letters and digits), all required; ``word*`` is a prefix."""
    terms: list[str] = []
    for word in words:
        tokens = _TOKEN.findall(word)
        terms.extend(f'"{t}"' for t in tokens)
        if tokens and word.endswith("*"):
            terms[-1] += "*"
    return " ".join(terms)


def _like_escaped(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
