"""The run folder's files: torn and damaged lines, permissions, the lock, what ships."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
from pathlib import Path

import pytest

import arttrace as at
from arttrace._errors import JournalError, RunLockedError
from arttrace._journal import Journal, RunLock, append_line, read_lines
from support.trainer import hold_lock


def run(example_id: str, reward: float) -> at.Trajectory:
    with at.trajectory(example_id, metadata={"step": 0}) as t:
        t.reward = reward
        t.metrics["turns"] = 1
    return t


def write_step(out: Path, rewards: list[float]) -> Path:
    journal = Journal(out)
    journal.finished(0)
    for k, reward in enumerate(rewards):
        journal.record(0, (0, k), run("ex-0", reward))
    journal.close()
    return journal.rollouts_path(0)


def test_a_torn_last_line_is_cut_off_with_a_warning_and_nothing_whole_is_lost(tmp_path, caplog):
    path = write_step(tmp_path, [0.0, 1.0])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"slot": [0, 2], "trajec')  # the process died mid-write
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        runs = Journal(tmp_path).finished(0)
    assert sorted(runs) == [(0, 0), (0, 1)] and runs[0, 1].reward == 1.0
    assert path.read_bytes() == whole  # the next append starts on a fresh line
    assert str(path) in caplog.text and "cut short" in caplog.text


@pytest.mark.parametrize(
    "garbage", [b"{not json", b"\xff\xfe\x00 binary", b"[1, 2]", b'{"slot": [0]}']
)
def test_a_damaged_line_in_the_middle_names_the_file_and_line_and_deletes_nothing(
    tmp_path, garbage
):
    path = write_step(tmp_path, [0.0, 1.0])
    first, second = path.read_bytes().splitlines(keepends=True)
    damaged = first + garbage + b"\n" + second
    path.write_bytes(damaged)
    with pytest.raises(JournalError) as caught:
        Journal(tmp_path).finished(0)
    message = str(caught.value)
    assert f"{path}, line 2" in message and "Repair or delete that line" in message
    assert isinstance(caught.value, ValueError)  # existing `except ValueError` still works
    assert path.read_bytes() == damaged


def test_a_slot_journaled_twice_is_damage_not_a_silent_choice(tmp_path):
    path = write_step(tmp_path, [0.0, 1.0])
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + second + first)
    with pytest.raises(JournalError, match=r"line 3: slot \[0, 0\] again \(line 1\)"):
        Journal(tmp_path).finished(0)


def test_appending_after_a_torn_line_keeps_every_line_readable(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    append_line(path, {"step": 0, "reward_mean": 0.5})
    with path.open("ab") as f:
        f.write(b'{"step": 1, "rew')  # killed while writing step 1's line
    with caplog.at_level(logging.WARNING, logger="arttrace"):
        append_line(path, {"step": 1, "reward_mean": 0.75})
    assert [record for _, record in read_lines(path)] == [
        {"step": 0, "reward_mean": 0.5},
        {"step": 1, "reward_mean": 0.75},
    ]
    assert "cut short" in caplog.text


def test_what_record_returns_is_what_the_journal_holds(tmp_path):
    """A call that lands on a run after it was journaled does not change what ships."""
    journal = Journal(tmp_path)
    journal.finished(0)
    live = run("ex-0", 1.0)
    journaled = journal.record(0, (0, 0), live)
    live.metrics["late"] = 1
    live.metadata["late"] = "yes"
    journal.close()
    (on_disk,) = Journal(tmp_path).finished(0).values()
    assert journaled.to_dict() == on_disk.to_dict() != live.to_dict()


def test_the_run_folder_and_its_files_are_for_the_user_only(tmp_path):
    old = os.umask(0o022)  # the usual default, under which files are world-readable
    try:
        out = tmp_path / "run"
        journal = Journal(out)
        write_step(out, [0.0, 1.0])
        journal.save_state({"completed_steps": 0})
        journal.begin_shipping(0, 0)
        journal.mark_shipped(0, {})
        append_line(out / "metrics.jsonl", {"step": 0})
        with journal.lock:
            pass
    finally:
        os.umask(old)
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_a_damaged_state_file_names_the_file(tmp_path):
    (tmp_path / "state.json").write_text('{"completed_steps": ')
    with pytest.raises(JournalError, match=r"state\.json is damaged"):
        Journal(tmp_path).load_state()


def test_a_second_process_is_refused_with_the_folder_and_pid_until_the_holder_dies(tmp_path):
    holder = hold_lock(tmp_path / "run")
    try:
        with pytest.raises(RunLockedError) as caught:
            RunLock(tmp_path / "run").acquire()
        assert f"{tmp_path / 'run'} is in use by process {holder.pid}" in str(caught.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the OS releases the lock
        holder.wait()
    lock = RunLock(tmp_path / "run")
    with lock:
        assert (tmp_path / "run" / ".lock").read_text() == f"{os.getpid()}\n"
        with lock:  # re-entrant for its holder
            pass
        assert lock.held
        with pytest.raises(RunLockedError, match=str(os.getpid())):
            RunLock(tmp_path / "run").acquire()  # a second holder in this process too
    assert not lock.held
    RunLock(tmp_path / "run").acquire()


def test_shipping_records_read_back(tmp_path):
    journal = Journal(tmp_path)
    write_step(tmp_path, [0.0, 1.0])
    assert journal.shipping(0) is None
    journal.begin_shipping(0, 4)
    assert journal.shipping(0) == {"backend_step": 4, "failed": None}
    journal.shipping_failed(0, "ConnectionError('down')")
    assert journal.shipping(0) == {"backend_step": 4, "failed": "ConnectionError('down')"}
    assert not journal.shipped(0)
    journal.mark_shipped(0, {"metrics": {"step": 0}})
    assert journal.shipped(0) and journal.shipped_summary(0) == {"metrics": {"step": 0}}
    assert json.loads((tmp_path / "journal" / "step-00000" / "shipped.json").read_text())
