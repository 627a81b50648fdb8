"""The Trainer's settings, validated once when the Trainer is built."""

from __future__ import annotations

import difflib
import inspect
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError

_log = logging.getLogger("arttrace")


@dataclass(frozen=True)
class TrainerConfig:
    """Every setting of a :class:`~arttrace.Trainer` that is not a collaborator (model,
    backend, rollout, datasets); see the Trainer's docstring for what each one does."""

    group_size: int = 8
    groups_per_step: int = 8
    max_concurrency: int = 32
    learning_rate: float = 5e-6
    min_reward_spread: float = 0.0
    max_exceptions: int | float = 0.25
    output_dir: Path = Path("runs/train")
    seed: int = 0
    train_retries: int = 3
    retry_delay: float = 1.0
    train_timeout: float | None = None
    rollout_timeout: float | None = None
    log_to_model: bool = True
    progress: bool = True
    train_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_step", "max_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        if self.train_timeout is not None and not self.train_timeout > 0:
            raise ConfigurationError(
                f"train_timeout must be a positive number of seconds or None (no limit), "
                f"got {self.train_timeout!r}"
            )
        timeout = self.rollout_timeout
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(
                "rollout_timeout must be a positive number of seconds (how long one run may "
                f"take) or None (no limit), got {timeout!r}"
            )
        if self.group_size < 2:
            _log.warning("group_size=1: a group of one run has no reward spread to learn from")

    def allowed_exceptions(self, runs: int) -> int:
        """How many of a step's ``runs`` may raise before the step fails."""
        if isinstance(self.max_exceptions, int):
            return self.max_exceptions
        return math.floor(self.max_exceptions * runs)


ART_TRAIN_KEYWORDS = frozenset(
    {
        "adam_params",
        "advantage_balance",
        "allow_training_without_logprobs",
        "epsilon",
        "epsilon_high",
        "final_training_step",
        "grad_accumulation_sequences",
        "importance_sampling_level",
        "kimi_k2_tau",
        "kl_penalty_coef",
        "kl_penalty_reference_step",
        "kl_penalty_source",
        "kl_penalty_step_lag",
        "kl_ref_adapter_path",
        "learning_rate",
        "logprob_calculation_chunk_size",
        "loss_fn",
        "loss_fn_config",
        "mask_prob_ratio",
        "max_negative_advantage_importance_sampling_weight",
        "normalize_advantages",
        "num_trajectories_learning_rate_multiplier_power",
        "optimizer_save_interval",
        "packed_sequence_length",
        "plot_tensors",
        "ppo",
        "precalculate_logprobs",
        "save_checkpoint",
        "scale_learning_rate_by_reward_std_dev",
        "scale_rewards",
        "truncated_importance_sampling",
        "verbose",
    }
)
"""The keyword arguments of ``train`` on ART 0.5.23's backends (``LocalBackend``,
``ServerlessBackend``, the Tinker and Megatron backends): what a backend whose ``train`` takes
``**kwargs`` is checked against."""


def check_train_kwargs(
    backend: object, train_kwargs: dict[str, Any], trainer_parameters: Iterable[str]
) -> None:
    """Refuse, at construction, a keyword that neither the Trainer nor ``backend.train``
    takes (a typo such as ``groups_per_stp`` would otherwise reach the backend at the first
    ship, after a whole step of rollouts), naming the closest valid one."""
    train = getattr(backend, "train", None)
    if not callable(train):
        raise ConfigurationError(
            f"backend {type(backend).__name__} has no train method: pass an ART backend "
            "(art.local.LocalBackend(), art.ServerlessBackend(...), arttrace.DryRunBackend())"
        )
    try:
        parameters = inspect.signature(train).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        accepted, takers = ART_TRAIN_KEYWORDS, "ART's backends' train()"
    else:
        keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = [p.name for p in parameters][:2]  # the model and the groups
        accepted = frozenset(p.name for p in parameters if p.kind in keyword) - {*positional}
        takers = f"{type(backend).__name__}.train()"
    for name in train_kwargs:
        if name in accepted:
            continue
        valid = sorted({*trainer_parameters, *accepted} - {"train_kwargs"})
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigurationError(
            f"Trainer got an unknown keyword argument {name!r}{hint}: it is neither a Trainer "
            f"parameter nor a keyword argument {takers} accepts, so it cannot be passed on to "
            "backend.train. Fix the name, or drop it."
        )


def read_dataset[T](examples: Iterable[T], name: str) -> list[T]:
    """``examples`` as a list, read once (a generator is consumed here, not at each epoch)."""
    if isinstance(examples, str | bytes | Mapping):
        raise ConfigurationError(
            f"{name} must be an iterable of examples (a list, say), got "
            f"{type(examples).__name__}: wrap a single example in a list"
        )
    try:
        return list(examples)
    except TypeError as error:
        raise ConfigurationError(
            f"{name} must be an iterable of examples (a list, say), got "
            f"{type(examples).__name__} ({error})"
        ) from None
