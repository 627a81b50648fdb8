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

Per policy (``policy="planner"``, ``--policy planner``), for a system of several: the lines of
the conversations holding a turn of that policy, up to its last turn; every other assistant
message in them (another policy's turn, context) carries ``"weight": 0``, the OpenAI
fine-tuning format's mark for a message not learned. ART's and TRL's readers read the key
and train on every assistant message still; where roles share a conversation, train those
with ``assistant_turns="last"`` on lines cut at each turn, or keep to OpenAI's format.
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
from ._source import NO_POLICY_TURN, NOT_THE_POLICY, Selection, Split, selected
from ._summary import ExportSummary, check_out, private_file


def sft_lines(trajectory: Trajectory, policy: str | None = None) -> list[dict[str, Any]]:
    """The run's SFT lines: one per conversation with a policy turn, the main one first (not
    redacted: the export redacts the text it writes). ``policy``: that policy's lines, as
    ``to_art(policy=...)`` sees the run: one per conversation with a turn of the policy, every
    other assistant message in it marked ``"weight": 0``."""
    lines = []
    for conversation in _history.histories(trajectory, policy):
        end = _history.last_policy_turn(conversation)
        if end is None:
            continue
        messages = _history.messages(conversation, end + 1, weighted=policy is not None)
        line: dict[str, Any] = {"messages": messages}
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
    policy: str | None = None,
) -> ExportSummary:
    """Write the SFT data of the runs under ``paths`` to ``out`` (``.jsonl``): every run that
    did not raise, or the best run of each group (``best_per_group``), or those whose reward
    reaches ``min_reward`` (both: the best, if it reaches it); the training split by default.

    ``policy``: the data of one policy of several (a name, as ``@trainable(policy=...)`` or
    the Trainer journaled it, or the model its calls were sent to): only its turns are
    learned (the other assistant messages of its conversations carry ``"weight": 0``), and
    its rewards (``Trajectory.policy_rewards``) choose the runs."""
    started = time.perf_counter()
    out = Path(out)
    if (problem := check_out(out, ".jsonl")) is not None:
        raise ConfigurationError(problem)
    selection = Selection(split, min_reward, best_per_group, skip_raised=True, policy=policy)
    summary = ExportSummary("sft", str(out))
    skipped: Counter[str] = summary.skipped
    with private_file(out) as file:
        for run in selected(paths, selection, skipped):
            lines = sft_lines(run.load(), policy)
            if not lines:
                skipped[NO_POLICY_TURN if policy is None else NOT_THE_POLICY] += 1
                continue
            summary.runs += 1
            summary.rows += len(lines)
            file.write("".join(_history.redacted_json(line) + "\n" for line in lines).encode())
    summary.bytes = out.stat().st_size
    summary.seconds = time.perf_counter() - started
    return summary
