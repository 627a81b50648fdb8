"""Exports per policy (``--policy NAME``): a planner and an executor sharing one conversation,
trained by the real Trainer; each policy's SFT lines and Parquet rows hold exactly its own
turns as what is learned, the other's as context, read back by ART, ``datasets`` and pyarrow
and held equal to ``to_art(policy=...)``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import arttrace as at
from arttrace.app._args import HelpFormatter
from arttrace.app.export_command import add_export_command
from arttrace.exports import export_parquet, export_sft
from arttrace.store import open_run
from support.policies import EXECUTE, SYSTEM, two_roles


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield two_roles(tmp_path_factory.mktemp("roles") / "run")


def journaled(folder: Path) -> list[at.Trajectory]:
    """The folder's runs in the order the exports read them (step, position, rollout)."""
    with open_run(folder) as store:
        return [store.trajectory(r.id) for r in store.trajectories(limit=None)]


def command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="arttrace", formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command")
    add_export_command(commands)
    args = parser.parse_args(["export", *argv])
    return int(args.run(args, commands.choices["export"]))


def art_sequences(t: at.Trajectory, policy: str) -> Any:
    """ART's own token sequences for the policy's trajectory of the run."""
    from art.preprocessing.tokenize import assemble_vllm_training_sequences
    from art.trajectories import LegacyHistory

    a = t.to_art(policy=policy)
    return assemble_vllm_training_sequences(
        tokenizer=None,  # type: ignore[arg-type]  # only decoding tokens for display uses it
        histories=[
            LegacyHistory(messages_and_choices=a.messages_and_choices, tools=a.tools),
            *a.additional_histories,
        ],
        advantage=0.0,
        allow_training_without_logprobs=False,
        trajectory=a,
    )


def test_sft_per_policy_learns_only_its_turns(roles: Path, tmp_path: Path) -> None:
    from art.preprocessing.tokenize import tokenize_sft_batch
    from art.utils.model_config import get_instruction_response_parts
    from art.utils.sft import iterate_file
    from datasets import load_dataset

    from support.qwen import qwen_tokenizer

    runs = journaled(roles)
    assert len(runs) == 16
    lines: dict[str, list[dict[str, Any]]] = {}
    for policy in ("planner", "executor"):
        out = tmp_path / f"{policy}.jsonl"
        summary = export_sft([roles], out, policy=policy)
        assert (summary.runs, summary.rows) == (16, 16) and not summary.skipped
        lines[policy] = [json.loads(line) for line in out.read_text().splitlines()]
        read = list(iterate_file(str(out), shuffle_buffer_size=1))  # ART's reader
        assert [r.messages_and_choices for r in read] == [x["messages"] for x in lines[policy]]
        tokenizer = qwen_tokenizer()
        instruction, response = get_instruction_response_parts(
            "Qwen/Qwen2.5-0.5B-Instruct", tokenizer
        )
        batch = tokenize_sft_batch(read, 1e-5, tokenizer, instruction, response)
        assert batch.num_trajectories == 16 and batch.num_dropped_trajectories == 0
        dataset = load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path))
        assert len(dataset) == 16
    for t, planner, executor in zip(runs, lines["planner"], lines["executor"], strict=True):
        plan, done = (c.choices[0].message["content"] for c in t.calls)
        task = t.calls[0].messages[-1]["content"]
        # the planner's line ends with its own turn; the executor's has the plan as context
        assert planner["messages"] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task},
            {"role": "assistant", "content": plan},
        ]
        assert executor["messages"] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task},
            {"role": "assistant", "content": plan, "weight": 0},
            {"role": "user", "content": EXECUTE},
            {"role": "assistant", "content": done},
        ]
    # without --policy: every policy turn is learned, as before
    every = tmp_path / "every.jsonl"
    export_sft([roles], every)
    first = json.loads(every.read_text().splitlines()[0])
    assert [m.get("weight") for m in first["messages"]] == [None] * 5


def test_parquet_per_policy_masks_only_its_turns(roles: Path, tmp_path: Path) -> None:
    runs = journaled(roles)
    whole = tmp_path / "every.parquet"
    export_parquet([roles], whole)
    for row in pq.read_table(whole).to_pylist():
        assert row["policy"] is None
        assert [t["policy"] for t in row["turns"]] == ["planner", "executor"]
        assert [t["trainable"] for t in row["turns"]] == [True, True]
    for policy in ("planner", "executor"):
        out = tmp_path / f"{policy}.parquet"
        summary = export_parquet([roles], out, policy=policy)
        assert summary.rows == 16 and not summary.skipped
        rows = pq.read_table(out).to_pylist()
        for row, t in zip(rows, runs, strict=True):
            assert row["policy"] == policy and row["reward"] == t.reward
            sequences = art_sequences(t, policy)
            assert row["token_ids"] == [i for s in sequences for i in s.token_ids]
            assert row["mask"] == [bool(m) for s in sequences for m in s.assistant_mask]
            expected = np.array([x for s in sequences for x in s.logprobs])
            assert np.array_equal(np.array(row["logprobs"]), expected, equal_nan=True)
            turns = row["turns"]
            assert [x["trainable"] for x in turns] == [x["policy"] == policy for x in turns]
            assert [x["untrainable_reason"] for x in turns if not x["trainable"]] == [
                "another policy's turn (context in this policy's trajectory)"
            ]
            own = next(c for c in t.calls if c.policy == policy)
            assert row["trainable_tokens"] == sum(row["mask"]) == len(own.choices[0].token_ids)
    assert command(str(roles), "--format", "parquet", "--out", str(out), "--policy", "nobody") == 0
    assert pq.read_table(out).num_rows == 0


def test_the_command_takes_policy_for_sft_and_parquet(
    roles: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "planner.jsonl"
    assert command(str(roles), "--format", "sft", "--out", str(out), "--policy", "planner") == 0
    assert capsys.readouterr().out.startswith("arttrace export: wrote 16 conversations from 16")
    assert command(str(roles), "--format", "sft", "--out", str(out), "--policy", "nobody") == 0
    assert "skipped 16 had no turn of the policy" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        command(str(roles), "--format", "otlp", "--policy", "planner", "--endpoint", "http://x")
    assert exited.value.code == 2
    assert "--policy is for --format sft and parquet" in capsys.readouterr().err


def test_each_policy_s_own_rewards_choose_its_runs(tmp_path: Path) -> None:
    """Two policies of one Trainer, each with its own reward: the best run of a group is each
    policy's own (the planner's rollout 1, the executor's rollout 3)."""
    folder = two_roles(tmp_path / "run", several=True, steps=1)
    best = {}
    for policy in ("planner", "executor"):
        out = tmp_path / f"{policy}.parquet"
        summary = export_parquet([folder], out, policy=policy, best_per_group=True)
        rows = pq.read_table(out).to_pylist()
        assert summary.rows == 2 and summary.skipped == {"not the best run of their group": 6}
        assert all(r["reward"] == 1.0 and r["policy"] == policy for r in rows)
        best[policy] = [r["rollout"] for r in rows]
        sft = tmp_path / f"{policy}.jsonl"
        reached = export_sft([folder], sft, policy=policy, min_reward=1.0).runs
        assert reached == {"planner": 4, "executor": 2}[policy]
    assert best == {"planner": [1, 1], "executor": [3, 3]}
