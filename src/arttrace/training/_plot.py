"""The reward plot: train reward per step (mean, min-max band), validation, curriculum."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from ._policy import policy_names

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
    policies = policy_names(steps[-1] if steps else validations[-1] if validations else {})
    if policies:
        _policy_curves(ax, policies, steps, validations)
    elif steps:
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
    if validations and not policies:
        _validation(ax, validations, "reward_mean", "validation mean", "tab:red")
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
    moved = ""
    if len(validations) > 1:
        first, last = validations[0], validations[-1]
        series = [(f"{p} ", f"{p}/reward_mean") for p in policies] or [("", "reward_mean")]
        moved = "validation " + ", ".join(
            f"{who}{first[k]:.2f} → {last[k]:.2f}" for who, k in series if k in first and k in last
        )
    ax.set_title("\n".join(t for t in (title, moved) if t), fontsize=11)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    tmp.replace(path)


_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink")


def _policy_curves(
    ax: Any, policies: list[str], steps: list[dict[str, Any]], validations: list[dict[str, Any]]
) -> None:
    """One train curve and one validation series per policy, each in its own colour."""
    for policy, colour in zip(policies, itertools.cycle(_COLOURS), strict=False):
        key = f"{policy}/reward_mean"
        points = [(s["step"], s[key]) for s in steps if key in s]
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=colour, label=f"{policy} train mean")
        _validation(ax, [v for v in validations if key in v], key, f"{policy} validation", colour)


def _validation(
    ax: Any, validations: list[dict[str, Any]], key: str, label: str, colour: str
) -> None:
    """Validation points, each labelled with its value."""
    if not validations:
        return
    vx = [v["step"] for v in validations]
    vy = [v[key] for v in validations]
    ax.plot(vx, vy, "s", color=colour, markersize=8, label=label)
    for x_, y_ in zip(vx, vy, strict=True):
        ax.annotate(
            f"{y_:.2f}",
            (x_, y_),
            textcoords="offset points",
            xytext=(0, 9),
            ha="center",
            color=colour,
            fontweight="bold",
        )
