"""The README's main job: `arttrace demo` captures a plain OpenAI agent and writes its runs."""

from __future__ import annotations

import json

import art
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace.cli import main


def test_demo_writes_trainable_trajectories_and_groups(tmp_path, capsys):
    try:
        assert main(["demo", "--out", str(tmp_path), "--examples", "3", "--rollouts", "4"]) == 0
    finally:
        at.uninstrument()
    printed = capsys.readouterr().out
    assert "runs                12" in printed
    saved = sorted((tmp_path / "trajectories").glob("*.json"))
    assert len(saved) == 12
    runs = [at.Trajectory.load(p) for p in saved]
    assert all(t.reward in (0.0, 1.0) and len(t.calls) == 2 for t in runs)
    converted = runs[0].to_art()
    assert [
        type(i).__name__ if isinstance(i, Choice) else i["role"]
        for i in converted.messages_and_choices
    ] == ["system", "user", "Choice", "tool", "Choice"]
    lines = (tmp_path / "art_groups.jsonl").read_text().splitlines()
    groups = [art.TrajectoryGroup.model_validate(json.loads(line)) for line in lines]
    assert len(groups) == 3 and all(len(g.trajectories) == 4 for g in groups)
    assert {t.metadata["example_id"] for g in groups for t in g.trajectories} == {
        "q-0",
        "q-1",
        "q-2",
    }
    assert all(len({t.metadata["example_id"] for t in g.trajectories}) == 1 for g in groups)
