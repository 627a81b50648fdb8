"""The training journal: every finished rollout is on disk before anything ships.

Layout under ``output_dir``::

    state.json                             steps completed, curriculum state
    journal/step-00003/rollouts.jsonl      step 3: one line per finished rollout
    journal/step-00003/shipped.json        written once the step's groups were trained on

A rollout's line (``{"slot": [example position in the batch, rollout number], "trajectory":
{...}}``) is appended with a single ``write`` as soon as the rollout finishes: one system call,
no temporary file and rename per rollout. Once ``write`` returns, the line survives the
process (crash, Ctrl-C, kill). A line cut short (power loss, full disk) can only be the last
one: reading skips it and the next append starts on a fresh line. The other files are written
to a temporary name and renamed, so each is whole or absent.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import orjson

from ..capture._trajectory import Trajectory

Slot = tuple[int, int]
"""(position of the example in the step's batch, rollout number)."""


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _json_line(record: dict[str, Any]) -> bytes:
    """``record`` as one line of JSON. orjson (an ART dependency) is ~10x faster than the
    standard library but writes NaN and infinities as null: use it only when the line reads
    back exactly (a NaN metric, say, falls back to ``json``, which keeps it)."""
    try:
        line = orjson.dumps(record)
        if orjson.loads(line) == record:
            return line + b"\n"
    except TypeError:  # a type orjson does not take (an int beyond 64 bits, a non-str key)
        pass
    return json.dumps(record).encode() + b"\n"


class Journal:
    def __init__(self, output_dir: Path) -> None:
        self.root = output_dir / "journal"
        self.state_path = output_dir / "state.json"
        self._file: tuple[int, io.FileIO] | None = None

    def _step_dir(self, step: int) -> Path:
        return self.root / f"step-{step:05d}"

    def rollouts_path(self, step: int) -> Path:
        return self._step_dir(step) / "rollouts.jsonl"

    def record(self, step: int, slot: Slot, trajectory: Trajectory) -> None:
        """Append one finished rollout (``finished(step)`` made the folder). The step's file
        stays open for the next one, until :meth:`close`."""
        if self._file is None or self._file[0] != step:
            self.close()
            self._file = step, open(self.rollouts_path(step), "ab", buffering=0)  # noqa: SIM115
        file = self._file[1]
        line = _json_line({"slot": list(slot), "trajectory": trajectory.to_dict()})
        written = file.write(line)  # unbuffered: one write(2), which returns once it is in
        while written < len(line):  # a regular file takes it whole unless the disk is full
            written += file.write(line[written:])

    def close(self) -> None:
        if self._file is not None:
            self._file[1].close()
            self._file = None

    def finished(self, step: int) -> dict[Slot, Trajectory]:
        """The rollouts of ``step`` already on disk (and its folder, made ready for more)."""
        self.close()
        self._step_dir(step).mkdir(parents=True, exist_ok=True)
        path = self.rollouts_path(step)
        if not path.exists():
            return {}
        data = path.read_bytes()
        whole = data.rfind(b"\n") + 1
        if whole < len(data):  # a line cut short: drop it, so appends start on a new line
            os.truncate(path, whole)
        out: dict[Slot, Trajectory] = {}
        for line in data[:whole].splitlines():
            record = json.loads(line)
            position, rollout = record["slot"]
            out[position, rollout] = Trajectory.from_dict(record["trajectory"])
        return out

    def mark_shipped(self, step: int, summary: dict[str, Any]) -> None:
        directory = self._step_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / "shipped.json", summary)

    def shipped(self, step: int) -> bool:
        return (self._step_dir(step) / "shipped.json").exists()

    def load_state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    def save_state(self, state: dict[str, Any]) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.state_path, state)
