"""SFT data: JSONL in the OpenAI fine-tuning chat format with tools.

One line per conversation of the policy: a run's main history, and each additional history (a
sub-agent, a context reset) as a line of its own, when it has a policy turn (a call made inside
``@trainable``, or through a gateway run, whose reply arrived whole); a conversation without one
(a judge's, a summariser's) is not the policy's to learn. Token ids and logprobs are not needed
(SFT learns the text): runs against an API that returns none, a larger model's for
distillation, export too. Each line is ``{"messages": [...], "tools": [...]}`` (``tools`` only
when the conversation had them), its messages those of ``to_art()``, rendered as ART's
``Trajectory.messages()`` renders them, up to and including its last policy turn (what follows
has nothing for the policy to learn): assistant ``tool_calls`` with ``function.arguments`` as
JSON strings, tool messages with their ``tool_call_id``.

It is what ``art.utils.sft.iterate_file`` / ``train_sft_from_file`` read (``messages`` and
``tools``, the file's name ending in ``.jsonl``), and TRL's SFTTrainer's conversational format
(``datasets.load_dataset("json", data_files=...)``). SFT trains on every assistant message of a
line (ART's ``assistant_turns="all"``), including a context turn inside the conversation; a
branch of ``n > 1`` sampling repeats its shared prefix.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError
from ..capture._trajectory import Trajectory
from . import _history
from ._source import NO_POLICY_TURN, Selection, Split, selected
from ._summary import ExportSummary, check_out, private_file


def sft_lines(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The run's SFT lines: one per conversation with a policy turn, the main one first (not
    redacted: the export redacts the text it writes)."""
    lines = []
    for conversation in _history.histories(trajectory):
        end = _history.last_policy_turn(conversation)
        if end is None:
            continue
        line: dict[str, Any] = {"messages": _history.messages(conversation, end + 1)}
        if conversation.tools is not None:
            line["tools"] = conversation.tools
        lines.append(line)
    return lines


def export_sft(
    paths: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    best_per_group: bool = False,
    min_reward: float | None = None,
    split: Split = "train",
) -> ExportSummary:
    """Write the SFT data of the runs under ``paths`` to ``out`` (``.jsonl``): every run that
    did not raise, or the best run of each group (``best_per_group``), or those whose reward
    reaches ``min_reward`` (both: the best, if it reaches it); the training split by default."""
    started = time.perf_counter()
    out = Path(out)
    if (problem := check_out(out, ".jsonl")) is not None:
        raise ConfigurationError(problem)
    selection = Selection(split, min_reward, best_per_group, skip_raised=True)
    summary = ExportSummary("sft", str(out))
    skipped: Counter[str] = summary.skipped
    with private_file(out) as file:
        for run in selected(paths, selection, skipped):
            lines = sft_lines(run.load())
            if not lines:
                skipped[NO_POLICY_TURN] += 1
                continue
            summary.runs += 1
            summary.rows += len(lines)
            file.write("".join(_history.redacted_json(line) + "\n" for line in lines).encode())
    summary.bytes = out.stat().st_size
    summary.seconds = time.perf_counter() - started
    return summary
