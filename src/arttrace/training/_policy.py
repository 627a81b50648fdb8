"""The policies a Trainer trains: each an ART model, the turns it claims, where it trains.

A system of several models (a planner and an executor, a router and specialists) trains each
from the same runs, in the same step: a turn belongs to the policy whose model it was sent to
(``planner-001``, or ``planner-001@7`` as vLLM serves a step's LoRA), or to the one its
``@trainable(policy=...)`` function named. A turn no policy claims is context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from ..capture._records import policy_claims
from ..capture._trajectory import Trajectory

if TYPE_CHECKING:
    import art

__all__ = ["Policy"]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a model is neither
class Policy:
    """One model of the agent system, trained (or served frozen) by the Trainer.

    ``Trainer([Policy(planner), Policy(executor, frozen=True)], backend, rollout, ...)``.
    """

    model: art.TrainableModel[Any]
    """The ``art.TrainableModel``, registered with its backend (``await model.register(...)``)."""
    name: str | None = None
    """The policy's name in metrics (``<name>/reward_mean``), rewards and
    ``@trainable(policy=...)``; default: ``model.name``."""
    backend: art.Backend | None = None
    """Where it trains; default: the Trainer's ``backend``. Policies on different backends
    train concurrently, those sharing one in turn."""
    frozen: bool = False
    """Served, not trained: its turns are context in every policy's trajectory (train one
    role at a time, the others frozen)."""

    @property
    def key(self) -> str:
        return self.name or self.model.name

    def names(self) -> set[str]:
        """The names its turns go by: its own, its model's and the model's inference name
        (``policy_claims`` also takes ``<name>@<step>`` for each)."""
        names = {self.key, self.model.name}
        with contextlib.suppress(Exception):  # an unregistered model: its own name serves
            names.add(self.model.get_inference_name())
        return names

    def describe(self) -> dict[str, Any]:
        """What the run folder keeps of it (``state.json``'s settings)."""
        return {"name": self.key, "model": self.model.name, "frozen": self.frozen}


def policies_of(models: Sequence[Any]) -> list[Policy]:
    """The Trainer's ``model`` argument when it names several: models or :class:`Policy`s,
    with distinct names, at least one to train."""
    policies = [m if isinstance(m, Policy) else Policy(m) for m in models]
    if not policies:
        raise ConfigurationError("the Trainer was given no model: give it one, or a list")
    names = [p.key for p in policies]
    for name in names:
        if not name or "/" in name or name == "train":
            raise ConfigurationError(
                f"policy name {name!r} cannot name a policy's metrics (<name>/reward_mean): "
                "give it one without '/' that is not 'train', with Policy(model, name=...)"
            )
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigurationError(
            f"two policies are named {twice[0]!r}: give each its own model name or "
            "Policy(model, name=...)"
        )
    if all(p.frozen for p in policies):
        raise ConfigurationError(
            "every policy is frozen, so nothing would train: leave at least one unfrozen"
        )
    for p in policies:
        if callable(p.model) and not hasattr(p.model, "name"):
            raise ConfigurationError(
                f"policy {p.key!r}: several policies take models, not factories; build the "
                "model and `await model.register(backend)` before the Trainer"
            )
    return policies


def assign(run: Trajectory, policies: Sequence[Policy]) -> set[str]:
    """Record on each policy turn of ``run`` the policy that claims it (``LLMCall.policy``,
    journaled; the first in order); return what the turns no policy claims went by (the
    policy their ``@trainable`` named, else their model)."""
    names = [(p.key, p.names()) for p in policies]
    keys = {key for key, _ in names}
    unclaimed = set()
    for call in run.call_log.records:
        if not call.trainable:
            continue
        if call.policy is not None:
            if call.policy not in keys:
                unclaimed.add(f"policy {call.policy!r}")
            continue
        owner = next((key for key, claimed in names if policy_claims(claimed, call)), None)
        if owner is None:
            unclaimed.add(f"model {call.model!r}")
        else:
            call.policy = owner
    return unclaimed


def policy_names(metrics: Mapping[str, Any]) -> list[str]:
    """The policies a step or validation record has figures for (several policies only)."""
    return [
        k.removesuffix("/reward_mean")
        for k in metrics
        if k.endswith("/reward_mean") and k.count("/") == 1 and not k.startswith("train/")
    ]


def policy_view(metrics: Mapping[str, float], policy: str) -> dict[str, float]:
    """The step's figures as ``policy`` sees them: its own (``<policy>/...``) without the
    prefix, over the step's shared ones; the other policies' left out."""
    others = tuple(f"{p}/" for p in policy_names(metrics) if p != policy)
    prefix = f"{policy}/"
    shared = {k: v for k, v in metrics.items() if not k.startswith((prefix, *others))}
    return shared | {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
