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
from ..capture._continuity import check_warn_rate

_log = logging.getLogger("arttrace")


@dataclass(frozen=True)
class TrainerConfig:
    """Every setting of a :class:`~arttrace.Trainer` that is a value, not a collaborator (the
    model, backend, rollout, datasets, reward functions, executor, curriculum, tokenizer),
    validated here once, when the Trainer is built. Grouped as the Trainer's arguments are;
    see its docstring for what each one does."""

    # batching: what a step runs and what it ships
    group_size: int = 8
    groups_per_step: int = 8
    seed: int = 0
    min_reward_spread: float = 0.0
    learning_rate: float = 5e-6
    train_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # execution
    max_concurrency: int = 32
    max_steps_off_policy: int = 0
    # failure handling
    max_exceptions: int | float = 0.25
    rollout_timeout: float | None = None
    train_timeout: float | None = None
    train_retries: int = 3
    retry_delay: float = 1.0
    # output
    output_dir: Path = Path("runs/train")
    resume: bool = False
    log_to_model: bool = True
    progress: bool = True
    # diagnostics
    continuity_warn_rate: float = 0.05

    def __post_init__(self) -> None:
        for name in ("group_size", "groups_per_step", "max_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        off_policy = self.max_steps_off_policy
        if isinstance(off_policy, bool) or not (isinstance(off_policy, int) and off_policy >= 0):
            raise ConfigurationError(
                "max_steps_off_policy must be an int >= 0 (0: synchronous steps), got "
                f"{off_policy!r}"
            )
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
        object.__setattr__(self, "continuity_warn_rate", check_warn_rate(self.continuity_warn_rate))
        object.__setattr__(self, "train_kwargs", _train_kwargs(self.train_kwargs))
        if self.group_size < 2:
            _log.warning("group_size=1: a group of one run has no reward spread to learn from")

    def allowed_exceptions(self, runs: int) -> int:
        """How many of a step's ``runs`` may raise before the step fails."""
        if isinstance(self.max_exceptions, int):
            return self.max_exceptions
        return math.floor(self.max_exceptions * runs)


def _train_kwargs(train_kwargs: object) -> dict[str, Any]:
    """``train_kwargs`` as a dict of its own (the caller's mapping may change later)."""
    if not isinstance(train_kwargs, Mapping) or not all(isinstance(k, str) for k in train_kwargs):
        raise ConfigurationError(
            "train_kwargs must be a mapping of backend.train's keyword arguments, such as "
            f"{{'kl_penalty_coef': 0.1}}, got {train_kwargs!r}"
        )
    if "learning_rate" in train_kwargs:
        raise ConfigurationError(
            "learning_rate is the Trainer's own argument: pass Trainer(learning_rate=...), "
            "not train_kwargs={'learning_rate': ...}"
        )
    return dict(train_kwargs)


def check_train_kwargs(backend: object, train_kwargs: Mapping[str, Any]) -> None:
    """Refuse, at construction, a name in ``train_kwargs`` that ``backend.train`` does not
    take (a typo such as ``kl_penalty_coeff`` would otherwise reach the backend at the first
    ship, after a whole step of rollouts), naming the closest valid one. A ``train`` that takes
    ``**kwargs`` (``DryRunBackend``) takes any name."""
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
        return
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p.name for p in parameters][:2]  # the model and the groups
    accepted = {p.name for p in parameters if p.kind in keyword} - {*positional}
    for name in train_kwargs:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(
                f"train_kwargs holds {name!r}{hint}, which {type(backend).__name__}.train() "
                "does not accept: fix the name, or drop it"
            )


def unexpected_keyword(name: str, trainer: inspect.Signature) -> TypeError:
    """The error for a keyword the Trainer does not take: the closest parameter, else where
    ``backend.train``'s keywords go (they were once the Trainer's own)."""
    names = [p.name for p in trainer.parameters.values() if p.kind is not p.VAR_KEYWORD]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return TypeError(
            f"Trainer() got an unexpected keyword argument {name!r} (did you mean {close[0]!r}?)"
        )
    return TypeError(
        f"Trainer() got an unexpected keyword argument {name!r}: a keyword argument of "
        f"backend.train goes in train_kwargs, as in Trainer(..., train_kwargs={{{name!r}: ...}})"
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
