"""The reward plot: train reward per step (mean, min-max band), validation, curriculum."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def reward_plot(path: Path, steps: list[dict[str, Any]], validations: list[dict[str, Any]]) -> None:
    """Draw ``metrics.jsonl``-style step records and validation records to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    if steps:
        x = [s["step"] for s in steps]
        ax.fill_between(
            x,
            [s["reward_min"] for s in steps],
            [s["reward_max"] for s in steps],
            color="tab:blue",
            alpha=0.15,
            label="train min-max",
        )
        ax.plot(x, [s["reward_mean"] for s in steps], "o-", color="tab:blue", label="train mean")
    if validations:
        ax.plot(
            [v["step"] for v in validations],
            [v["reward_mean"] for v in validations],
            "s--",
            color="tab:red",
            label="validation mean",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    curriculum = [s for s in steps if s.get("curriculum_percentile") is not None]
    if curriculum:
        twin = ax.twinx()
        twin.step(
            [s["step"] for s in curriculum],
            [100 * s["curriculum_percentile"] for s in curriculum],
            where="post",
            color="tab:green",
            alpha=0.7,
            label="curriculum %",
        )
        twin.set_ylim(0, 105)
        twin.set_ylabel("curriculum (% of groups shipped)")
        for before, after in itertools.pairwise(curriculum):
            if after["curriculum_percentile"] > before["curriculum_percentile"]:
                ax.axvline(after["step"], color="tab:green", linestyle=":", alpha=0.6)
        handles, labels = ax.get_legend_handles_labels()
        extra_handles, extra_labels = twin.get_legend_handles_labels()
        ax.legend(handles + extra_handles, labels + extra_labels, loc="lower right")
    elif steps or validations:
        ax.legend(loc="lower right")
    ax.set_title("arttrace training reward")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
