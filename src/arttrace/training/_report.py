"""What a run tells its user: ``metrics.jsonl``, progress bar, reward plot, ``model.log``."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm as text_bar

from .._journal import append_line, private_dir, read_lines
from ..capture import _context
from ..capture._trajectory import Trajectory
from ..capture._warnings import fix_for, warn_every_time
from ._plot import reward_plot
from ._policy import Policy, policy_names, policy_view

if TYPE_CHECKING:
    from ._art_import import TrainerModel

_log = logging.getLogger("arttrace")
PLOT_INTERVAL = 30.0
"""Seconds between two redraws of the reward plot (~0.15 s of CPU each) after steps."""


@functools.cache
def bar_class() -> Any:
    """tqdm's widget bar in a Jupyter kernel with ipywidgets (the notebook extra), else its
    text bar (which a notebook shows too). ``tqdm.auto`` decides the same way, but without
    ipywidgets it warns on import (``TqdmWarning: IProgress not found``) about something
    the user need not fix. Decided when the first bar is drawn, not on import."""
    shell = sys.modules.get("IPython")
    if "ipykernel.zmqshell" not in sys.modules or shell is None:
        return text_bar  # a terminal, IPython in one, or a plain script
    # Qt console and Spyder run a kernel but draw no widgets (tqdm.autonotebook's test)
    kind = type(shell.get_ipython()).__name__.lower()
    console = any(k == "QT_API" or k.startswith("SPYDER") for k in os.environ)
    if console or "qt" in kind or "spyder" in kind:
        return text_bar
    try:
        from tqdm import notebook
    except Exception:  # a broken IPython install: the text bar still works
        return text_bar
    return text_bar if notebook.IProgress is None else notebook.tqdm


class Progress:
    """A progress bar over a step's runs, showing the running mean reward."""

    def __init__(self, desc: str, pending: int, done: list[float | None], *, enabled: bool) -> None:
        """``pending`` runs to go; ``done``: the rewards of the runs already finished."""
        rewards = [r for r in done if r is not None]
        self._total, self._count = sum(rewards), len(rewards)
        self._unshown, self._show_at = 0, 0.0
        self._enabled = enabled
        self._bar = bar_class()(
            total=pending + len(done),
            initial=len(done),
            desc=desc,
            unit="run",
            disable=not enabled,
            leave=False,
        )

    def update(self, reward: float | None) -> None:
        if reward is not None:
            self._total, self._count = self._total + reward, self._count + 1
        if not self._enabled:
            return
        self._unshown += 1
        now = time.monotonic()
        if now < self._show_at:  # tqdm redraws at most every 0.1 s: tell it no more often
            return
        self._show_at = now + 0.1
        shown, self._unshown = self._unshown, 0
        if self._bar.update(shown):  # it redrew: show the mean from now on
            self._bar.set_postfix(reward=f"{self._total / max(self._count, 1):.3f}", refresh=False)

    def close(self) -> None:
        if self._unshown:
            self._bar.update(self._unshown)
        self._bar.close()


class Reporter:
    """Writes ``metrics.jsonl`` / ``validation.jsonl`` in ``output_dir``, sends metrics to
    ``model.log`` and redraws ``reward_plot.png`` at most every :data:`PLOT_INTERVAL` seconds,
    in the background so that the next step starts at once (see :meth:`flush`)."""

    def __init__(
        self,
        output_dir: Path,
        model: TrainerModel,
        policies: Sequence[Policy] | None = None,
        *,
        log_to_model: bool,
        progress: bool,
    ) -> None:
        self.output_dir, self.model, self.policies = output_dir, model, policies
        self.log_to_model, self.progress = log_to_model, progress
        self._model_log_failed = False
        self._unrecorded: set[tuple[str, str]] = set()
        """(metric, type) pairs a backend returned that were not numbers, already warned of."""
        self._reporting: asyncio.Future[None] | None = None
        self._plotted_at, self._plot_stale = -math.inf, False

    def bar(self, split: str, step: int, pending: int, done: list[float | None]) -> Progress:
        return Progress(f"{split} step {step}", pending, done, enabled=self.progress)

    def append(self, name: str, record: dict[str, Any]) -> None:
        """One line in ``name``, synced (a torn last line left by a crash is cut off first)."""
        append_line(private_dir(self.output_dir) / name, record)

    def read(self, name: str) -> list[dict[str, Any]]:
        """The records of ``name``; a damaged line is a ``JournalError`` naming it."""
        return [record for _, record in read_lines(self.output_dir / name)]

    def train_metrics(self, step: int, metrics: Mapping[Any, Any]) -> dict[str, float]:
        """``backend.train``'s metrics as ``train/<name>`` floats. A backend may return
        anything in ``TrainResult.metrics``: numbers of any kind (numpy scalars, one-element
        tensors, numeric strings) are kept, nested dicts flattened (``train/a/b``); the rest
        (``None``, text, lists) is left out with one warning per metric and type. The step
        trained, so it must be recorded as shipped whatever the backend reports."""
        kept: dict[str, float] = {}
        dropped: list[tuple[str, Any]] = []
        _flatten(metrics, "train/", kept, dropped)
        new = [(name, v) for name, v in dropped if (name, type(v).__name__) not in self._unrecorded]
        if new:
            self._unrecorded.update((name, type(v).__name__) for name, v in new)
            shown = ", ".join(f"{name} ({type(v).__name__}: {v!r:.40})" for name, v in new)
            warn_every_time(
                f"arttrace: step {step}: backend.train returned metrics that are not numbers: "
                f"{shown}. They are left out of metrics.jsonl and model.log (the step is "
                "recorded as shipped; these are not reported again). Have the backend return "
                "numbers in TrainResult.metrics",
                UserWarning,
            )
        return kept

    async def report(self, metrics: dict[str, float], step: int, split: str) -> None:
        """Send the metrics to ``model.log`` (ART's history and, with ``WANDB_API_KEY`` set,
        W&B) and redraw the reward plot if the last drawing is ``PLOT_INTERVAL`` old, in the
        background. The trajectories themselves are in the journal. With ``progress``, one
        line on stderr says what the step (or validation) did."""
        if self.progress:
            bar_class().write(progress_line(metrics, split), file=sys.stderr)
        await self.flush()
        now = time.monotonic()
        plot = now - self._plotted_at >= PLOT_INTERVAL
        self._plot_stale = not plot
        if plot:
            self._plotted_at = now
        self._reporting = asyncio.ensure_future(self._write(metrics, step, split, plot))

    async def flush(self) -> None:
        """Wait for the last report's ``model.log`` and plot."""
        if self._reporting is not None:
            reporting, self._reporting = self._reporting, None
            if reporting.get_loop() is asyncio.get_running_loop():
                await reporting
            else:  # the event loop it ran on has closed (asyncio.run per step) and cancelled it
                self._plot_stale = True

    async def finish(self) -> None:
        """Flush, and redraw the plot if a step came after its last drawing."""
        await self.flush()
        if self._plot_stale:
            self._plot_stale = False
            await self._plot()

    async def _plot(self) -> None:
        path = self.output_dir / "reward_plot.png"
        records = (self.read("metrics.jsonl"), self.read("validation.jsonl"))
        try:
            await asyncio.to_thread(reward_plot, path, *records)
        except Exception as error:  # a plot must not stop training
            _log.warning("could not draw %s: %r", path, error)

    async def _write(self, metrics: dict[str, float], step: int, split: str, plot: bool) -> None:
        if plot:
            await self._plot()
        if not self.log_to_model or self._model_log_failed:
            return
        try:
            model = await self.model.get()
        except Exception:  # no model yet: the step that ships raises the cause, once
            return
        logs = [(model, metrics)]
        if self.policies is not None:  # each model its own figures, unprefixed
            logs = [(p.model, policy_view(metrics, p.key)) for p in self.policies]
        try:
            for model, figures in logs:
                await model.log(split=split, metrics=figures, step=step)
        except Exception as error:  # logging must not stop training
            self._model_log_failed = True
            _log.warning(
                "model.log failed (%r); metrics stay in %s. Pass log_to_model=False to skip it.",
                error,
                self.output_dir / "metrics.jsonl",
            )


def _flatten(
    metrics: Mapping[Any, Any],
    prefix: str,
    kept: dict[str, float],
    dropped: list[tuple[str, Any]],
) -> None:
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _flatten(value, name + "/", kept, dropped)
        elif (number := _number(value)) is None:
            dropped.append((name, value))
        else:
            kept[name] = number


def _number(value: Any) -> float | None:
    """``value`` as a float (NaN and infinities included), or ``None`` if it is no number."""
    if isinstance(value, bytes | bytearray | complex) or value is None:
        return None
    try:
        if not isinstance(value, str) and callable(getattr(value, "item", None)):
            value = value.item()  # numpy scalars and arrays, torch tensors: one element only
        return float(value)
    except Exception:  # no number, or a tensor of many: left out, with a warning
        return None


def progress_line(metrics: dict[str, float], split: str) -> str:
    """What a step or a validation did, in one line: its rewards; what shipped, and why a
    group did not (a step that ships nothing says so); the loss when the backend reports one."""
    step, reward, raised = int(metrics["step"]), metrics["reward_mean"], metrics["exceptions"]
    policies = policy_names(metrics)
    if split != "train":
        line = f"{split} step {step}: reward {reward:.3f} over {int(metrics['examples'])} runs"
        line += "".join(f"; {p} {metrics[f'{p}/reward_mean']:.3f}" for p in policies)
        return line + (f" ({int(raised)} raised)" if raised else "")
    kept, total, dropped = (
        int(metrics[k]) for k in ("groups_kept", "groups_total", "groups_dropped")
    )
    judge_failed = int(metrics.get("groups_judge_failed", 0))  # dropped: no run left to ship
    flat = dropped - judge_failed
    line = (
        f"train step {step}: reward {reward:.3f} ({metrics['reward_min']:.2f}-"
        f"{metrics['reward_max']:.2f}) over {int(metrics['trajectories_scored'])} runs; "
    )
    if kept == 0 and flat == total:
        groups = "the group is" if total == 1 else f"all {total} groups are"
        line += f"nothing shipped: {groups} flat (each group's runs scored the same), so the "
        line += "step teaches nothing"
    else:
        why = [
            f"{int(n)} {name}"
            for n, name in (
                (flat, "flat"),
                (judge_failed, "whose group reward failed"),
                (metrics.get("groups_excluded_by_curriculum", 0), "left out by the curriculum"),
                (metrics.get("groups_without_trainable_tokens", 0), "with no trainable token"),
            )
            if n
        ]
        line += f"{kept} of {total} groups shipped" + (f" ({', '.join(why)})" if why else "")
        line += f", {int(metrics['trainable_tokens'])} tokens" if kept else ""
    if "train/loss" in metrics:
        line += f"; loss {metrics['train/loss']:.4g}"
    for p in policies:
        line += f"; {p}: reward {metrics[f'{p}/reward_mean']:.3f}"
        if f"{p}/groups_kept" in metrics:
            line += f", {int(metrics[f'{p}/groups_kept'])} groups"
        if f"{p}/train/loss" in metrics:
            line += f", loss {metrics[f'{p}/train/loss']:.4g}"
    if raised:
        line += f"; {int(raised)} runs raised"
    seconds = metrics["rollout_seconds"], metrics["train_seconds"]
    return line + "; {:.1f} s rollouts, {:.1f} s training".format(*seconds)


def reward_stats(rewards: list[float]) -> dict[str, float]:
    """Mean, min, max and standard deviation (all NaN when there is no reward), the same
    whatever order ``rewards`` come in."""
    if not rewards:
        return {
            "reward_mean": math.nan,
            "reward_min": math.nan,
            "reward_max": math.nan,
            "reward_std": math.nan,
        }
    # fsum is exact, so the figures do not depend on the order the runs finished in.
    mean = math.fsum(rewards) / len(rewards)
    return {
        "reward_mean": mean,
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "reward_std": math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)),
    }


def untrainable_cause(runs: Iterable[Trajectory], policy_name: str | None = None) -> str:
    """Why these runs hold no trainable token (of ``policy_name``, one of several): the most
    common cause among their runs and policy turns, how often, and its fix (the text of the
    capture's own warnings)."""
    causes: Counter[str] = Counter()
    for run in runs:
        calls = run.calls
        policy = [c for c in calls if c.trainable]
        if policy_name is not None:
            policy = [c for c in policy if c.policy == policy_name]
        if not calls:
            causes[
                "arttrace.instrument() was not called"
                if _context.shim_settings() is None
                else "no LLM call was seen"
            ] += 1
        elif not policy and policy_name is not None:
            causes[
                f"the run made no policy turn of {policy_name!r} (no call inside @trainable "
                "sent to its model, or named for it with @trainable(policy=...)); a run in "
                "which a role does not act teaches that role nothing"
            ] += 1
        elif not policy:
            causes["its LLM calls ran outside every @trainable function"] += 1
        for call in policy:
            causes.update(
                reason for c in call.choices if (reason := call.untrainable_reason(c)) is not None
            )
    if not causes:
        return "no cause recorded (the runs' policy turns were dropped from their conversations)"
    (cause, count), total = causes.most_common(1)[0], causes.total()
    return f"most common cause ({count} of {total}): {cause}. {fix_for(cause)}".rstrip()
