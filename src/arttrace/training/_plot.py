"""The reward plot: train reward per step (mean, min-max band), validation, curriculum."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def reward_plot(path: Path, steps: list[dict[str, Any]], validations: list[dict[str, Any]]) -> None:
    """Draw ``metrics.jsonl``-style step records and validation records to ``path`` (PNG).

    Uses matplotlib's object API (no pyplot state), so it may run in a worker thread.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
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
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:
        ax.legend(handles, labels, loc="lower right")
    ax.set_title("arttrace training reward")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
