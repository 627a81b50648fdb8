"""The training journal: every finished rollout is on disk before anything ships.

Layout under ``output_dir``::

    state.json                     steps completed, curriculum state
    journal/step-00003/0002-05.json   step 3, example 2 of the batch, rollout 5
    journal/step-00003/shipped.json   written once the step's groups were trained on

Every file is written to a temporary name and renamed, so a crash or Ctrl-C leaves each file
either whole or absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .trajectory import Trajectory

Slot = tuple[int, int]
"""(position of the example in the step's batch, rollout number)."""


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Journal:
    def __init__(self, output_dir: Path) -> None:
        self.root = output_dir / "journal"
        self.state_path = output_dir / "state.json"

    def _step_dir(self, step: int) -> Path:
        return self.root / f"step-{step:05d}"

    def record(self, step: int, slot: Slot, trajectory: Trajectory) -> None:
        path = self._step_dir(step) / f"{slot[0]:04d}-{slot[1]:02d}.json"
        write_json(path, trajectory.to_dict())

    def finished(self, step: int) -> dict[Slot, Trajectory]:
        """The rollouts of ``step`` already on disk (and its folder, made ready for more)."""
        directory = self._step_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        out: dict[Slot, Trajectory] = {}
        for path in sorted(directory.glob("[0-9]*-[0-9]*.json")):
            position, rollout = path.stem.split("-")
            out[int(position), int(rollout)] = Trajectory.from_dict(json.loads(path.read_text()))
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
