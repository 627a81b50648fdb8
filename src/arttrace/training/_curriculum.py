"""Curriculum: train first on the groups a model already half-solves, then widen.

The NeMo Agent Toolkit harness's percentile expansion, with its state saved and plotted: each
step's groups (those with learning signal) are ranked by mean reward, easiest first (or
hardest first), and only the top ``percentile`` of them is shipped. The percentile starts at
``initial_percentile`` and grows by ``increment_percentile`` every ``expansion_interval``
epochs, up to 1. The harness's ``min_reward_diff`` is ``Trainer(min_reward_spread=...)``,
which applies with or without a curriculum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError

if TYPE_CHECKING:
    import art  # only for types: the Trainer imports ART in the background (_art_import)


@dataclass
class Curriculum:
    initial_percentile: float = 0.3
    increment_percentile: float = 0.2
    expansion_interval: int = 5
    """Epochs between two expansions (the first one after this many epochs)."""
    hard_first: bool = False
    """Rank hardest (lowest mean reward) first instead of easiest first."""
    percentile: float = field(init=False)
    last_expansion_epoch: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        for name in ("initial_percentile", "increment_percentile"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigurationError(f"Curriculum.{name} must be in (0, 1], got {value!r}")
        if self.expansion_interval < 1:
            raise ConfigurationError(
                f"Curriculum.expansion_interval must be at least 1, got {self.expansion_interval!r}"
            )
        self.percentile = self.initial_percentile

    def advance(self, epoch: int) -> None:
        """Widen the percentile if ``expansion_interval`` epochs passed since the last time."""
        if self.percentile < 1 and epoch - self.last_expansion_epoch >= self.expansion_interval:
            self.percentile = min(1.0, self.percentile + self.increment_percentile)
            self.last_expansion_epoch = epoch

    def select(
        self, groups: list[art.TrajectoryGroup]
    ) -> tuple[list[art.TrajectoryGroup], list[art.TrajectoryGroup]]:
        """``(kept, excluded)``: the first ``percentile`` of ``groups`` by difficulty."""
        if not groups:
            return [], []
        ranked = sorted(groups, key=_mean_reward, reverse=not self.hard_first)
        keep = max(1, math.ceil(len(ranked) * self.percentile - 1e-9))
        return ranked[:keep], ranked[keep:]

    def state(self) -> dict[str, Any]:
        return {
            "percentile": self.percentile,
            "last_expansion_epoch": self.last_expansion_epoch,
            "initial_percentile": self.initial_percentile,
            "increment_percentile": self.increment_percentile,
            "expansion_interval": self.expansion_interval,
            "hard_first": self.hard_first,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.percentile = float(state["percentile"])
        self.last_expansion_epoch = int(state["last_expansion_epoch"])


def _mean_reward(group: art.TrajectoryGroup) -> float:
    rewards = [t.reward for t in group.trajectories]
    return math.fsum(rewards) / len(rewards) if rewards else 0.0  # exact: order-free
