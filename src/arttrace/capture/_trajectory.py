"""One run of one training example: the calls it made, its reward, and its ART form."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from contextvars import Token
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from opentelemetry import context as otel_context
from opentelemetry import trace

from .._errors import ConfigurationError, UsageError
from . import _context
from ._calls import CallLog
from ._conversations import Conversation, assemble, main_first
from ._guard import guarded
from ._layers import merge_layers
from ._records import LLMCall, PolicyMatcher, policy_claims
from ._redact import exception_attributes
from ._warnings import warn_nothing_to_train

if TYPE_CHECKING:
    import art

MetadataValue = str | int | float | bool | None
_tracer = trace.get_tracer("arttrace")


class Trajectory:
    """What one run of one example did. Use it through :func:`trajectory`.

    ``calls`` are every LLM call made inside the ``with`` block (in start order);
    ``reward``, ``metrics`` and ``metadata`` go to ART with them. An exception raised in the
    block is kept in ``exception`` and re-raised.
    """

    def __init__(self, example_id: str | int, metadata: dict[str, MetadataValue] | None = None):
        self.example_id = str(example_id)
        self.metadata: dict[str, MetadataValue] = dict(metadata or {})
        _check_metadata(self.metadata)
        self.metrics: dict[str, float | int | bool] = {}
        self.exception: dict[str, str] | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._reward: float | None = None
        self._policy_rewards: dict[str, float] = {}
        self.call_log = CallLog(self.example_id)
        """The calls in flight and ended; read them through :attr:`calls`."""
        self._scope: tuple[Token[Trajectory | None], object, Any] | None = None
        self._hosting = False
        """A run the Trainer opened: a ``trajectory()`` opened inside it is this run."""
        self._joined = 0
        """How many ``with`` blocks re-entered this hosting run and have not exited."""
        self.translate: frozenset[str] | None = None
        """The protocols this run's calls are translated from (``trajectory(...,
        translate=...)``; ``None``: as :func:`arttrace.instrument` says)."""

    # -- reward ----------------------------------------------------------------------------

    @property
    def reward(self) -> float | None:
        return self._reward

    @reward.setter
    def reward(self, value: float) -> None:
        self._reward = check_reward(value)

    @property
    def policy_rewards(self) -> dict[str, float]:
        """One reward per policy, for a system of several trained at once (empty: every
        policy's trajectory of this run gets :attr:`reward`). Setting it sets :attr:`reward`
        to the mean of its values, the run's reward in the step's statistics."""
        return dict(self._policy_rewards)

    @policy_rewards.setter
    def policy_rewards(self, value: Mapping[str, Any]) -> None:
        if not value and isinstance(value, Mapping):  # cleared: every policy gets `reward`
            self._policy_rewards = {}
            return
        rewards = check_policy_rewards(value)
        self._policy_rewards = rewards
        self._reward = math.fsum(rewards.values()) / len(rewards)

    def reward_for(self, policy: str) -> float | None:
        """The reward of ``policy``'s trajectory of this run: its own in
        :attr:`policy_rewards`, else the run's."""
        return self._policy_rewards.get(policy, self._reward)

    # -- the with block --------------------------------------------------------------------

    def __enter__(self) -> Self:
        if self._hosting and self._scope is not None:  # the rollout's own `with` block
            self._joined += 1
            return self
        if self._scope is not None or self.ended_at is not None:
            raise UsageError(f"trajectory {self.example_id!r} was already entered; open a new one")
        self.started_at = time.time()
        span = _tracer.start_span(
            f"trajectory {self.example_id}", attributes={"arttrace.example_id": self.example_id}
        )
        self._scope = (
            _context.current_trajectory_var.set(self),
            otel_context.attach(trace.set_span_in_context(span)),
            span,
        )
        _context.open_runs.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._scope is not None, "trajectory exited without being entered"
        if self._joined:
            self._joined -= 1  # the run goes on: the Trainer closes it
            return
        token, otel_token, span = self._scope
        self._scope = None
        _context.open_runs.discard(self)
        with guarded("ending a trajectory's calls"):
            self.call_log.freeze("the trajectory ended before the call finished")
        with guarded("checking that a run recorded a policy turn"):
            self._check_policy_recorded()
        if exc is not None:
            self.exception = {"type": type(exc).__qualname__, "message": "", "traceback": ""}
            with guarded("recording a trajectory's exception"):
                text = exception_attributes(exc)
                self.exception["message"] = text["exception.message"]
                self.exception["traceback"] = text["exception.stacktrace"]
                span.record_exception(exc, attributes=text)
        if self._reward is not None:
            span.set_attribute("arttrace.reward", self._reward)
        span.end()
        otel_context.detach(otel_token)  # type: ignore[arg-type]
        _context.current_trajectory_var.reset(token)
        self.ended_at = time.time()

    def _check_policy_recorded(self) -> None:
        """Never silent: a run whose policy code ran (or that has a gateway URL) but recorded no
        policy turn says why."""
        log = self.call_log
        if not (log.policy_ran or log.gateway) or any(c.trainable for c in log.records):
            return
        gateway = log.gateway and not log.policy_ran
        if gateway:
            cause = (
                "its gateway calls recorded no policy turn"
                if log.records or log.gateway_reached
                else "no call reached its gateway URL"
            )
        elif log.records:
            cause = "its LLM calls ran outside every @trainable function"
        elif _context.shim_settings() is None:
            cause = "arttrace.instrument() was not called"
        elif log.cache_answered is not None:
            cause = f"{log.cache_answered} cache answered"
        else:
            cause = "no LLM call was seen"
        warn_nothing_to_train(self.example_id, cause, gateway=gateway)

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- reading ---------------------------------------------------------------------------

    @property
    def calls(self) -> list[LLMCall]:
        """Every LLM call, in start order; a call both a framework and the OpenAI shim saw
        is one call (the layer merge, in ``arttrace.capture._layers``)."""
        return merge_layers(self.call_log.records)

    def conversations(self, policy: PolicyMatcher | None = None) -> list[Conversation]:
        """The calls assembled into conversations, the main one first: the agent's
        longest-running one, whose last turn is the run's answer
        (``arttrace.capture._conversations.main_first``). With ``policy``, as that policy
        sees them (:meth:`to_art`): only its turns are policy turns."""
        calls = self.calls
        if policy is not None:
            calls = [
                c if not c.trainable or policy_claims(policy, c) else replace(c, trainable=False)
                for c in calls
            ]
        return main_first(assemble(calls))

    @property
    def trainable_turns(self) -> int:
        return sum(c.trainable_turns for c in self.conversations())

    def to_art(
        self, tokenizer: Any = None, *, policy: PolicyMatcher | None = None
    ) -> art.Trajectory:
        """This run as an ``art.Trajectory``: the main conversation in ``messages_and_choices``,
        the others in ``additional_histories``, each trainable turn an OpenAI ``Choice``. Its
        metadata adds the run's token continuity (``continuity_*`` and ``art_sequences``, the
        sequences ART will train it as; ``docs/continuity.md``). ``tokenizer``: the model's,
        to tell the causes of breaks apart (else one is looked for on this machine).

        ``policy``: the trajectory of one policy of a system of several. Only the policy turns
        it claims are trainable Choices; every other policy turn is a context message, as a
        call outside ``@trainable`` is. It is a policy name or a collection of names, matching
        the name a call's ``@trainable(policy=...)`` gave it, else the model the call was sent
        to (``"planner-001"`` also claims ``"planner-001@7"``, the LoRA of a step as vLLM
        serves it); or a callable ``(LLMCall) -> bool``. Without it, every policy turn is
        trainable (one policy)."""
        if self._reward is None:
            raise ConfigurationError(
                f"trajectory {self.example_id!r} has no reward: set `t.reward = ...` "
                "(or `arttrace.current_trajectory().reward = ...`) before converting it"
            )
        from ._art import history, messages_and_choices  # ART loads on first use
        from ._continuity import continuity

        main, *others = self.conversations(policy) or [Conversation()]
        checked: dict[str, int] = {}
        with guarded("checking a run's token continuity"):
            checked = continuity([main, *others], tokenizer).metadata()
        logs = [] if self.exception is None else [self.exception["traceback"]]
        import art

        return art.Trajectory(
            messages_and_choices=messages_and_choices(main),
            tools=main.tools,  # type: ignore[arg-type]  # plain dicts of that TypedDict shape
            additional_histories=[history(c) for c in others],
            reward=self._reward,
            metrics=dict(self.metrics),
            metadata={**self.metadata, **checked, "example_id": self.example_id},
            logs=logs,
        )

    # -- saving ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "example_id": self.example_id,
            "reward": self._reward,
            **({"policy_rewards": self._policy_rewards} if self._policy_rewards else {}),
            "metrics": self.metrics,
            "metadata": self.metadata,
            "exception": self.exception,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "calls": [c.to_dict() for c in self.calls],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        t = cls(data["example_id"], data.get("metadata"))
        if data.get("reward") is not None:
            t.reward = data["reward"]
        if data.get("policy_rewards"):
            t._policy_rewards = check_policy_rewards(data["policy_rewards"])
        t.metrics = dict(data.get("metrics") or {})
        t.exception = data.get("exception")
        t.started_at, t.ended_at = data.get("started_at"), data.get("ended_at")
        t.call_log.records = [LLMCall.from_dict(c) for c in data.get("calls", [])]
        return t

    def save(self, path: str | Path) -> None:
        """Write this run as JSON; :meth:`load` gives it back, trainable turns and all.

        A new file is readable by its owner only (it holds prompts and answers)."""
        data = json.dumps(self.to_dict()).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as file:
            file.write(data)

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def __repr__(self) -> str:
        return (
            f"Trajectory(example_id={self.example_id!r}, calls={len(self.call_log.records)}, "
            f"reward={self._reward!r})"
        )


def trajectory(
    example_id: str | int,
    metadata: dict[str, MetadataValue] | None = None,
    *,
    translate: str | Iterable[str] | None = None,
) -> Trajectory:
    """Scope one run of one example: ``with trajectory("q-17") as t:`` (or ``async with``).

    Every LLM call made inside, in this thread or asyncio task and the tasks it starts, is
    recorded on ``t``. Calls made inside a ``@trainable`` function are the policy's turns; the
    others are kept as context.

    Inside a run the :class:`~arttrace.Trainer` started, this is that run (its ``metadata``
    added to the run's): code written as a stand-alone script, which opens its own
    trajectory and sets ``t.reward``, works unchanged as a rollout.

    ``translate``: protocols (``"responses"``, ``"messages"``) this run's calls are made in
    through Chat Completions, so every turn trains (``docs/translation.md``); ``()``: none,
    whatever :func:`arttrace.instrument` says; ``None``: as it says.
    """
    chosen = _translated(translate)
    current = _context.current_trajectory_var.get()
    if current is not None and current._hosting and current._scope is not None:
        extra = dict(metadata or {})
        _check_metadata(extra)
        current.metadata.update(extra)
        if chosen is not None:
            current.translate = chosen
        return current
    run = Trajectory(example_id, metadata)
    run.translate = chosen
    return run


def _translated(value: str | Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    chosen = _context.translate_names(value)
    _context.runs_translate = True
    return chosen


def hosting_trajectory(
    example_id: str | int, metadata: dict[str, MetadataValue] | None = None
) -> Trajectory:
    """A run opened by the Trainer: :func:`trajectory` called inside it returns it."""
    t = Trajectory(example_id, metadata)
    t._hosting = True
    return t


def current_trajectory() -> Trajectory:
    """The trajectory this code runs in; raises ``RuntimeError`` outside of one."""
    current = _context.current_trajectory_var.get()
    if current is None:
        raise UsageError(
            "no trajectory is active here: "
            "run this code inside `with arttrace.trajectory(example_id):`"
        )
    return current


def check_reward(value: Any) -> float:
    """``value`` as a finite float, or a ``ConfigurationError`` (a ``ValueError``) saying what
    was wrong.

    Any real number is a reward: ``int``, ``float``, ``Fraction``, ``Decimal``, numpy's and
    torch's scalars. A ``bool`` is not (``True`` for ``1.0`` is most likely a mistake), nor a
    complex number, a string, NaN or an infinity."""
    import numbers  # here, not at the top: this function is the one place that needs it

    dtype = str(getattr(value, "dtype", ""))  # numpy / torch scalars: "float32", "torch.bool"
    real = isinstance(value, numbers.Real) or (
        not isinstance(value, numbers.Complex | str | bytes)  # Decimal; 0-d arrays, tensors
        and hasattr(type(value), "__float__")
        and "bool" not in dtype
        and "complex" not in dtype
    )
    if isinstance(value, bool) or not real:
        fix = ": use 1.0 and 0.0 (float(...))" if "bool" in f"{type(value)} {dtype}" else ""
        raise ConfigurationError(
            f"reward must be a finite number (any real number), got "
            f"{type(value).__name__} {value!r:.80}{fix}"
        )
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError) as error:  # an array, Decimal("sNaN"), 10**400
        raise ConfigurationError(
            f"reward must be a finite number, got {type(value).__name__} {value!r:.80} ({error})"
        ) from None
    if not math.isfinite(reward):
        raise ConfigurationError(f"reward must be a finite number, got {value!r:.80}")
    return reward


def check_policy_rewards(value: Any) -> dict[str, float]:
    """``value`` as ``{policy name: reward}``, or a ``ConfigurationError`` saying what was
    wrong: a non-empty mapping of names to finite real numbers."""
    if not isinstance(value, Mapping) or not value:
        raise ConfigurationError(
            "policy rewards must be a non-empty mapping of policy names to rewards "
            f"({{'planner': 1.0, 'executor': 0.5}}), got {type(value).__name__} {value!r:.80}"
        )
    rewards = {}
    for name, reward in value.items():
        if not isinstance(name, str):
            raise ConfigurationError(
                f"policy rewards are keyed by policy name (a str), got {name!r:.40}"
            )
        try:
            rewards[name] = check_reward(reward)
        except ConfigurationError as error:
            raise ConfigurationError(f"the reward of policy {name!r}: {error}") from None
    return rewards


def _check_metadata(metadata: dict[str, Any]) -> None:
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool | type(None)):
            raise ConfigurationError(
                f"metadata[{key!r}] = {value!r}: ART accepts only str keys and "
                "str, int, float, bool or None values"
            )
