"""The README's main job: `arttrace demo` trains a plain OpenAI agent with GRPO, offline. The
CPU backend's run (the default) is tested in test_cpu_backend.py; here the scripted dry run,
the flags that point the loop at your own server, and the errors."""

from __future__ import annotations

import json
import random

import art
import pytest
from openai.types.chat.chat_completion import Choice

import arttrace as at
from arttrace._journal import Journal
from arttrace.app.cli import build_parser, main
from arttrace.testing import ScriptedLLM, serve


def run(*args: str) -> int:
    try:
        return main(["demo", *args])
    finally:
        at.uninstrument()


def test_demo_trains_on_captured_groups(tmp_path, capsys):
    out = tmp_path / "demo"
    assert (
        run(
            "--backend",
            "dry-run",
            "--out",
            str(out),
            "--examples",
            "3",
            "--rollouts",
            "4",
            "--steps",
            "2",
        )
        == 0
    )
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
    small = ("--backend", "dry-run", "--examples", "1", "--rollouts", "2", "--steps", "1")
    assert run("--out", str(out), *small) == 0
    assert run("--out", str(out), *small) == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        run("--out", str(tmp_path / "mine"), "--backend", "dry-run")
    assert "choose another --out" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_the_cpu_backend_is_the_default():
    assert build_parser().parse_args(["demo"]).backend is None  # None: cpu, or your server


def test_base_url_and_model_point_the_loop_at_your_server(tmp_path, capsys):
    """The greeter's loop runs against the given server and model; its groups are written as
    ART would train on them (arttrace cannot update that server's weights)."""
    rng = random.Random(0)
    llm = ScriptedLLM(lambda request: rng.choice(["Welcome!", "Hello."]))
    out = tmp_path / "demo"
    with serve(llm) as server:
        code = run(
            "--base-url", server.base_url, "--model", "my-policy", "--out", str(out),
            "--examples", "2", "--rollouts", "4", "--steps", "1",
        )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert f"rollouts from my-policy at {server.base_url}" in printed
    assert {r["model"] for r in llm.requests} == {"my-policy"}
    greeter_calls = [r for r in llm.requests if r["messages"][0]["role"] == "system"]
    assert len(greeter_calls) == 2 * 4 + 2 * 64  # one step's runs, validation before and after
    assert (out / "dry_run" / "demo-policy" / "step-00000" / "report.json").is_file()
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["trajectories_scored"] == 8 and metrics["trainable_tokens"] > 0


def test_an_unreachable_server_is_one_clear_error(tmp_path, capsys):
    with serve() as server:
        url = server.base_url  # a port that was free a moment ago, and is closed now
    with pytest.raises(SystemExit):
        run("--base-url", url, "--model", "m", "--out", str(tmp_path / "demo"))
    error = capsys.readouterr().err
    assert f"cannot reach {url}" in error and "vllm serve" in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--base-url", "http://127.0.0.1:1/v1"), "--base-url and --model go together"),
        (("--backend", "cpu", "--model", "m", "--base-url", "http://x/v1"), "serves its own"),
        (("--policies", "2", "--backend", "dry-run"), "drop --backend dry-run"),
        (("--policies", "2", "--model", "m", "--base-url", "http://x/v1"), "drop --base-url"),
        (("--policies", "3"), "invalid choice"),
    ],
)
def test_flags_that_do_not_go_together_are_refused(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        run("--out", str(tmp_path / "demo"), *args)
    assert message in capsys.readouterr().err


def test_a_step_that_ships_nothing_says_so_in_its_line(tmp_path, capsys):
    """Every run scores the same, so every group is flat: the step's line says that nothing
    shipped and why, where the step would otherwise pass without a word."""
    with serve(ScriptedLLM(lambda request: "Hello.")) as server:
        code = run(
            "--base-url", server.base_url, "--model", "my-policy", "--out", str(tmp_path / "d"),
            "--examples", "2", "--rollouts", "3", "--steps", "1",
        )  # fmt: skip
    assert code == 0
    told = capsys.readouterr().err.splitlines()
    assert next(x for x in told if x.startswith("val step 0: reward")) == (
        "val step 0: reward 0.000 over 64 runs"
    )
    line = next(x for x in told if x.startswith("train step 0: reward"))
    assert line.startswith("train step 0: reward 0.000 (0.00-0.00) over 6 runs; nothing shipped: ")
    assert "all 2 groups are flat (each group's runs scored the same)" in line, line
