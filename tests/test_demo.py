"""The README's main job: `arttrace demo` trains a plain OpenAI agent for a few GRPO steps on
the dry-run backend, offline."""

from __future__ import annotations

import json

import art
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.app.cli import main
from arttrace.training._journal import Journal


def run(*args: str) -> int:
    try:
        return main(["demo", *args])
    finally:
        at.uninstrument()


def test_demo_trains_on_captured_groups(tmp_path, capsys):
    out = tmp_path / "demo"
    assert run("--out", str(out), "--examples", "3", "--rollouts", "4", "--steps", "2") == 0
    printed = capsys.readouterr().out
    assert "runs                      24" in printed

    journal = Journal(out)
    runs = [t for step in (0, 1) for t in journal.finished(step).values()]
    assert len(runs) == 24
    assert all(t.reward in (0.0, 1.0) and len(t.calls) == 2 for t in runs)
    assert [
        type(i).__name__ if isinstance(i, Choice) else i["role"]
        for i in runs[0].to_art().messages_and_choices
    ] == ["system", "user", "Choice", "tool", "Choice"]

    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert (out / "reward_plot.png").stat().st_size > 0
    shipped = sorted((out / "dry_run" / "demo-policy").glob("step-*/groups.jsonl"))
    groups = [
        art.TrajectoryGroup.model_validate(json.loads(line))
        for path in shipped
        for line in path.read_text().splitlines()
    ]
    assert len(groups) == sum(m["groups_kept"] for m in metrics) > 0
    for group in groups:  # one example per group, and the rewards differ: it teaches something
        assert len({t.metadata["example_id"] for t in group.trajectories}) == 1
        assert len({t.reward for t in group.trajectories}) > 1


def test_demo_runs_again_in_its_folder_but_refuses_a_foreign_one(tmp_path, capsys):
    out = tmp_path / "demo"
    assert run("--out", str(out), "--examples", "1", "--rollouts", "2", "--steps", "1") == 0
    assert run("--out", str(out), "--examples", "1", "--rollouts", "2", "--steps", "1") == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        run("--out", str(tmp_path / "mine"))
    assert "choose another --out" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
