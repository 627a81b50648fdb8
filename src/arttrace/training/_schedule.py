"""Which examples each step runs, and which of its groups ship (the curriculum)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ._curriculum import Curriculum

if TYPE_CHECKING:
    import art  # only for types: the Trainer imports ART in the background (_art_import)


class Schedule[ExampleT]:
    """Batches and epochs over ``dataset``: each epoch is a fresh shuffle seeded by ``seed``
    and the epoch number, from a private ``random.Random`` (the global one is never touched)."""

    def __init__(
        self,
        dataset: Sequence[ExampleT],
        *,
        groups_per_step: int,
        seed: int,
        example_id: Callable[[ExampleT], str] | None = None,
        curriculum: Curriculum | None = None,
    ) -> None:
        self.dataset = dataset
        self.groups_per_step, self.seed = groups_per_step, seed
        self._example_id, self.curriculum = example_id, curriculum

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.dataset) / self.groups_per_step)

    def batch(self, step: int) -> tuple[int, list[int]]:
        """``(epoch, dataset indices)`` of ``step``."""
        epoch, position = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.dataset)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        start = position * self.groups_per_step
        return epoch, order[start : start + self.groups_per_step]

    def example_id(self, example: ExampleT, index: int, split: str) -> str:
        """``example_id(example)`` if given, else the example's ``"id"`` key, else
        ``<split>-<index>``."""
        if self._example_id is not None:
            return str(self._example_id(example))
        if isinstance(example, Mapping) and "id" in example:
            return str(example["id"])
        return f"{split}-{index}"

    def start_epoch(self, epoch: int) -> None:
        """Let the curriculum widen when ``epoch`` begins."""
        if self.curriculum is not None:
            self.curriculum.advance(epoch)

    def select(
        self, groups: list[art.TrajectoryGroup]
    ) -> tuple[list[art.TrajectoryGroup], list[art.TrajectoryGroup]]:
        """``(shipped, excluded by the curriculum)``."""
        return self.curriculum.select(groups) if self.curriculum else (groups, [])
