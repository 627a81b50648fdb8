"""A Parquet table, one row per run, for analysis (pandas, polars, DuckDB, Hugging Face
``datasets.Dataset.from_parquet``).

Plain columns: ``run_dir``, ``step``, ``position``, ``rollout``, ``split``, ``set_aside`` (in
the Trainer's ``rollouts-nothing-to-train.jsonl``), ``example_id``,
``reward``, ``policy_step``, ``exception_type`` / ``_message`` / ``_traceback`` (redacted),
``started_at`` / ``ended_at`` (Unix seconds), ``calls``, ``trainable_turns``,
``trainable_tokens``, and as JSON text: ``messages`` and ``tools`` (the main history, as ART's
``Trajectory.messages()`` renders ``to_art()``'s), ``additional_histories`` (a list of
``{"messages", "tools"}``), ``metadata``, ``metrics``.

Tokens, as ART's tokenizer assembles them from the run's trainable turns (its
``assemble_vllm_training_sequences``): ``token_ids`` (int64), ``logprobs`` (float64, the
sampled token's logprob, NaN for context) and ``mask`` (True on the sampled tokens of trainable
turns, the tokens ART trains on; False on context), end to end over the run's sequences, which
``sequence_lengths`` cut apart (a new one starts where a turn's prompt does not extend the
sequence so far). ``turns``: every assistant turn, in order: ``history`` (0 the main one),
``model``, ``source`` (the layer that recorded it), ``framework``, ``agent``, ``finish_reason``,
``trainable``, ``untrainable_reason``, ``prompt_tokens`` and ``sampled_tokens`` (as recorded),
``offset`` (a trainable turn's: where its sampled tokens start in ``token_ids``; its prompt is
what comes before, back to its sequence's start), ``started_at``, ``ended_at``, ``policy``
(the policy the call was journaled under).

Per policy (``policy="planner"``, ``--policy planner``), for a system of several: each run as
``to_art(policy=...)`` gives that policy's trajectory (only its turns are trainable, and in the
mask; the others are context), ``reward`` its reward (``policy_rewards``, else the run's), and
``policy`` its name (``None`` in an export of every policy); a run without a turn of the
policy is left out.

Written with a streaming ``ParquetWriter`` (zstd), ``row_group_size`` runs at a time: memory
holds one row group, never the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError
from ..capture._conversations import Turn
from ..capture._records import policy_claims
from ..capture._redact import redact
from ..capture._trajectory import Trajectory
from . import _history
from ._source import NOT_THE_POLICY, Run, Selection, Split, selected
from ._summary import ExportSummary, check_out, private_file


def _schema() -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    turn = pa.struct(
        [
            ("history", pa.int64()),
            ("model", pa.string()),
            ("source", pa.string()),
            ("framework", pa.string()),
            ("agent", pa.string()),
            ("finish_reason", pa.string()),
            ("trainable", pa.bool_()),
            ("untrainable_reason", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("sampled_tokens", pa.int64()),
            ("offset", pa.int64()),
            ("started_at", pa.float64()),
            ("ended_at", pa.float64()),
            ("policy", pa.string()),
        ]
    )
    return pa.schema(
        [
            ("run_dir", pa.string()),
            ("step", pa.int64()),
            ("position", pa.int64()),
            ("rollout", pa.int64()),
            ("split", pa.string()),
            ("set_aside", pa.bool_()),
            ("example_id", pa.string()),
            ("reward", pa.float64()),
            ("policy_step", pa.int64()),
            ("exception_type", pa.string()),
            ("exception_message", pa.string()),
            ("exception_traceback", pa.string()),
            ("started_at", pa.float64()),
            ("ended_at", pa.float64()),
            ("calls", pa.int64()),
            ("trainable_turns", pa.int64()),
            ("trainable_tokens", pa.int64()),
            ("token_ids", pa.list_(pa.int64())),
            ("logprobs", pa.list_(pa.float64())),
            ("mask", pa.list_(pa.bool_())),
            ("sequence_lengths", pa.list_(pa.int64())),
            ("turns", pa.list_(turn)),
            ("messages", pa.string()),
            ("tools", pa.string()),
            ("additional_histories", pa.string()),
            ("metadata", pa.string()),
            ("metrics", pa.string()),
            ("policy", pa.string()),
        ]
    )


class _RowGroup:
    """Columns of the rows to come; the token columns as flat buffers and offsets (numpy
    arrays made from them, never a Python object per token)."""

    def __init__(self, schema: Any, policy: str | None = None) -> None:
        self.schema, self.policy = schema, policy
        self.plain: dict[str, list[Any]] = {
            f.name: [] for f in schema if f.name not in ("token_ids", "logprobs", "mask")
        }
        self.ids: list[Any] = []
        self.logprobs: list[Any] = []
        self.masks: list[bytes] = []
        self.rows = 0

    def add(self, run: Run, trajectory: Trajectory | None = None) -> None:
        trajectory = trajectory or run.load()
        conversations = _history.histories(trajectory, self.policy)
        tokens = _history.sequences(conversations)
        exception = trajectory.exception or {}
        main, others = (conversations[0], conversations[1:]) if conversations else (None, [])
        row: dict[str, Any] = {
            "run_dir": str(run.run_dir),
            "step": run.row.step,
            "position": run.row.position,
            "rollout": run.row.rollout,
            "split": run.row.split,
            "set_aside": run.row.set_aside,
            "example_id": run.row.example_id,
            "reward": trajectory.reward
            if self.policy is None
            else trajectory.reward_for(self.policy),
            "policy_step": run.row.policy_step,
            "exception_type": exception.get("type"),
            "exception_message": _text(exception.get("message")),
            "exception_traceback": _text(exception.get("traceback")),
            "started_at": trajectory.started_at,
            "ended_at": trajectory.ended_at,
            "calls": len(trajectory.call_log.records),
            "trainable_turns": len(tokens.offsets),
            "trainable_tokens": sum(tokens.mask),
            "sequence_lengths": tokens.sequence_lengths,
            "turns": _turns(conversations, tokens.offsets, _others(trajectory, self.policy)),
            "messages": _json([] if main is None else _history.messages(main)),
            "tools": None if main is None or main.tools is None else _json(main.tools),
            "additional_histories": _json(
                [{"messages": _history.messages(c), "tools": c.tools} for c in others]
            ),
            "metadata": _json(trajectory.metadata),
            "metrics": _json(trajectory.metrics),
            "policy": self.policy,
        }
        for name, column in self.plain.items():
            column.append(row[name])
        self.ids.append(tokens.token_ids)
        self.logprobs.append(tokens.logprobs)
        self.masks.append(bytes(tokens.mask))
        self.rows += 1

    def table(self) -> Any:
        import numpy as np
        import pyarrow as pa

        lengths: Any = np.fromiter((len(m) for m in self.masks), dtype=np.int64, count=self.rows)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=pa.int32())
        ids: Any = np.frombuffer(b"".join(a.tobytes() for a in self.ids), dtype=np.int64)
        logprobs: Any = np.frombuffer(
            b"".join(a.tobytes() for a in self.logprobs), dtype=np.float64
        )
        mask: Any = np.frombuffer(b"".join(self.masks), dtype=np.uint8).astype(bool)
        columns = {
            name: pa.array(values, type=self.schema.field(name).type)
            for name, values in self.plain.items()
        }
        columns["token_ids"] = pa.ListArray.from_arrays(offsets, pa.array(ids))
        columns["logprobs"] = pa.ListArray.from_arrays(offsets, pa.array(logprobs))
        columns["mask"] = pa.ListArray.from_arrays(offsets, pa.array(mask))
        return pa.Table.from_pydict({f.name: columns[f.name] for f in self.schema}, self.schema)


def _others(trajectory: Trajectory, policy: str | None) -> set[int]:
    """The calls (by ``seq``) that are policy turns of another policy than ``policy``."""
    if policy is None:
        return set()
    return {c.seq for c in trajectory.calls if c.trainable and not policy_claims(policy, c)}


def _turns(conversations: list[Any], offsets: list[int], others: set[int]) -> list[dict[str, Any]]:
    out, trainable = [], iter(offsets)
    for history, conversation in enumerate(conversations):
        for item in conversation.items:
            if not isinstance(item, Turn):
                continue
            call, choice = item.call, item.choice
            sampled = choice.token_ids if choice.token_ids is not None else choice.logprobs
            out.append(
                {
                    "history": history,
                    "model": call.model,
                    "source": call.source,
                    "framework": call.framework,
                    "agent": call.agent,
                    "finish_reason": choice.finish_reason,
                    "trainable": item.trainable,
                    "untrainable_reason": _reason(item, others),
                    "prompt_tokens": None
                    if call.prompt_token_ids is None
                    else len(call.prompt_token_ids),
                    "sampled_tokens": None if sampled is None else len(sampled),
                    "offset": next(trainable) if item.trainable else None,
                    "started_at": call.started_at,
                    "ended_at": call.ended_at,
                    "policy": call.policy,
                }
            )
    return out


def _reason(turn: Turn, others: set[int]) -> str | None:
    """Why a turn is not trained on: another policy's, not a policy turn, a branch's shared
    prefix, or the record's own reason."""
    if turn.trainable:
        return None
    if turn.call.seq in others:
        return "another policy's turn (context in this policy's trajectory)"
    if not turn.call.trainable:
        return "not a policy turn (made outside every @trainable function)"
    if turn.context_only:
        return "context of another sampled choice (n > 1)"
    return turn.call.untrainable_reason(turn.choice)


def _has_turn_of(trajectory: Trajectory, policy: str) -> bool:
    """Whether a policy turn of the run belongs to ``policy`` (as ``to_art`` claims them)."""
    return any(c.trainable and policy_claims(policy, c) for c in trajectory.calls)


def _text(value: Any) -> str | None:
    return None if value is None else redact(str(value))


def _json(value: Any) -> str:
    return _history.redacted_json(value)


def export_parquet(
    paths: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    best_per_group: bool = False,
    min_reward: float | None = None,
    split: Split = "all",
    row_group_size: int = 1000,
    policy: str | None = None,
) -> ExportSummary:
    """Write one row per run under ``paths`` to the Parquet file ``out`` (every run by
    default, failed ones included; the selection as :func:`export_sft`'s). ``policy``: the
    rows of one policy of several (see the module's docstring)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    started = time.perf_counter()
    out = Path(out)
    if (problem := check_out(out)) is not None:
        raise ConfigurationError(problem)
    if row_group_size < 1:
        raise ConfigurationError(f"row_group_size must be at least 1, got {row_group_size}")
    selection = Selection(split, min_reward, best_per_group, policy=policy)
    summary = ExportSummary("parquet", str(out))
    schema = _schema()
    with private_file(out) as file, pq.ParquetWriter(file, schema, compression="zstd") as writer:
        group = _RowGroup(schema, policy)
        for run in selected(paths, selection, summary.skipped):
            trajectory = run.load()
            if policy is not None and not _has_turn_of(trajectory, policy):
                summary.skipped[NOT_THE_POLICY] += 1
                continue
            group.add(run, trajectory)
            if group.rows == row_group_size:
                writer.write_table(group.table(), row_group_size=row_group_size)
                summary.rows += group.rows
                group = _RowGroup(schema, policy)
        if group.rows or not summary.rows:  # an empty export is still a table with columns
            writer.write_table(group.table(), row_group_size=row_group_size)
            summary.rows += group.rows
    summary.runs = summary.rows
    summary.bytes = out.stat().st_size
    summary.seconds = time.perf_counter() - started
    return summary
