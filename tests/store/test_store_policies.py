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
from support.policies import judged, rewards, two_roles


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


# -- a Trainer of two policies ------------------------------------------------------------------


@pytest.fixture(scope="module")
def several(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The two roles as two policies of one Trainer (``at.Policy``), each with its reward."""
    yield two_roles(tmp_path_factory.mktemp("several") / "run", several=True)


def test_a_run_of_two_policies(several: Path) -> None:
    metrics = [json.loads(x) for x in (several / "metrics.jsonl").read_text().splitlines()]
    validation = [json.loads(x) for x in (several / "validation.jsonl").read_text().splitlines()]
    with open_run(several) as store:
        assert store.policies() == ["planner", "executor"]  # as the Trainer declared them
        assert store.frozen_policies() == []
        assert store.count(policy="planner") == store.count(policy="executor") == 16
        for row in store.trajectories(limit=None):
            assert row.policy_rewards == rewards(row.rollout or 0)
            assert row.reward_for("executor") == rewards(row.rollout or 0)["executor"]
        for step in (0, 1):
            shipped = json.loads(
                (several / "journal" / f"step-{step:05d}" / "shipped.json").read_text()
            )
            groups = store.groups(step)
            assert [(g.position, g.policy) for g in groups] == [
                (0, "planner"),
                (0, "executor"),
                (1, "planner"),
                (1, "executor"),
            ]
            decided = {(d["policy"], d["example_id"]): d for d in shipped["decisions"]}
            for g in groups:
                assert g.policy is not None and g.shipped and g.why_not is None
                assert g.rewards == tuple(rewards(k)[g.policy] for k in range(4))
                assert list(g.advantages) == decided[(g.policy, g.example_id)]["advantages"]
                key = f"{g.policy}/{g.example_id}"
                assert g.trainable_tokens == shipped["trainable_tokens"][key] > 0
            assert store.groups(step, "executor") == [g for g in groups if g.policy == "executor"]
        for step_row, line in zip(store.steps(), metrics, strict=True):
            for policy in ("planner", "executor"):
                own = step_row.of_policy(policy)
                assert own.reward_mean == line[f"{policy}/reward_mean"]
                assert own.groups_kept == line[f"{policy}/groups_kept"] == 2
                assert own.trainable_tokens == line[f"{policy}/trainable_tokens"]
        for val_row, line in zip(store.validations(), validation, strict=True):
            assert val_row.of_policy("executor").reward_mean == line["executor/reward_mean"]


def test_a_step_one_policy_has_trained_says_so(several: Path, tmp_path: Path) -> None:
    run = copied(several, tmp_path)
    step = run / "journal" / "step-00001"
    (step / "shipped.json").unlink()  # killed after the planner trained, before the executor
    (step / "trained-executor.json").unlink()
    with open_run(run) as store:
        why = {g.policy: g.why_not for g in store.groups(1)}
        assert why["planner"] == (
            "the step did not ship yet (planner trained; the step's other policies have not "
            "finished training)"
        )
        assert why["executor"] == (
            "the step did not ship (executor: backend.train began and has not finished)"
        )


def test_arttrace_runs_shows_each_policy(several: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert runs_command(str(several), "--steps") == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "planner reward" in header and "executor shipped" in header
    assert runs_command(str(several), "--groups", "--step", "0", "--policy", "executor") == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 3 and all(" executor " in line for line in shown[1:])
    assert runs_command(str(several), "--steps", "--json") == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["policies"]["planner"]["groups_kept"] == 2


def test_a_frozen_policy_trains_no_group_and_a_judge_rewards_each_policy(
    tmp_path: Path,
) -> None:
    frozen = two_roles(tmp_path / "frozen", several=True, steps=1, frozen="executor")
    with open_run(frozen) as store:
        assert store.policies() == ["planner", "executor"]
        assert store.frozen_policies() == ["executor"]
        assert store.trained_policies() == ["planner"]
        assert {g.policy for g in store.groups(0)} == {"planner"}
        assert store.count(policy="executor") == store.count() == 8  # journaled as its own
    judged_run = two_roles(tmp_path / "judged", several=True, steps=1, judge_groups=True)
    with open_run(judged_run) as store:
        for row in store.trajectories(limit=None):
            k = row.rollout or 0
            assert row.policy_rewards == judged(k)  # the judge's, what the policies trained on
            assert row.reward == sum(judged(k).values()) / 2
            own = store.trajectory_dict(row.id)
            assert own["policy_rewards"] == rewards(k)  # the line keeps the run's own
        for g in store.groups(0):
            assert g.policy is not None and g.shipped
            assert g.rewards == tuple(judged(k)[g.policy] for k in range(4))
