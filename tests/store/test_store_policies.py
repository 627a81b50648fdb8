"""The store knows the policies of a run: each run's policies as its calls were journaled, a
``policy`` filter, the run's declared policies, and groups per example and policy in a run of
several; a folder written before calls had a policy reads as it did."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arttrace.app import runs_command as runs
from arttrace.store import open_run
from support.policies import two_roles


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One Trainer, one model, two roles named by ``@trainable(policy=...)``."""
    yield two_roles(tmp_path_factory.mktemp("roles") / "run")


def copied(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.name
    shutil.copytree(run, target, ignore=shutil.ignore_patterns(".arttrace-index*"))
    return target


def lines(out: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(out.glob("journal/step-*/rollouts.jsonl"))
        for line in path.read_text().splitlines()
    ]


def rewrite(out: Path, change: Any) -> None:
    """Each journal line's trajectory through ``change``, written back."""
    for path in sorted(out.glob("journal/step-*/rollouts.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            change(record["trajectory"])
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


def runs_command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="arttrace")
    commands = parser.add_subparsers(dest="command")
    runs.add_runs_command(commands)
    args = parser.parse_args(["runs", *argv])
    return int(args.run(args, commands.choices["runs"]))


def test_each_run_has_the_policies_its_calls_were_journaled_under(roles: Path) -> None:
    journaled = lines(roles)
    with open_run(roles) as store:
        assert store.policies() == ["executor", "planner"]  # no Trainer declared them: found
        assert store.count() == len(journaled) == 16
        rows = {(r.step, r.position, r.rollout): r for r in store.trajectories(limit=None)}
        for record in journaled:
            data = record["trajectory"]
            row = rows[(data["metadata"]["step"], *record["slot"])]
            calls = data["calls"]
            assert [c["policy"] for c in calls] == ["planner", "executor"]
            assert row.policies == ("planner", "executor")
            for call in calls:
                tokens = len(call["choices"][0]["token_ids"])
                assert row.policy_turns[call["policy"]] == 1
                assert row.policy_tokens[call["policy"]] == tokens > 0
            assert sum(row.policy_tokens.values()) == row.trainable_tokens
            assert row.reward_for("planner") == row.reward_for(None) == row.reward
        assert store.count(policy="planner") == store.count(policy="executor") == 16
        assert store.count(policy="nobody") == 0 and store.trajectories(policy="nobody") == []
        assert len(store.trajectories(policy="planner", step=1, limit=None)) == 8
        # one Trainer, one model: a group per example, as the Trainer shipped it
        groups = store.groups(0)
        assert [(g.position, g.policy, g.shipped) for g in groups] == [
            (0, None, True),
            (1, None, True),
        ]
        assert store.summary().policies == ("executor", "planner")


def test_a_folder_written_before_calls_had_a_policy_reads_as_before(
    roles: Path, tmp_path: Path
) -> None:
    old = copied(roles, tmp_path)

    def forget(trajectory: dict[str, Any]) -> None:
        for call in trajectory["calls"]:
            del call["policy"]

    rewrite(old, forget)
    with open_run(roles) as now, open_run(old) as before:
        assert before.policies() == [] and before.summary().policies == ()
        assert before.count(policy="planner") == 0
        assert all(r.policies == () and r.policy_tokens == {} for r in before.trajectories())
        for step in (0, 1):
            assert before.groups(step) == now.groups(step)
        assert before.steps() == now.steps() and before.validations() == now.validations()
        strip = ("policies", "policy_turns", "policy_tokens", "file", "offset", "length")
        for a, b in zip(before.trajectories(limit=None), now.trajectories(limit=None), strict=True):
            assert {k: v for k, v in vars_of(a).items() if k not in strip} == {
                k: v for k, v in vars_of(b).items() if k not in strip
            }


def vars_of(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__dataclass_fields__}


def test_arttrace_runs_filters_and_names_policies(
    roles: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runs_command(str(roles), "--policy", "planner", "--count") == 0
    assert capsys.readouterr().out.split()[-1] == "16"
    assert runs_command(str(roles), "--policy", "nobody", "--count") == 0
    assert capsys.readouterr().out.split()[-1] == "0"
    assert runs_command(str(roles), "--policy", "executor", "--step", "1", "--json") == 0
    found = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(found) == 8 and all(r["policies"] == ["planner", "executor"] for r in found)
    assert runs_command(str(roles)) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[-1] == "policies" and line.endswith("executor, planner")
