"""Shipping a step's groups to the backend, exactly once.

``backend.train`` is called with a time limit (``train_timeout``) and retried, with backoff,
only on failures that retrying can fix: the connection failed or timed out, or the server
answered HTTP 429 or 5xx. Anything else (a ``TypeError`` from a misspelled keyword, a
``ValueError`` about the groups) fails the step at once, with its cause.

Before the first call the backend's step (``backend._get_step(model)``, part of ART's Backend
protocol) is recorded in the journal and synced (``shipping.json``). Whenever it is unclear
whether a call trained (a retry after a failure, or a resumed run that finds ``shipping.json``
without ``shipped.json`` because the last run was stopped during or just after training), the
backend is asked again: a step that moved on means the groups were trained, and they are not
shipped again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import TrainingError
from .._journal import Journal
from ._config import TrainerConfig

if TYPE_CHECKING:
    import art

_log = logging.getLogger("arttrace")


@functools.cache
def _transient() -> tuple[type[BaseException], ...]:
    """The failures worth retrying (imported when a call first fails: ``openai`` takes a
    second or two to import, and building a Trainer should not wait for it)."""
    import httpx
    import openai

    return (
        ConnectionError,  # refused, reset, broken pipe
        TimeoutError,
        httpx.TimeoutException,
        httpx.NetworkError,
        httpx.RemoteProtocolError,  # the server closed the connection mid-answer
        openai.APIConnectionError,  # ART's serverless client is an OpenAI client (timeouts too)
    )


def is_transient(error: BaseException) -> bool:
    """Worth retrying: a connection or timeout failure, or an HTTP 429 or 5xx answer; also
    when such a failure is the explicit cause (``raise ... from``) of ``error``."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, _transient()):
            return True
        status = getattr(cause, "status_code", None)  # openai.APIStatusError, art.ARTError
        if status is None:
            status = getattr(getattr(cause, "response", None), "status_code", None)  # httpx
        if isinstance(status, int) and (status == 429 or status >= 500):
            return True
        cause = cause.__cause__
    return False


async def backend_step(
    backend: art.Backend, model: art.TrainableModel[Any], timeout: float | None
) -> tuple[int | None, str]:
    """``(the backend's step for model, "")``, or ``(None, why it cannot say)``."""
    get_step = getattr(backend, "_get_step", None)
    if get_step is None:
        return None, f"{type(backend).__name__} has no _get_step (ART's Backend protocol)"
    try:
        async with asyncio.timeout(timeout):
            step = await get_step(model)
    except Exception as error:
        return None, f"_get_step raised {error!r}"
    if isinstance(step, bool) or not isinstance(step, int):
        return None, f"_get_step returned {step!r:.80}, not an int"
    return step, ""


async def ship(
    backend: art.Backend,
    model: art.TrainableModel[Any],
    step: int,
    groups: list[art.TrajectoryGroup],
    config: TrainerConfig,
    journal: Journal,
    policy: str | None = None,
) -> art.TrainResult | None:
    """``backend.train(model, groups, learning_rate=..., **train_kwargs)`` exactly once (see
    the module docstring). ``None`` when the backend had already trained these groups (an
    earlier call that failed late, or a run stopped after training them); a
    :class:`TrainingError` when the step cannot ship (the journal keeps its rollouts).
    ``policy``: the policy ``model`` is, when the Trainer has several (each ships on its
    own record)."""
    import art  # loaded: the step's groups are ART objects

    record = _Record(journal, step, policy)
    earlier = journal.shipping(step, policy)
    if earlier is None:
        before, _ = await backend_step(backend, model, config.train_timeout)
        journal.begin_shipping(step, before, policy)
    else:
        before = earlier["backend_step"]
        if await _trained_already(backend, model, record, before, earlier["failed"], config):
            return None
    retry = f"run again with resume=True to ship the step's groups ({journal.rollouts_path(step)})"
    failed: str | None = None
    for attempt in range(config.train_retries + 1):
        if failed and await _trained_already(backend, model, record, before, failed, config):
            return None
        limit = asyncio.timeout(config.train_timeout)
        try:
            async with limit:
                result = await backend.train(
                    model, groups, learning_rate=config.learning_rate, **config.train_kwargs
                )
        except Exception as error:
            if isinstance(error, TimeoutError) and limit.expired():
                record.failed(f"no answer in {config.train_timeout} s")
                raise TrainingError(
                    f"step {step}: backend.train did not return within train_timeout="
                    f"{config.train_timeout} s and was cancelled. The groups are kept: {retry} "
                    "(the backend is asked first whether it trained them), or raise "
                    "train_timeout if training takes longer"
                ) from None
            failed = repr(error)
            record.failed(failed)
            if getattr(model, "_backend", None) is None:
                raise TrainingError(
                    f"step {step}: the backend refused to train ({error!r}) and the model "
                    "was never registered: call `await model.register(backend)` before "
                    "training, then run again with resume=True (the rollouts are kept)"
                ) from error
            if not is_transient(error):
                raise TrainingError(
                    f"step {step}: backend.train raised {error!r}, which retrying cannot fix "
                    "(only connection failures, timeouts and HTTP 429/5xx are retried): fix "
                    f"its cause, then {retry}"
                ) from error
            if attempt == config.train_retries:
                raise TrainingError(
                    f"step {step}: the backend failed {attempt + 1} times ({error!r}); {retry} "
                    "without re-running them"
                ) from error
            delay = config.retry_delay * 2**attempt
            _log.warning(
                "step %d: backend.train failed (%r); retrying in %.1fs", step, error, delay
            )
            await asyncio.sleep(delay)
            continue
        if not isinstance(result, art.TrainResult) or not isinstance(result.metrics, dict):
            record.failed(f"returned {result!r:.200}")
            raise TrainingError(
                f"step {step}: backend.train returned {result!r:.200}, not an art.TrainResult "
                "with a dict of metrics (what ART's backends return), so whether it trained is "
                "unknown and the step is not recorded as shipped: check the backend, then "
                f"{retry} (the backend is asked first whether it trained them)"
            )
        return result
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _Record:
    """Where shipping ``step`` (to ``policy``'s model) is recorded in ``journal``."""

    journal: Journal
    step: int
    policy: str | None

    def failed(self, cause: str) -> None:
        self.journal.shipping_failed(self.step, cause, self.policy)


async def _trained_already(
    backend: art.Backend,
    model: art.TrainableModel[Any],
    record: _Record,
    before: int | None,
    failed: str | None,
    config: TrainerConfig,
) -> bool:
    """Whether an earlier call for ``step`` trained: the backend's step moved on from
    ``before``. ``failed``: how the last call failed (``None``: it never returned, the run
    was stopped). When the backend cannot say, a step whose last call failed ships again;
    one whose call never returned is a :class:`TrainingError` (training twice would be
    silent)."""
    step = record.step
    now, why = await backend_step(backend, model, config.train_timeout)
    if before is not None and now is not None:
        if now > before:
            _log.warning(
                "step %d: the backend is at step %d, past step %d recorded before shipping: "
                "the last call (%s) trained these groups; they are not shipped again",
                step,
                now,
                before,
                f"failed with {failed}" if failed else "stopped before it returned",
            )
            return True
        return False
    if failed is not None:
        return False
    path = record.journal.shipping_path(step, record.policy)
    done = "shipped.json" if record.policy is None else f"trained-{record.policy}.json"
    raise TrainingError(
        f"step {step} was being shipped when the last run stopped, and the backend cannot say "
        f"whether it trained it ({why or 'its step was not recorded before shipping'}). If it "
        f"did not, delete {path} and run again; if it did, rename that file to {done} and "
        "run again"
    )
