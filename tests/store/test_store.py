"""The run store: what a Trainer, a gateway with --out and Trajectory.save wrote, read back as
typed rows through an index that grows with the journal, and `arttrace runs` over it."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import art
import httpx
import openai
import pytest

import arttrace as at
from arttrace import store as run_store
from arttrace._errors import ConfigurationError, JournalError
from arttrace._journal import Journal
from arttrace.app import runs_command as runs
from arttrace.capture import _warnings
from arttrace.capture._art import trainable_tokens
from arttrace.gateway import Gateway
from arttrace.store import (
    RunStore,
    StepRow,
    ValidationRow,
    _index,
    open_run,
)
from arttrace.testing import Reply, ScriptedLLM, ToolCall, serve

SYSTEM = "You are a calculator named Quillby. Use the add tool."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
KINDS = ("ok", "ok2", "flat", "small", "raises", "aborted", "outside")
"""One example of each: what its group teaches, or why it does not ship."""
DATASET = [
    {"id": f"{kind}-{i}", "kind": kind, "a": 10 + i, "b": 20 + i} for i, kind in enumerate(KINDS)
]
CAUSE_ABORTED = "generation aborted"
CAUSE_OUTSIDE = "its LLM calls ran outside every @trainable function"


def respond(request: dict[str, Any]) -> Reply:
    """A tool call for a question (a word only the arguments hold for ok2), the answer once
    the tool has answered; a question that says abort gets an aborted generation."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"The answer is {last['content']}.")
    text = last["content"]
    if "abort" in text:
        return Reply("I give up", finish_reason="abort")
    a, b = (int(w) for w in text.rstrip("?").split()[-1].split("+"))
    arguments: dict[str, Any] = {"a": a, "b": b}
    if "furlongs" in text:
        arguments["unit"] = "furlongs"
    return Reply(tool_calls=[ToolCall("add", arguments)])


async def ask(client: openai.AsyncOpenAI, example: dict[str, Any]) -> None:
    """The agent's loop: the question, the add tool's call and result, the answer."""
    question = f"What is {example['a']}+{example['b']}?"
    if example["kind"] == "ok2":
        question = f"In furlongs: {question}"
    if example["kind"] == "aborted":
        question = f"Please abort: {question}"
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = first.choices[0].message
    if not message.tool_calls:
        return
    call = message.tool_calls[0]
    messages.append(message.model_dump(exclude_none=True))
    total = sum(json.loads(call.function.arguments)[k] for k in "ab")  # type: ignore[union-attr]
    messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{total} exactly"})
    await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)


policy = at.trainable(ask)


class Agent:
    """A tool-calling agent on the scripted model over HTTP; its reward depends on its kind and
    its rollout number (``ok``: 0 1 0 1, ``ok2``: 1 1 1 0, ``small``: 0.5 0.51 0.5 0.51, ...)."""

    def __init__(self, base_url: str, pause: float = 0.0) -> None:
        self.base_url, self.pause = base_url, pause

    async def rollout(self, example: dict[str, Any]) -> float:
        k = int(at.current_trajectory().metadata["rollout"] or 0)
        kind = example["kind"]
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key="k", max_retries=0) as c:
            await (ask if kind == "outside" else policy)(c, example)
        if self.pause:
            await asyncio.sleep(self.pause)
        if kind == "raises" and k == 0:
            raise ValueError("the add tool exploded")
        return {
            "ok": float(k % 2),
            "ok2": 1.0 if k < 3 else 0.0,
            "flat": 1.0,
            "small": 0.5 + 0.01 * (k % 2),
        }.get(kind, float(k % 2))


def trainer(out: Path, agent: Agent, dataset: list[dict[str, Any]], **kw: Any) -> at.Trainer:
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        run_name="r",
        base_path=str(out / ".art"),
    )
    settings: dict[str, Any] = {
        "group_size": 4,
        "groups_per_step": len(dataset),
        "output_dir": out,
        "progress": False,
        "log_to_model": False,
        "retry_delay": 0.001,
    }
    return at.Trainer(
        model, at.DryRunBackend(out / "dry"), agent.rollout, dataset, **{**settings, **kw}
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real Trainer's folder: 2 steps over DryRunBackend, the agent on a real local server,
    a curriculum, min_reward_spread, a validation set, runs that raise or cannot train."""
    out = tmp_path_factory.mktemp("trained")
    at.instrument()
    try:
        with serve(ScriptedLLM(respond)) as server, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the capture's and Trainer's warnings, expected
            t = trainer(
                out,
                Agent(server.base_url),
                DATASET,
                val_dataset=DATASET[:2],
                curriculum=at.Curriculum(initial_percentile=0.5),
                min_reward_spread=0.05,
            )

            async def train() -> None:
                await t.model.register(t.backend)
                await t.train(num_steps=2)

            asyncio.run(train())
    finally:
        at.uninstrument()
        _warnings.reset()
    yield out


def copied(run: Path, tmp_path: Path) -> Path:
    """A copy of ``run`` without its index: a test free to change it."""
    target = tmp_path / run.name
    shutil.copytree(run, target, ignore=shutil.ignore_patterns(".arttrace-index*"))
    return target


def journal_lines(out: Path) -> list[tuple[int, int, dict[str, Any]]]:
    """``(step, line number, record)`` of every journaled rollout, read as plain JSON."""
    found = []
    for folder in sorted((out / "journal").glob("step-*")):
        step = int(folder.name.removeprefix("step-"))
        for number, line in enumerate((folder / "rollouts.jsonl").read_text().splitlines(), 1):
            found.append((step, number, json.loads(line)))
    return found


def row_id(step: int, line: int) -> int:
    return (step * 2) << _index.LINE_BITS | line


# -- a Trainer's folder ----------------------------------------------------------------------


def test_rows_are_what_the_trainer_journaled(trained: Path) -> None:
    lines = journal_lines(trained)
    with open_run(trained) as store:
        assert store.kind == "trainer" and store.index_path == trained / ".arttrace-index.sqlite"
        assert store.count() == len(lines) == 2 * len(KINDS) * 4
        for step, number, record in lines:
            row = store.row(row_id(step, number))
            data = record["trajectory"]
            t = at.Trajectory.from_dict(data)
            assert (row.step, row.position, row.rollout) == (step, *record["slot"])
            assert (row.example_id, row.reward, row.split) == (t.example_id, t.reward, "train")
            assert row.policy_step == t.metadata["policy_step"] == step
            assert row.calls == len(t.calls) and row.sources == ("openai",)
            assert row.trainable_turns == t.trainable_turns
            assert row.completion_tokens == sum(c.completion_tokens for c in t.calls)
            if t.reward is not None:  # what ART trains on, counted by ART's own objects
                assert row.trainable_tokens == trainable_tokens(t.to_art())
            kind = t.example_id.split("-")[0]
            expected = {"aborted": (CAUSE_ABORTED,), "outside": (CAUSE_OUTSIDE,)}
            assert row.causes == expected.get(kind, ())
            raised = t.exception is not None
            assert raised == (kind == "raises" and row.rollout == 0)
            if raised:
                assert row.exception_type == "ValueError"
                assert row.exception_message == "the add tool exploded"
            assert (row.started_at, row.ended_at) == (t.started_at, t.ended_at)
            assert row.file == trained / "journal" / f"step-{step:05d}" / "rollouts.jsonl"
            assert store.trajectory(row.id).to_dict() == t.to_dict()
            assert store.trajectory_dict(row.id) == data  # its line alone, read back exactly


def test_steps_and_validations_are_the_trainers_lines(trained: Path) -> None:
    metrics = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    validation = [json.loads(x) for x in (trained / "validation.jsonl").read_text().splitlines()]
    with open_run(trained) as store:
        steps = store.steps()
        assert steps == [StepRow.from_metrics(m) for m in metrics] and len(steps) == 2
        assert [s.metrics for s in steps] == metrics
        for s, m in zip(steps, metrics, strict=True):
            assert (
                (s.groups_kept, s.groups_total) == (m["groups_kept"], m["groups_total"]) == (2, 7)
            )
            assert s.trainable_tokens == m["trainable_tokens"] > 0
            assert s.policy_lag == 0.0 and s.loss is None  # DryRunBackend reports no loss
        assert store.validations() == [ValidationRow.from_metrics(v) for v in validation]
        assert [v.step for v in store.validations()] == [0, 2]
        # The Trainer journals no validation run (only these statistics): none is indexed.
        assert store.count(split="val") == 0 and store.count(split="train") == store.count()


def test_groups_say_what_shipped_and_why_not(trained: Path) -> None:
    with open_run(trained) as store:
        for step in (0, 1):
            groups = {g.example_id.split("-")[0]: g for g in store.groups(step)}
            assert sorted(groups) == sorted(KINDS)
            assert [g.position for g in store.groups(step)] == list(range(len(KINDS)))
            report = json.loads(
                (trained / "dry" / "m" / f"step-{step:05d}" / "report.json").read_text()
            )
            shipped_ids = {g["example_id"] for g in report["per_group"]}
            assert {g.example_id for g in groups.values() if g.shipped} == shipped_ids
            assert {k for k, g in groups.items() if g.shipped} == {"ok2", "raises"}
            assert groups["ok"].why_not == "excluded by the curriculum"
            assert groups["flat"].why_not == "flat: every run got the same reward"
            assert groups["flat"].advantages == (0.0,) * 4 and groups["flat"].spread == 0
            assert groups["small"].why_not == "flat: reward spread 0.01 is below min_reward_spread"
            assert groups["aborted"].why_not == f"no trainable token: {CAUSE_ABORTED}"
            assert groups["outside"].why_not == f"no trainable token: {CAUSE_OUTSIDE}"
            raises = groups["raises"]
            assert raises.exceptions == 1 and raises.runs == 4
            assert raises.advantages[0] is None and raises.rewards[1:] == (1.0, 0.0, 1.0)
            scored = [a for a in raises.advantages if a is not None]
            assert math.isclose(sum(scored), 0.0, abs_tol=1e-9)
            assert all(
                (a > 0) == (r > raises.reward_mean)
                for a, r in zip(scored, raises.rewards[1:], strict=True)
            )
            shipped = json.loads(
                (trained / "journal" / f"step-{step:05d}" / "shipped.json").read_text()
            )
            for kind in ("ok", "ok2", "raises"):
                assert (
                    groups[kind].trainable_tokens
                    == shipped["trainable_tokens"][groups[kind].example_id]
                    > 0
                )
            assert groups["aborted"].trainable_tokens == 0
            assert (
                sum(g.trainable_tokens for g in groups.values() if g.shipped)
                == report["trainable_tokens"]
            )


def test_filters_text_search_and_causes(trained: Path) -> None:
    with open_run(trained) as store:
        everything = store.trajectories(limit=None)
        assert len(everything) == store.count() == 56
        assert store.causes() == {CAUSE_ABORTED: 8, CAUSE_OUTSIDE: 8}
        aborted = store.trajectories(cause=CAUSE_ABORTED)
        assert len(aborted) == 8 and {r.example_id for r in aborted} == {"aborted-5"}
        assert store.count(cause="no such cause") == 0
        assert store.count(step=1) == 28 and {r.step for r in store.trajectories(step=1)} == {1}
        assert store.count(example_id="flat-2") == 8
        rewarded = [r for r in everything if r.reward is not None and 0.5 <= r.reward <= 0.51]
        assert store.trajectories(min_reward=0.5, max_reward=0.51, limit=None) == rewarded
        both = store.trajectories(step=0, min_reward=1.0, cause=CAUSE_OUTSIDE)
        assert both and all(
            r.step == 0 and r.reward == 1.0 and r.causes == (CAUSE_OUTSIDE,) for r in both
        )
        # text: what the user, the tool call arguments, the tool and the assistant said
        assert {r.example_id for r in store.trajectories(text="furlongs")} == {"ok2-1"}
        assert store.count(text="furl*") == store.count(text="FURLONGS") == 8
        assert store.count(text='"unit"') == 8  # the arguments' own JSON
        assert store.count(text="32 exactly") == 8  # the tool's result for 11+21 (ok2)
        assert store.count(text="answer") == 56 - 8  # every run but the aborted ones
        assert store.count(text="Quillby") == 0  # system prompts are not indexed
        assert store.count(text="abort", step=0) == 4
        for word in ("answer", "furlongs", "1+2", "+"):  # one filter is counted apart: the same
            assert store.count(text=word) == len(store.trajectories(text=word, limit=None))
        assert store.count(cause=CAUSE_OUTSIDE) == len(store.trajectories(cause=CAUSE_OUTSIDE))
        # order and paging
        by_reward = store.trajectories(order="-reward", limit=None)
        rewards = [r.reward for r in by_reward]
        assert rewards[: rewards.index(None) if None in rewards else None] == sorted(
            [r for r in rewards if r is not None], reverse=True
        )
        pages = [r.id for o in range(0, 56, 10) for r in store.trajectories(limit=10, offset=o)]
        assert pages == [r.id for r in everything] and len(set(pages)) == 56
        with pytest.raises(ConfigurationError, match="order must be one of"):
            store.trajectories(order="sideways")


def test_text_search_without_fts5_finds_the_same(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite build without FTS5 (this machine's has it): LIKE over the stored text; an
    index made with the other kind of text search is rebuilt."""
    run = copied(trained, tmp_path)
    with open_run(run) as store:
        assert store.text_search == ("fts5" if _index.fts5_available() else "like")
        words = ["furlongs", "32 exactly", "Quillby", "unit", "answer"]
        expected = {w: store.count(text=w) for w in words}
    monkeypatch.setattr(_index, "text_mode", lambda: "like")
    with open_run(run) as store:
        assert store.text_search == "like" and store.count() == 56
        assert {w: store.count(text=w) for w in words} == expected
        assert store.count(text="furlongs", cause=CAUSE_OUTSIDE) == 0


# -- growing, torn, damaged --------------------------------------------------------------------


def test_refresh_follows_a_trainer_as_it_appends(tmp_path: Path) -> None:
    """Counts grow while the Trainer works; each run is indexed once; the end is the journal."""
    out = tmp_path / "live"
    dataset = [DATASET[0], DATASET[2]]
    at.instrument()
    errors: list[BaseException] = []
    try:
        with serve(ScriptedLLM(respond)) as server, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = trainer(out, Agent(server.base_url, pause=0.05), dataset, max_concurrency=2)

            async def steps() -> None:
                await t.model.register(t.backend)
                await t.train(num_steps=3)

            def train() -> None:
                try:
                    asyncio.run(steps())
                except BaseException as error:
                    errors.append(error)

            worker = threading.Thread(target=train)
            worker.start()
            while not (out / "state.json").exists():
                time.sleep(0.01)
            store = open_run(out)
            counts, added = [store.count()], [0]
            while worker.is_alive():
                added.append(store.refresh())
                counts.append(store.count())
                time.sleep(0.02)
            worker.join()
    finally:
        at.uninstrument()
        _warnings.reset()
    assert not errors
    added.append(store.refresh())
    counts.append(store.count())
    lines = journal_lines(out)
    assert counts == sorted(counts) and len(set(counts)) > 3  # seen growing, in several steps
    assert counts[-1] == sum(added) + counts[0] == len(lines) == 3 * 2 * 4
    assert {r.id for r in store.trajectories(limit=None)} == {row_id(s, n) for s, n, _ in lines}
    assert len(store.steps()) == 3 and store.refresh() == 0
    store.close()


def test_a_torn_last_line_waits_until_it_is_whole(trained: Path, tmp_path: Path) -> None:
    run = copied(trained, tmp_path)
    rollouts = run / "journal" / "step-00001" / "rollouts.jsonl"
    whole = rollouts.read_bytes().splitlines(keepends=True)
    rollouts.write_bytes(b"".join(whole[:3]) + whole[3][:100])  # a writer mid-write
    metrics = run / "metrics.jsonl"
    metrics_lines = metrics.read_bytes().splitlines(keepends=True)
    metrics.write_bytes(metrics_lines[0] + metrics_lines[1][:-10])
    with open_run(run) as store:
        assert store.count(step=1) == 3 and len(store.steps()) == 1
        assert store.refresh() == 0
        with open(rollouts, "ab") as f:
            f.write(whole[3][100:])
        with open(metrics, "ab") as f:
            f.write(metrics_lines[1][-10:])
        assert store.refresh() == 1 and store.count(step=1) == 4 and len(store.steps()) == 2
        row = store.row(row_id(1, 4))
        assert store.trajectory_dict(row.id) == json.loads(whole[3])["trajectory"]
        with open(rollouts, "ab") as f:
            f.write(b"".join(whole[4:]))
        assert store.refresh() == len(whole) - 4 and store.count() == 56
    assert rollouts.read_bytes() == b"".join(whole)  # the store never writes a journal file


def test_a_damaged_line_is_the_journals_error_naming_file_and_line(
    trained: Path, tmp_path: Path
) -> None:
    run = copied(trained, tmp_path)
    rollouts = run / "journal" / "step-00000" / "rollouts.jsonl"
    lines = rollouts.read_bytes().splitlines(keepends=True)
    lines[4] = b'{"slot": [0, 1], "trajec\n'  # an edit: whole lines after it
    rollouts.write_bytes(b"".join(lines))
    with pytest.raises(JournalError) as raised:
        open_run(run)
    message = str(raised.value)
    assert f"{rollouts}, line 5: not a line of JSON" in message
    assert "Repair or delete that line" in message
    with pytest.raises(JournalError) as journals:  # the Trainer's own reading says the same
        Journal(run).finished(0)
    assert str(journals.value).split(":")[0] == message.split(":")[0]
    store = RunStore(run)
    with pytest.raises(JournalError, match="line 5"):
        store.refresh()
    assert store.count(step=0) == 4 and store.count(step=1) == 28  # the rest is indexed
    with pytest.raises(JournalError, match="line 5"):  # and said again on every refresh
        store.refresh()
    store.close()


def test_a_folder_without_recorded_decisions_opens(trained: Path, tmp_path: Path) -> None:
    """A run folder written before the Trainer recorded each group's decision: the reasons
    its runs tell are shown, the others are said to be unrecorded."""
    run = copied(trained, tmp_path)
    shipped = run / "journal" / "step-00000" / "shipped.json"
    record = json.loads(shipped.read_text())
    assert len(record.pop("decisions")) == len(KINDS)
    shipped.write_text(json.dumps(record))
    with open_run(run) as store:
        groups = {g.example_id.split("-")[0]: g for g in store.groups(0)}
        assert groups["flat"].why_not == "flat: every run got the same reward"
        assert groups["aborted"].why_not == f"no trainable token: {CAUSE_ABORTED}"
        for kind in ("ok", "ok2", "small"):
            assert not groups[kind].shipped
            assert (groups[kind].why_not or "").startswith("not recorded: the step shipped")
        assert groups["raises"].advantages[0] is None
        assert [g.shipped for g in store.groups(1)].count(True) == 2  # recorded


def test_a_step_set_aside_is_followed(trained: Path, tmp_path: Path) -> None:
    """The Trainer moves a step's runs aside (rollouts-nothing-to-train.jsonl) and writes a new
    rollouts.jsonl on resume: the index starts over, and shows both."""
    run = copied(trained, tmp_path)
    step = run / "journal" / "step-00001"
    with open_run(run) as store:
        assert store.count(step=1) == 28
        (step / "shipped.json").unlink()
        (step / "rollouts.jsonl").replace(step / "rollouts-nothing-to-train.jsonl")
        store.refresh()
        aside = store.trajectories(step=1, limit=None)
        assert len(aside) == 28 and all(r.set_aside for r in aside)
        assert {
            g.why_not for g in store.groups(1) if g.why_not and g.why_not.startswith("the step")
        } == {
            "the step did not ship (no group with learning signal held a trainable token; its "
            "runs were set aside in rollouts-nothing-to-train.jsonl)"
        }
        first = (step / "rollouts-nothing-to-train.jsonl").read_bytes().splitlines(keepends=True)[0]
        (step / "rollouts.jsonl").write_bytes(first)
        store.refresh()
        assert store.count(step=1) == 29 and len(store.groups(1)) == 1  # the new runs only
        assert (
            store.trajectory(row_id(1, 1)).to_dict()
            == store.trajectory(row_id(1, 1) | 1 << _index.LINE_BITS).to_dict()
        )


# -- a gateway's folder, saved trajectories ---------------------------------------------------


def test_a_gateway_out_folder(tmp_path: Path) -> None:
    out = tmp_path / "gateway"
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "What is 1+2?"}],
        "tools": TOOLS,
    }
    with (
        serve(ScriptedLLM(respond)) as upstream,
        Gateway(upstream.base_url, out=out) as gateway,
        httpx.Client() as client,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        base = gateway.base_url
        for number, example in enumerate(["a", "b", "a", "b", "c"]):
            run = client.post(f"{base}/runs", json={"example_id": example}).json()
            if example != "c":  # c: closed without a call
                assert client.post(f"{run['url']}/chat/completions", json=body).status_code == 200
            reward = {"reward": float(number % 3)} if example != "b" else {"reward": 1.0}
            client.post(f"{base}/runs/{run['run_id']}/close", json=reward)
    journaled = Journal(out).finished(0)
    with open_run(out) as store:
        assert store.kind == "gateway" and store.count() == 5 and store.steps() == []
        for row in store.trajectories(limit=None):
            assert row.position is not None and row.rollout is not None
            t = journaled[(row.position, row.rollout)]
            assert store.trajectory(row.id).to_dict() == t.to_dict()
            assert (row.example_id, row.reward, row.split) == (t.example_id, t.reward, None)
            assert row.trainable_turns == t.trainable_turns == (0 if t.example_id == "c" else 1)
            assert row.sources == (() if t.example_id == "c" else ("gateway",))
        assert store.causes() == {"no LLM call was seen": 1}
        assert store.count(text="1+2") == 4
        groups = {g.example_id: g for g in store.groups(0)}
        assert groups["b"].why_not == "flat: every run got the same reward"
        assert groups["a"].rewards == (0.0, 2.0) and groups["a"].spread == 2.0
        assert groups["a"].why_not is not None and groups["a"].why_not.startswith(
            "the step did not ship (a gateway's journal"
        )
        summary = store.summary()
        assert (summary.kind, summary.runs, summary.steps, summary.groups_shipped) == (
            "gateway",
            5,
            1,
            None,
        )


def test_saved_trajectories_a_file_and_a_folder(trained: Path, tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    runs = [at.Trajectory.from_dict(r["trajectory"]) for _, _, r in journal_lines(trained)[:5]]
    for number, t in enumerate(runs):
        t.save(folder / f"run-{number}.json")
    (folder / "settings.json").write_text('{"lr": 1}')  # not a trajectory: said, left out
    with open_run(folder) as store:
        assert store.kind == "saved" and store.count() == 5
        assert store.problems == [
            f"{folder / 'settings.json'} is JSON but not a saved trajectory (Trajectory.save "
            "writes an object with example_id and calls)"
        ]
        rows = store.trajectories(limit=None)
        assert [r.file.name for r in rows] == [f"run-{i}.json" for i in range(5)]
        for row, t in zip(rows, runs, strict=True):
            assert row.step is None and row.example_id == t.example_id and row.reward == t.reward
            assert store.trajectory(row.id).to_dict() == at.Trajectory.load(row.file).to_dict()
        runs[0].save(folder / "run-5.json")
        assert store.refresh() == 1 and store.count() == 6
        assert store.groups(0) == [] and store.steps() == []
    with open_run(folder / "run-2.json") as single:
        assert single.kind == "saved" and single.index_path is None
        (row,) = single.trajectories()
        assert single.trajectory(row.id).to_dict() == runs[2].to_dict()


def test_a_path_that_is_not_a_run_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text('{"lr": 1}')
    (tmp_path / "workers" / "worker-0" / "journal").mkdir(parents=True)
    (tmp_path / "workers" / "worker-1" / "journal").mkdir(parents=True)
    (tmp_path / "workers" / ".lock").touch()  # the gateway's, held while its workers serve
    cases = {
        tmp_path / "workers": "an `arttrace gateway --workers` gateway.*: give those, .*"
        "worker-0 .*worker-1$",
        tmp_path / "missing": "does not exist: give a Trainer's output_dir",
        tmp_path / "empty": "is not a run folder: it has no journal/ folder, state.json",
        tmp_path / "notes.txt": "is a file but not a saved trajectory",
        tmp_path / "config": "holds no saved trajectory: .*settings.json is JSON but not",
        tmp_path / "bad.json": "is JSON but not a saved trajectory",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigurationError, match=message):
            open_run(path)
    assert not (tmp_path / "empty" / ".arttrace-index.sqlite").exists()


# -- the index file --------------------------------------------------------------------------


def test_an_index_of_another_version_or_damaged_is_rebuilt(trained: Path, tmp_path: Path) -> None:
    run = copied(trained, tmp_path)
    open_run(run).close()
    index = run / ".arttrace-index.sqlite"
    assert index.stat().st_mode & 0o777 == 0o600  # it holds the runs' text
    db = sqlite3.connect(index)
    db.execute("DELETE FROM runs WHERE step = 1")
    db.execute(f"PRAGMA user_version = {_index.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with open_run(run) as store:
        assert (
            store.count() == 56 and store.count(step=1) == 28 and store.count(text="furlongs") == 8
        )
    db = sqlite3.connect(index)
    assert db.execute("PRAGMA user_version").fetchone() == (_index.SCHEMA_VERSION,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    index.write_bytes(b"this is not a database" * 100)
    with open_run(run) as store:
        assert store.count() == 56


def test_an_unwritable_place_puts_the_index_in_the_cache(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = copied(trained, tmp_path)
    (run / ".arttrace-index.sqlite").mkdir()  # no index can be made there
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with open_run(run) as store:
        assert store.index_path == _index.cache_location(run)
        assert str(store.index_path).startswith(str(tmp_path / "cache" / "arttrace"))
        assert store.count() == 56


def _index_in_a_process(run: Path) -> subprocess.Popen[str]:
    code = "import sys; from arttrace.store import open_run; print(open_run(sys.argv[1]).count())"
    return subprocess.Popen(
        [sys.executable, "-c", code, str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def big_run(trained: Path, tmp_path: Path, runs: int) -> Path:
    """A Trainer folder whose step 0 holds ``runs`` journal lines (the real lines, repeated)."""
    run = copied(trained, tmp_path)
    lines = (run / "journal" / "step-00000" / "rollouts.jsonl").read_bytes().splitlines()
    with open(run / "journal" / "step-00000" / "rollouts.jsonl", "wb") as f:
        for i in range(runs):
            record = json.loads(lines[i % len(lines)])
            record["slot"] = [i // 4, i % 4]
            f.write(json.dumps(record).encode() + b"\n")
    return run


def test_processes_share_an_index_and_a_killed_one_leaves_it_usable(
    trained: Path, tmp_path: Path
) -> None:
    run = big_run(trained, tmp_path, 3000)
    expected = 3000 + 28
    killed = _index_in_a_process(run)
    index = run / ".arttrace-index.sqlite"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it once a batch is in, before the end
        try:
            db = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
            try:
                if db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0:
                    break
            finally:
                db.close()
        except sqlite3.OperationalError:
            pass
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    db = sqlite3.connect(index)
    partial = db.execute("SELECT count(*) FROM runs").fetchone()[0]
    db.close()
    assert 0 < partial < expected  # killed mid-refresh
    together = [_index_in_a_process(run) for _ in range(2)]
    with open_run(run) as store:  # a third, in this process, at the same time
        mine = store.count()
    outputs = [p.communicate(timeout=120) for p in together]
    assert all(p.returncode == 0 for p in together), outputs
    assert [int(out) for out, _ in outputs] == [expected, expected] and mine == expected
    db = sqlite3.connect(index)
    (runs, distinct, lines), *_ = db.execute(
        "SELECT count(*), count(DISTINCT id), "
        "(SELECT sum(lines) FROM files WHERE kind = 'rollouts') FROM runs"
    ).fetchall()
    db.close()
    assert runs == distinct == lines == expected  # every line once


# -- arttrace runs ----------------------------------------------------------------------------


def runs_command(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="arttrace")
    commands = parser.add_subparsers(dest="command")
    runs.add_runs_command(commands)
    args = parser.parse_args(["runs", *argv])
    return int(args.run(args, commands.choices["runs"]))


def test_arttrace_runs(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tuple(run_store._store.ORDERS) == runs.ORDERS
    assert runs_command(str(trained)) == 0
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["run", "kind", "steps", "runs"]
    assert line.split()[:4] == [str(trained), "trainer", "2", "56"]
    assert f"{CAUSE_ABORTED} (8)" in line
    assert runs_command(str(trained), "--json") == 0
    (summary,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert summary["groups shipped"] == 4 and summary["groups dropped"] == 10
    assert runs_command(str(trained), "--cause", CAUSE_ABORTED, "--step", "1", "--json") == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4 and all(r["causes"] == [CAUSE_ABORTED] and r["step"] == 1 for r in rows)
    assert runs_command(str(trained), "--text", "furlongs", "--count") == 0
    assert capsys.readouterr().out.split()[-1] == "8"
    assert runs_command(str(trained), "--show", str(rows[0]["id"])) == 0
    with open_run(trained) as store:
        assert json.loads(capsys.readouterr().out) == store.trajectory_dict(rows[0]["id"])
    assert runs_command(str(trained), "--groups", "--step", "0") == 0
    shown = capsys.readouterr().out
    assert "no: excluded by the curriculum" in shown and shown.count("yes") == 2
    assert runs_command(str(trained), "--steps") == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    with pytest.raises(SystemExit) as bad:
        runs_command(str(tmp_path / "missing"))
    assert bad.value.code == 2 and "does not exist" in capsys.readouterr().err
    run = copied(trained, tmp_path)
    rollouts = run / "journal" / "step-00001" / "rollouts.jsonl"
    rollouts.write_bytes(b"{oops\n" + rollouts.read_bytes())
    assert runs_command(str(run)) == 1
    assert f"{rollouts}, line 1: not a line of JSON" in capsys.readouterr().err


def test_rows_are_plain_data(trained: Path) -> None:
    """Frozen rows of typed fields, serialisable as the viewer and the exports send them."""
    with open_run(trained) as store:
        row = store.trajectories(limit=1)[0]
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.reward = 2.0  # type: ignore[misc]
        for value in (row, store.groups(0)[0], store.steps()[0], store.validations()[0]):
            json.dumps(dataclasses.asdict(value), default=str)
