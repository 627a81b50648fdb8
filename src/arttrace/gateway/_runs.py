"""The gateway's runs: each is one :class:`~arttrace.Trajectory` reached through its own URL.

A run is attached to a trajectory of this process (:meth:`arttrace.Gateway.url`), or opened
over HTTP (``POST /runs``, for agents started by another process: ``arttrace gateway``). Runs
opened over HTTP are closed over HTTP too, and each closed run is appended to the training
journal (``journal/step-NNNNN/rollouts.jsonl``), the format the ``Trainer`` resumes from.

The HTTP API (JSON in, JSON out)::

    POST /runs                 {"example_id": "q-1", "metadata": {...}, "step": 0,
                                "translate": ["responses"]}  (optional)
                               -> 201 {"run_id", "url", "example_id", "step", "slot"}
    GET  /runs/{id}            -> {"run_id", "url", "example_id", "calls", "in_flight",
                                   "trainable_turns", "reward", "policy_rewards" (if set)}
    PUT  /runs/{id}/reward     {"reward": 1.0, "metrics": {...}}  (or {"reward": {policy: r}})
    POST /runs/{id}/close      {"reward": 1.0}  (optional)  -> the run's summary
"""

from __future__ import annotations

import contextvars
import secrets
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._errors import ConfigurationError
from .._journal import Journal
from ..capture import _context
from ..capture._calls import Settings
from ..capture._context import TrainableScope
from ..capture._redact import remember_headers
from ..capture._trajectory import Trajectory, check_policy_rewards, check_reward
from ..capture._wire import Recorder, open_recorder, training_body


@dataclass(slots=True)
class RunOptions:
    """What the gateway does with a run's calls (per run; defaults from the gateway).

    ``agent``: the policy's name on its calls (as ``@trainable(name=...)``). ``model``: only
    calls to this model are policy turns (others are context). ``request_training_data``: ask
    the upstream for ``logprobs`` and ``return_token_ids`` when the caller did not set them.
    ``translate``: the protocols (``"responses"``, ``"messages"``) whose calls are served
    through the upstream's Chat Completions (``docs/translation.md``).
    """

    agent: str = "gateway"
    model: str | None = None
    request_training_data: bool = True
    export_tokens: bool = False
    translate: frozenset[str] = frozenset()

    @property
    def scope(self) -> TrainableScope:
        return TrainableScope(self.agent, self.model)


@dataclass(slots=True, eq=False)
class Run:
    id: str
    trajectory: Trajectory
    options: RunOptions
    otel: Context | None = None
    """The OpenTelemetry context the run's calls start in (its trajectory's span)."""
    opened: contextvars.Context | None = None
    """For a run opened over HTTP: the context its trajectory was entered in."""
    step: int = 0
    slot: tuple[int, int] = (0, 0)
    disconnected: int = 0
    """Calls whose caller hung up before their answer ended (while sending the request, or
    mid-answer): counted as the caller's doing, not as failures of the gateway or upstream."""

    def hung_up(self) -> None:
        """A call's caller hung up before its answer ended."""
        self.disconnected += 1

    def body_to_send(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` for the upstream: on a policy call, asking for the exact tokens (unless the
        run's options say not to). The run's scope decides, as :meth:`open_recorder`'s
        context does, without entering it: this is on the caller's way."""
        options = self.options
        if options.request_training_data and options.scope.accepts(str(body.get("model", ""))):
            return training_body(path, body)
        return body

    def open_recorder(
        self, path: str, sent: dict[str, Any], server: Any, headers: Mapping[str, str]
    ) -> Recorder:
        """The record of a call to ``path`` in this run (its trajectory, its policy scope, its
        span), made with ``sent``, the body from :meth:`body_to_send`, and the caller's
        ``headers``, whose keys are blanked out of the record."""
        remember_headers(headers)
        trajectory = _context.current_trajectory_var.set(self.trajectory)
        scopes = _context.trainable_scopes.set((self.options.scope,))
        attached = otel_context.attach(self.otel) if self.otel is not None else None
        try:
            settings = Settings(False, self.options.export_tokens)  # asked for in `sent`
            return open_recorder(path, sent, settings, server, source="gateway")[0]
        finally:
            if attached is not None:
                otel_context.detach(attached)
            _context.trainable_scopes.reset(scopes)
            _context.current_trajectory_var.reset(trajectory)

    def summary(self, url: str) -> dict[str, Any]:
        t = self.trajectory
        return {
            "run_id": self.id,
            "url": url,
            "example_id": t.example_id,
            "calls": len(t.call_log.records),
            "in_flight": t.call_log.in_flight,
            "trainable_turns": t.trainable_turns,
            "disconnected": self.disconnected,
            "reward": t.reward,
            **({"policy_rewards": t.policy_rewards} if t.policy_rewards else {}),
        }


class Runs:
    """The open runs of one gateway, by id (shared by the caller's threads and the server's)."""

    def __init__(self, url: Callable[[str], str], out: Path | None) -> None:
        self.url = url
        self.out = out
        self._runs: dict[str, Run] = {}
        self._by_trajectory: weakref.WeakKeyDictionary[Trajectory, Run] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._attached = 0
        self._journal: Journal | None = None
        self._slots: dict[int, _StepSlots] = {}
        self.id_prefix = ""
        """Starts every run id: a worker of ``arttrace gateway --workers`` names itself there,
        so a request for the run that lands on another worker is handed to this one."""

    # -- runs of this process --------------------------------------------------------------

    def attach(self, trajectory: Trajectory, options: RunOptions) -> Run:
        """The run of ``trajectory`` (the same one each time it is asked for)."""
        if trajectory.ended_at is not None:
            raise ConfigurationError(
                f"trajectory {trajectory.example_id!r} has ended: ask for a run's URL inside "
                "its `with arttrace.trajectory(...)` block"
            )
        current = _context.current_trajectory_var.get() is trajectory
        with self._lock:
            run = self._by_trajectory.get(trajectory)
            if run is None:
                self._attached += 1
                if self._attached > len(self._runs) // 2 + 64:  # amortised O(1) per run
                    self._attached = 0
                    self._forget_ended()
                run = Run(self.id_prefix + _new_id(), trajectory, options)
                self._runs[run.id] = self._by_trajectory[trajectory] = run
                trajectory.call_log.gateway = True  # it says so if no policy turn comes
            if run.otel is None and current:  # its calls become children of its span
                run.otel = otel_context.get_current()
            return run

    def _forget_ended(self) -> None:
        for run_id in [i for i, r in self._runs.items() if _ended(r)]:
            del self._runs[run_id]

    def get(self, run_id: str) -> Run | None:
        """The open run ``run_id``, or ``None`` (never opened, closed, or its trajectory ended)."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and _ended(run):
                del self._runs[run_id]
                return None
            return run

    # -- runs opened over HTTP -------------------------------------------------------------

    def open(self, body: dict[str, Any], options: RunOptions) -> Run:
        if self.out is None:
            raise _Refused(
                409,
                "this gateway keeps no journal, so it cannot open runs over HTTP: start it with "
                "an output directory (`arttrace gateway --out DIR`, or Gateway(out=...)), or "
                "give it your own trajectories with gateway.url(trajectory)",
            )
        example_id = body.get("example_id")
        if not isinstance(example_id, str | int) or isinstance(example_id, bool):
            raise ConfigurationError(
                f'"example_id" must be a string or an integer, got {example_id!r}'
            )
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ConfigurationError(f'"metadata" must be a JSON object, got {metadata!r}')
        step = body.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigurationError(f'"step" must be an integer >= 0, got {step!r}')
        trajectory = Trajectory(example_id, metadata)
        trajectory.call_log.gateway = True
        opened = contextvars.Context()
        opened.run(trajectory.__enter__)
        run = Run(
            self.id_prefix + _new_id(),
            trajectory,
            options,
            otel=opened.run(otel_context.get_current),
            opened=opened,
            step=step,
        )
        with self._lock:
            run.slot = self._step_slots(step).take(trajectory.example_id)
            self._runs[run.id] = run
        return run

    def close(self, run: Run) -> Path | None:
        """End ``run``'s trajectory and append it to the journal; returns the journal file
        (``None`` if the run was closed already)."""
        assert run.opened is not None and self.out is not None
        with self._lock:
            if self._runs.pop(run.id, None) is None:
                return None
        run.opened.run(run.trajectory.__exit__, None, None, None)
        journal = self.journal()
        journal.record(run.step, run.slot, run.trajectory)  # open() made the step's folder
        return journal.rollouts_path(run.step)

    def hold(self) -> None:
        """Take the run folder (its journal's lock: one writer at a time, a Trainer or a
        gateway)."""
        self.journal().lock.acquire()

    def journal(self) -> Journal:
        """The journal under ``out``."""
        if self._journal is None:
            assert self.out is not None
            self._journal = Journal(self.out)
        return self._journal

    def _step_slots(self, step: int) -> _StepSlots:
        """Slots of ``step``: example positions in order of first appearance, rollouts counted,
        continuing what the journal already holds for that step (a gateway restarted on it)."""
        slots = self._slots.get(step)
        if slots is None:
            finished = self.journal().finished(step)
            slots = self._slots[step] = _StepSlots({(s, t.example_id) for s, t in finished.items()})
        return slots

    def shutdown(self) -> None:
        """End the runs still open over HTTP (they are not journaled: nobody closed them)."""
        with self._lock:
            pending = [r for r in self._runs.values() if r.opened is not None]
            self._runs.clear()
        for run in pending:
            assert run.opened is not None
            run.opened.run(run.trajectory.__exit__, None, None, None)
        if self._journal is not None:
            self._journal.close()
            if self._journal.lock.held:
                self._journal.lock.release()


class _StepSlots:
    def __init__(self, taken: set[tuple[tuple[int, int], str]]) -> None:
        self.positions: dict[str, int] = {}
        self.counts: dict[int, int] = {}
        for (position, rollout), example_id in sorted(taken):
            self.positions.setdefault(example_id, position)
            self.counts[position] = max(self.counts.get(position, 0), rollout + 1)

    def take(self, example_id: str) -> tuple[int, int]:
        position = self.positions.setdefault(example_id, len(self.positions))
        rollout = self.counts.get(position, 0)
        self.counts[position] = rollout + 1
        return position, rollout


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _new_id() -> str:
    return secrets.token_urlsafe(12)  # unguessable: the URL is the run's capability


def _ended(run: Run) -> bool:
    return run.opened is None and run.trajectory.ended_at is not None


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An error in the OpenAI API's shape, which every OpenAI client shows to its user."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status
    )


def unknown_run(run_id: str) -> JSONResponse:
    return error(
        404,
        f"arttrace gateway: no open run {run_id!r}. A run's URL works from "
        "gateway.url(trajectory) (or POST /runs) until its trajectory ends (or POST "
        "/runs/{id}/close); ask for a new URL for each run",
        "not_found_error",
    )


# -- the HTTP API ---------------------------------------------------------------------------


class RunAPI:
    """Starlette endpoints for ``/runs``; ``options`` are the gateway's defaults."""

    def __init__(self, runs: Runs, options: RunOptions) -> None:
        self.runs, self.options = runs, options

    async def open(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        try:
            options = _options(body, self.options)
            run = self.runs.open(body, options)
        except ConfigurationError as e:
            return error(400, f"arttrace gateway: {e}")
        except _Refused as e:
            return error(e.status, f"arttrace gateway: {e}")
        return JSONResponse(
            {
                "run_id": run.id,
                "url": self.runs.url(run.id),
                "example_id": run.trajectory.example_id,
                "step": run.step,
                "slot": list(run.slot),
            },
            201,
        )

    async def show(self, request: Request) -> Response:
        run = self.runs.get(request.path_params["run_id"])
        if run is None:
            return unknown_run(request.path_params["run_id"])
        return JSONResponse(run.summary(self.runs.url(run.id)))

    async def reward(self, request: Request) -> Response:
        run = await self._settle(request, require_reward=True)
        if isinstance(run, Response):
            return run
        return JSONResponse(run.summary(self.runs.url(run.id)))

    async def close(self, request: Request) -> Response:
        run = await self._settle(request, require_reward=False)
        if isinstance(run, Response):
            return run
        path = self.runs.close(run)
        if path is None:  # a concurrent close got there first
            return unknown_run(run.id)
        summary = {**run.summary(self.runs.url(run.id)), "journal": str(path)}
        warnings = []
        if run.trajectory.reward is None:
            warnings.append(
                "the run was closed without a reward: it is journaled but will not train; "
                "set one with PUT /runs/{id}/reward or in the close request"
            )
        if not summary["trainable_turns"]:
            reached = summary["calls"] or run.trajectory.call_log.gateway_reached
            cause = "no call was a policy turn" if reached else "no call reached its URL"
            warnings.append(
                f"the run recorded no policy turn ({cause}), so it will not train: the gateway "
                "trains on Chat Completions and Responses calls to the run's URL (Anthropic "
                "Messages calls when the run translates them: translate=['messages'])"
            )
        if warnings:
            summary["warning"] = "; ".join(warnings)
        return JSONResponse(summary)

    async def _settle(self, request: Request, *, require_reward: bool) -> Run | Response:
        """The run of the request's path, its reward and metrics set from the body."""
        run_id = request.path_params["run_id"]
        run = self.runs.get(run_id)
        if run is None:
            return unknown_run(run_id)
        if run.opened is None:
            return error(
                409,
                f"arttrace gateway: run {run_id!r} belongs to a trajectory of the gateway's own "
                "process: set its reward and end it there",
                "conflict_error",
            )
        body = await _json_object(request, empty_ok=True)
        if isinstance(body, Response):
            return body
        try:
            _set_outcome(run.trajectory, body, require_reward=require_reward)
        except ConfigurationError as e:
            return error(400, f"arttrace gateway: {e}")
        return run


def _options(body: dict[str, Any], defaults: RunOptions) -> RunOptions:
    options = RunOptions(
        defaults.agent,
        defaults.model,
        defaults.request_training_data,
        defaults.export_tokens,
        defaults.translate,
    )
    if "translate" in body:
        from ..translation._registry import apis

        value = body["translate"]
        if not isinstance(value, str | list) or not all(isinstance(v, str) for v in value):
            raise ConfigurationError(
                f'"translate" must be a list of protocol names, like ["responses"], got {value!r}'
            )
        options.translate = apis(value)
    for name, kind in (("agent", str), ("model", str), ("request_training_data", bool)):
        if name in body:
            value = body[name]
            if not isinstance(value, kind) and not (name == "model" and value is None):
                raise ConfigurationError(f'"{name}" must be a {kind.__name__}, got {value!r}')
            setattr(options, name, value)
    return options


def _set_outcome(trajectory: Trajectory, body: dict[str, Any], *, require_reward: bool) -> None:
    if "reward" in body:
        reward = body["reward"]
        if isinstance(reward, dict):  # one per policy: {"planner": 1.0, "executor": 0.5}
            trajectory.policy_rewards = check_policy_rewards(reward)
        else:
            reward = check_reward(reward)
            trajectory.policy_rewards = {}
            trajectory.reward = reward
    elif require_reward:
        raise ConfigurationError('send {"reward": <number>}')
    metrics = body.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and isinstance(k, str) for k, v in metrics.items()
        ):
            raise ConfigurationError(f'"metrics" must map names to numbers, got {metrics!r}')
        trajectory.metrics.update(metrics)


async def _json_object(request: Request, empty_ok: bool = False) -> dict[str, Any] | Response:
    import json

    raw = await request.body()
    if not raw.strip() and empty_ok:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        return error(400, "arttrace gateway: the request body is not JSON")
    if not isinstance(body, dict):
        return error(400, "arttrace gateway: the request body must be a JSON object")
    return body
