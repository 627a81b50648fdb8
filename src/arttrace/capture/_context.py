"""What a call needs to know when it starts: the current trajectory and ``@trainable`` scopes
(context variables), and the settings of :func:`arttrace.instrument` (process-wide)."""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace

if TYPE_CHECKING:
    from ._calls import Settings
    from ._trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class TrainableScope:
    name: str
    model: str | None = None

    def accepts(self, model: str) -> bool:
        return self.model is None or self.model == model


current_trajectory_var: ContextVar[Trajectory | None] = ContextVar(
    "arttrace_trajectory", default=None
)
trainable_scopes: ContextVar[tuple[TrainableScope, ...]] = ContextVar(
    "arttrace_trainable_scopes", default=()
)
open_runs: weakref.WeakSet[Trajectory] = weakref.WeakSet()
"""The runs whose ``with`` block is open, in any thread: a thread still calling for an ended
run while others are open is likely a shared worker (``_threads``)."""
capturing: ContextVar[bool] = ContextVar("arttrace_capturing", default=False)
"""Set while a captured call runs, so nested wrappers (a wrapped client under the global
patch, ``with_raw_response`` over ``create``) record it once."""


def policy_scope(model: str) -> TrainableScope | None:
    """The innermost ``@trainable`` scope that makes a call to ``model`` a policy turn."""
    for scope in reversed(trainable_scopes.get()):
        if scope.accepts(model):
            return scope
    return None


def recording() -> bool:
    """Whether anything would keep a record made here: a trajectory, or a tracer provider the
    user configured (without either, capture is skipped)."""
    return current_trajectory_var.get() is not None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


_shim: Settings | None = None


def shim_settings() -> Settings | None:
    """The settings of :func:`arttrace.instrument`, or ``None`` when it is off."""
    return _shim


def set_shim_settings(settings: Settings | None) -> None:
    global _shim
    _shim = settings


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"})
_recording_servers: set[int] = set()
"""Ports of this process's servers that record their own calls (an ``arttrace.Gateway``):
an HTTP client in this process calling one is not recorded a second time below it."""


def add_recording_server(port: int) -> None:
    _recording_servers.add(port)


def remove_recording_server(port: int) -> None:
    _recording_servers.discard(port)


def records_itself(host: str | None, port: int | None) -> bool:
    """Whether a request to ``host:port`` reaches a server of this process that records it."""
    return port in _recording_servers and (host or "").strip("[]") in _LOOPBACK
