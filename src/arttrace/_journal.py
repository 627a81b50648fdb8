"""The run folder: every finished rollout is on disk before anything ships, a step is
trained on at most once, and one process works in the folder at a time.

Layout under ``output_dir`` (it holds prompts: folders are created ``0o700``, files ``0o600``)::

    .lock                                  flock'ed while a Trainer works here; holds its PID
    state.json                             steps completed, curriculum state, the run's settings
    metrics.jsonl, validation.jsonl        one line per step, one per validation
    journal/step-00003/rollouts.jsonl      step 3: one line per finished rollout
    journal/step-00003/shipping.json       synced to disk before ``backend.train`` is called
    journal/step-00003/shipped.json        written once the step's groups were trained on,
                                           with what the Trainer decided for each group

``shipped.json``'s ``decisions`` holds, per example position, what the Trainer decided for
its group: ``why_not`` (``None``: shipped; else a :data:`WhyNot`), ``advantages`` (ART's, by
rollout; ``None`` for a run it did not group) and ``rank`` (its place in the curriculum's
order; ``None`` without one). Run folders written before arttrace recorded it have none.

Durability contract:

- **Killed** (crash, Ctrl-C, ``SIGKILL``, out of memory): a rollout's line is appended with a
  single ``write`` as soon as the rollout finishes, and once it returns the line survives the
  process; resume runs only the rollouts without a line. A step is shipped from its lines
  (read back, never from live objects), so what trains is what the journal holds.
- **Power loss** (or an OS crash): what was not yet synced may be lost. The rollouts file is
  synced before its step ships, and ``shipping.json``, ``shipped.json``, ``state.json`` and
  the step's metrics line are synced when written, so a shipped step and its record survive;
  rollouts finished since the last sync may run again. ``.json`` files are written to a
  temporary name and renamed: each is whole or absent.
- **A torn line**: a crash mid-write can only cut the *last* line of a line file short.
  Reading or appending cuts it off, with a warning. Any other unreadable line is damage no
  process crash makes (an edit, a disk fault, power loss in a file not yet synced): reading
  fails with a :class:`JournalError` naming the file and line, and nothing is deleted.
- **Exactly once**: ``shipping.json`` records the backend's step (``_get_step``) before
  training. Where a call's outcome is unknown (a retry after a failure; a resumed run that
  finds ``shipping.json`` without ``shipped.json``) the backend is asked again: moved on means
  trained (recorded, not shipped again), unmoved means it ships again. If the backend cannot
  say and the last call did not visibly fail, the resume stops with a ``TrainingError`` that
  says how to go on (``_ship``).
- **One process**: :class:`RunLock` is an exclusive ``fcntl.flock`` on ``.lock``, held while
  a step, validation or ``train()`` runs. The OS releases it when the holder exits, however.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Self

import orjson

from ._errors import JournalError, RunLockedError
from .capture._trajectory import Trajectory

_log = logging.getLogger("arttrace")

Slot = tuple[int, int]
"""(position of the example in the step's batch, rollout number)."""


# -- files for the user only ---------------------------------------------------------------


def private_dir(path: Path) -> Path:
    """``path`` made if missing, for the user only (missing parents get the default mode)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _open(path: Path, flags: int) -> int:
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    """One ``write(2)``; a regular file takes it whole unless the disk is full."""
    written = os.write(fd, data)
    while written < len(data):
        written += os.write(fd, data[written:])


def _sync_dir(path: Path) -> None:
    """Make a file created or renamed in ``path`` survive power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any, *, sync: bool = False) -> None:
    """``data`` as ``path``, whole or not at all (renamed into place); ``sync`` also makes it
    survive power loss."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        _write_all(fd, json.dumps(data).encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        _sync_dir(path.parent)


def read_json(path: Path) -> Any:
    """The content of a file :func:`write_json` wrote, ``None`` if it is absent."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)
    except ValueError as error:
        raise JournalError(
            f"{path} is damaged ({error}). It is written whole or not at all, so it was "
            "edited or damaged on disk: restore it from a copy, or move the run folder away "
            "and start the run again"
        ) from None


# -- line files ----------------------------------------------------------------------------


def _json_line(record: dict[str, Any]) -> bytes:
    """``record`` as one line of JSON (see :func:`_json_line_read`)."""
    return _json_line_read(record)[0]


def _json_line_read(record: dict[str, Any]) -> tuple[bytes, Any]:
    """``record`` as one line of JSON, and that line read back. orjson (an ART dependency)
    is ~10x faster than the standard library but writes NaN and infinities as null: use it
    only when the line reads back exactly (a NaN metric, say, falls back to ``json``, which
    keeps it). The check reads the line back anyway, so its reading is returned too."""
    try:
        line = orjson.dumps(record)
        if (read := orjson.loads(line)) == record:
            return line + b"\n", read
    except TypeError:  # a type orjson does not take (an int beyond 64 bits, a non-str key)
        pass
    line = json.dumps(record).encode()
    return line + b"\n", loads(line)


def loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:  # NaN and infinities, which only ``json`` reads
        return json.loads(line)


def _cut_torn_line(path: Path, data: bytes) -> bytes:
    """``data`` (all of ``path``) up to its last whole line; a line cut short after it (a
    crash mid-write) is cut off the file too, so the next append starts on a fresh line."""
    whole = data.rfind(b"\n") + 1
    if whole < len(data):
        _log.warning(
            "%s: its last line was cut short (a crash while writing it); dropped its %d "
            "bytes, every whole line is kept",
            path,
            len(data) - whole,
        )
        os.truncate(path, whole)
    return data[:whole]


def damaged(path: Path, number: int, what: str) -> JournalError:
    """The error for line ``number`` of ``path``, which is ``what`` and so was damaged."""
    return JournalError(
        f"{path}, line {number}: {what}. A crash can only cut the last line short, and this "
        "one has lines after it, so the file was edited or damaged on disk. Repair or delete "
        "that line (the lines around it are intact), then run again"
    )


def read_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each line of a line file (none if it is absent), after
    cutting off a torn last line; any other unreadable line is a :class:`JournalError`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = enumerate(_cut_torn_line(path, data).split(b"\n")[:-1], 1)
    return [(n, record) for n, line in lines if (record := parse_line(path, n, line)) is not None]


def parse_line(path: Path, number: int, line: bytes) -> dict[str, Any] | None:
    """The record on line ``number`` of ``path`` (``None`` for a blank one); a line that is
    not a JSON object is a :class:`JournalError` naming the file and line."""
    if not line.strip():
        return None
    try:
        record = loads(line)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise damaged(path, number, f"not a line of JSON ({error})") from None
    if not isinstance(record, dict):
        raise damaged(path, number, f"a JSON {type(record).__name__}, not an object")
    return record


def append_line(path: Path, record: dict[str, Any], *, sync: bool = True) -> None:
    """Append ``record`` as one line (after cutting off a torn last line left by a crash)."""
    fd = _open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            _cut_torn_line(path, path.read_bytes())
        _write_all(fd, _json_line(record))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# -- each group's decision ----------------------------------------------------------------

WhyNot = Literal["failed", "flat", "below_min_spread", "no_trainable_token", "curriculum"]
"""Why a group did not ship: fewer than two runs scored, rewards all equal, a spread below
``min_reward_spread``, no trainable token, or left out by the curriculum."""


def advantages(rewards: Sequence[float]) -> list[float]:
    """ART's advantages (``tokenize_trajectory_groups``, ``scale_rewards=True``)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    if len(rewards) <= 1 or all(abs(r - rewards[0]) <= 1e-12 for r in rewards[1:]):
        return [0.0] * len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + 1e-6) for r in rewards]


# -- one process at a time -----------------------------------------------------------------


class RunLock:
    """An exclusive ``fcntl.flock`` on ``output_dir/.lock``, which holds the holder's PID.

    Re-entrant within one holder (``train()`` holds it around its steps). A second holder,
    in this process or another, gets :class:`RunLockedError` at once. The OS releases the
    lock when the file is closed or the process ends, crash or ``SIGKILL`` included."""

    def __init__(self, output_dir: Path) -> None:
        self.path = output_dir / ".lock"
        self._fd: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        if self._fd is None:
            private_dir(self.path.parent)
            fd = _open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunLockedError(
                    f"{self.path.parent} is in use by process {holder} (it holds "
                    f"{self.path}): two Trainers in one output_dir would ship groups that "
                    "differ from the journal. Wait for it to finish or stop it, or give this "
                    "Trainer another output_dir"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # closing the file releases the lock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the run's settings --------------------------------------------------------------------


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One ``"name: X when the run started, Y now"`` per setting that differs."""
    return [
        f"{name}: {_show(saved.get(name))} when the run started, {_show(current.get(name))} now"
        for name in sorted(saved.keys() | current.keys())
        if saved.get(name) != current.get(name)
    ]


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={_show(v)}" for k, v in value.items()) + ")"
    return "none" if value is None else repr(value)


# -- the journal ---------------------------------------------------------------------------


class Journal:
    """The run folder's files (see the module docstring for what survives what)."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.root = output_dir / "journal"
        self.state_path = output_dir / "state.json"
        self.lock = RunLock(output_dir)
        self.settings: dict[str, Any] | None = None
        """The run's settings (``_resume.run_settings``), saved with every state."""
        self._files: dict[int, int] = {}
        """Step -> descriptor of its rollouts file, open for appending (several steps' runs
        finish at once in pipelined training)."""

    def step_dir(self, step: int) -> Path:
        return self.root / f"step-{step:05d}"

    def rollouts_path(self, step: int) -> Path:
        return self.step_dir(step) / "rollouts.jsonl"

    # -- rollouts

    def record(self, step: int, slot: Slot, trajectory: Trajectory) -> Trajectory:
        """Append one finished rollout (``finished(step)`` made the folder) and return it as
        the journal holds it: the run to ship, unchanged by anything the live object sees
        later. The step's file stays open for the next one, until :meth:`close`."""
        fd = self._files.get(step)
        if fd is None:
            fd = _open(self.rollouts_path(step), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._files[step] = fd
        line, read = _json_line_read({"slot": list(slot), "trajectory": trajectory.to_dict()})
        _write_all(fd, line)  # returns once the line is in the OS's hands
        return Trajectory.from_dict(read["trajectory"])

    def close(self, step: int | None = None) -> None:
        """Close ``step``'s rollouts file (every step's, without one)."""
        for s in list(self._files) if step is None else [step]:
            fd = self._files.pop(s, None)
            if fd is not None:
                os.close(fd)

    def finished(self, step: int) -> dict[Slot, Trajectory]:
        """The rollouts of ``step`` already on disk (and its folder, made ready for more)."""
        self.close(step)
        for directory in (self.output_dir, self.root, self.step_dir(step)):
            private_dir(directory)
        path = self.rollouts_path(step)
        out: dict[Slot, Trajectory] = {}
        lines: dict[Slot, int] = {}
        for number, record in read_lines(path):
            try:
                position, rollout = record["slot"]
                slot = int(position), int(rollout)
                trajectory = Trajectory.from_dict(record["trajectory"])
            except (KeyError, TypeError, ValueError) as error:
                raise damaged(path, number, f"not a rollout ({error!r})") from None
            if slot in out:
                raise damaged(path, number, f"slot {list(slot)} again (line {lines[slot]})")
            out[slot], lines[slot] = trajectory, number
        return out

    def sync(self, step: int) -> None:
        """Make the step's rollouts survive power loss (before they ship)."""
        self.close(step)
        path = self.rollouts_path(step)
        if path.exists():
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for directory in (self.step_dir(step), self.root, self.output_dir):
            _sync_dir(directory)

    # -- shipping, exactly once

    def shipping_path(self, step: int, policy: str | None = None) -> Path:
        """Where shipping ``step`` (to ``policy``'s model, with several) is recorded."""
        return self.step_dir(step) / (
            "shipping.json" if policy is None else f"shipping-{policy}.json"
        )

    def begin_shipping(
        self, step: int, backend_step: int | None, policy: str | None = None
    ) -> None:
        """Record, durably, that ``step`` is about to ship and the backend's step before."""
        self.sync(step)
        path = self.shipping_path(step, policy)
        write_json(path, {"backend_step": backend_step, "failed": None}, sync=True)

    def shipping_failed(self, step: int, cause: str, policy: str | None = None) -> None:
        """Record that the last ``backend.train`` call for ``step`` failed (it may ship again)."""
        path = self.shipping_path(step, policy)
        write_json(path, {**(read_json(path) or {}), "failed": cause}, sync=True)

    def shipping(self, step: int, policy: str | None = None) -> dict[str, Any] | None:
        """What :meth:`begin_shipping` recorded (``None`` if the step never began shipping):
        ``backend_step`` before training (``None`` if the backend could not say) and
        ``failed``, the cause if the last call failed (``None`` if it never returned)."""
        record = read_json(self.shipping_path(step, policy))
        return record if isinstance(record, dict) else None

    def mark_trained(self, step: int, policy: str, train_metrics: dict[str, float]) -> None:
        """Record that ``policy``'s groups of ``step`` trained (several policies: the step is
        :meth:`mark_shipped` once every policy's did), with the metrics the backend gave."""
        path = self.step_dir(step) / f"trained-{policy}.json"
        write_json(path, {"train_metrics": train_metrics}, sync=True)

    def trained(self, step: int, policy: str) -> dict[str, float] | None:
        """The train metrics :meth:`mark_trained` recorded, or ``None`` if it did not."""
        record = read_json(self.step_dir(step) / f"trained-{policy}.json")
        return dict(record["train_metrics"]) if isinstance(record, dict) else None

    def mark_shipped(self, step: int, summary: dict[str, Any]) -> None:
        write_json(private_dir(self.step_dir(step)) / "shipped.json", summary, sync=True)

    def shipped(self, step: int) -> bool:
        return (self.step_dir(step) / "shipped.json").exists()

    def shipped_summary(self, step: int) -> dict[str, Any] | None:
        record = read_json(self.step_dir(step) / "shipped.json")
        return record if isinstance(record, dict) else None

    # -- state

    def load_state(self) -> dict[str, Any]:
        state = read_json(self.state_path)
        if state is not None and not isinstance(state, dict):
            raise JournalError(f"{self.state_path} is not a JSON object: restore it from a copy")
        return state or {}

    def save_state(self, state: dict[str, Any]) -> None:
        if self.settings is not None:
            state = {**state, "settings": self.settings}
        write_json(private_dir(self.output_dir) / "state.json", state, sync=True)
