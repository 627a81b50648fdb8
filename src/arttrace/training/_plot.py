"""The reward plot: train reward per step (mean, min-max band), validation, curriculum."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

TITLE = "arttrace training reward"


def reward_plot(
    path: Path,
    steps: list[dict[str, Any]],
    validations: list[dict[str, Any]],
    *,
    title: str = TITLE,
) -> None:
    """Draw ``metrics.jsonl``-style step records and validation records to ``path`` (PNG).

    Validation points are labelled with their mean, and the title says how validation moved
    from the first to the last, so the plot reads without the files. ``title`` names the run
    (the demo puts its task and backend there). Uses matplotlib's object API (no pyplot
    state), so it may run in a worker thread.
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
        vx = [v["step"] for v in validations]
        vy = [v["reward_mean"] for v in validations]
        ax.plot(vx, vy, "s", color="tab:red", markersize=8, label="validation mean")
        for x_, y_ in zip(vx, vy, strict=True):
            ax.annotate(
                f"{y_:.2f}",
                (x_, y_),
                textcoords="offset points",
                xytext=(0, 9),
                ha="center",
                color="tab:red",
                fontweight="bold",
            )
    ax.set_xlabel("step (a validation at n: after n steps)")
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
    ymin, ymax = ax.get_ylim()
    ax.set_ylim(ymin, ymax + 0.08 * (ymax - ymin))  # room for the validation labels
    moved = (
        f"validation {validations[0]['reward_mean']:.2f} → {validations[-1]['reward_mean']:.2f}"
        if len(validations) > 1
        else ""
    )
    ax.set_title("\n".join(t for t in (title, moved) if t), fontsize=11)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)
