"""``DryRunBackend``: everything ART would train on, written to disk instead of trained.

Use it in place of a real backend to validate a setup on a machine without a GPU: each
``train()`` call writes the groups (``groups.jsonl``, in ART's JSON form) and a report (trainable
tokens per group, which groups carry learning signal, the training arguments received), in a
folder numbered as the Trainer's journal numbers the step (``step-00000`` for its first). Its
step (as ART counts it: steps trained) comes from the reports on disk, so a resumed run (a new
process) learns which steps were trained.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._journal import private_dir, write_json
from ..capture._records import jsonable

if TYPE_CHECKING:
    import art  # loaded when train() is called: building it must not wait for ART


class DryRunBackend:
    """An ART backend that trains nothing and reports what it was given."""

    def __init__(
        self, output_dir: str | Path = "runs/dry_run", inference_base_url: str = ""
    ) -> None:
        self.output_dir = Path(output_dir)
        self.inference_base_url = inference_base_url
        self._steps: dict[str, int] = {}

    async def register(self, model: Any) -> None:
        self._steps.setdefault(model.name, 0)

    async def _prepare_backend_for_training(
        self, model: Any, config: Any = None
    ) -> tuple[str, str]:
        return self.inference_base_url, "dry-run"

    def _model_inference_name(self, model: Any, step: int | None = None) -> str:
        return str(model.name)

    async def _get_step(self, model: Any) -> int:
        """The model's step, as ART counts it: how many steps were trained, in this process or
        by an earlier one (the report of step ``n`` on disk means ``n + 1`` were)."""
        on_disk = [
            int(number) + 1
            for report in (self.output_dir / model.name).glob("step-*/report.json")
            if (number := report.parent.name.removeprefix("step-")).isdigit()
        ]
        return max([self._steps.get(model.name, 0), *on_disk])

    async def _delete_checkpoint_files(self, model: Any, steps_to_keep: list[int]) -> None:
        return None

    async def close(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def exact_adapter_lease(self, model: Any, step: int) -> AsyncIterator[None]:
        yield  # there are no adapters to hold

    async def _train_sft(
        self, model: Any, trajectories: Any, config: Any, dev_config: Any, verbose: bool = False
    ) -> AsyncIterator[dict[str, float]]:
        raise NotImplementedError(
            "DryRunBackend checks reinforcement-learning steps (train) only; "
            "use a real ART backend for supervised fine-tuning"
        )
        yield {}  # an async generator, as ART's Backend protocol has it

    async def train(
        self, model: Any, trajectory_groups: Iterable[art.TrajectoryGroup], **kwargs: Any
    ) -> art.TrainResult:
        import art  # loaded by then: the groups are ART objects

        groups = list(trajectory_groups)
        trained = await self._get_step(model)  # numbered as the Trainer's journal numbers it
        directory = private_dir(self.output_dir / model.name / f"step-{trained:05d}")
        fd = os.open(directory / "groups.jsonl", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w") as f:  # it holds prompts: for the user only
            for group in groups:
                f.write(group.model_dump_json() + "\n")
        report = [_group_report(g) for g in groups]
        summary = {
            "step": trained,
            "groups": len(groups),
            "groups_with_signal": sum(r["has_signal"] for r in report),
            "groups_without_signal": sum(not r["has_signal"] for r in report),
            "trajectories": sum(r["trajectories"] for r in report),
            "trainable_tokens": sum(r["trainable_tokens"] for r in report),
            "train_kwargs": {k: jsonable(v) for k, v in kwargs.items()},
            "per_group": report,
        }
        write_json(directory / "report.json", summary)  # last: a step with a report trained
        self._steps[model.name] = trained + 1
        metrics = {k: float(summary[k]) for k in ("groups", "trajectories", "trainable_tokens")}
        return art.TrainResult(step=trained + 1, metrics=metrics)  # ART: the step after it


def _group_report(group: art.TrajectoryGroup) -> dict[str, Any]:
    from ..capture._art import trainable_tokens

    rewards = [t.reward for t in group.trajectories]
    tokens = [trainable_tokens(t) for t in group.trajectories]
    return {
        "example_id": group.trajectories[0].metadata.get("example_id") if rewards else None,
        "trajectories": len(rewards),
        "rewards": rewards,
        "has_signal": len(set(rewards)) > 1 and sum(tokens) > 0,
        "trainable_tokens": sum(tokens),
        "exceptions": len(group.exceptions),
    }
