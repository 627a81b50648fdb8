"""What a call needs to know when it starts: the current trajectory and ``@trainable`` scopes
(context variables), and the settings of :func:`arttrace.instrument` (process-wide).

The layers above capture register here and capture only reads: an ``arttrace.Gateway``
its port (:func:`add_recording_server`), translation its httpx ``send``
(:func:`set_send_hooks`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from .._errors import ConfigurationError

if TYPE_CHECKING:
    from ._calls import Settings
    from ._trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class TrainableScope:
    name: str
    model: str | None = None
    policy: str | None = None
    """The policy its turns belong to, when the function names one (``@trainable(policy=...)``):
    recorded on each call (``LLMCall.policy``), where two roles share one model name."""

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


class sending:
    """``with sending(failed):`` around the send of a call being recorded: ``capturing`` is
    set while it runs (the layers below pass it through), and an exception it raises is told
    to ``failed(error, partial=False)`` (``None``: to no one) before it propagates."""

    __slots__ = ("_failed", "_token")

    def __init__(self, failed: Callable[..., object] | None) -> None:
        self._failed = failed

    def __enter__(self) -> None:
        self._token = capturing.set(True)

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        try:
            if error is not None and self._failed is not None:
                self._failed(error, partial=False)
        finally:
            capturing.reset(self._token)


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


TRANSLATABLE = ("responses", "messages")
"""The protocols arttrace translates into Chat Completions, by the last segment of their path
(``/v1/responses``, ``/v1/messages``): ``instrument(translate=...)``, ``trajectory(...,
translate=...)``, ``arttrace.Gateway(translate=...)``."""


def translate_names(value: str | Iterable[str]) -> frozenset[str]:
    """``value`` (``"responses,messages"``, a list of names) as a set of protocol names; a name
    arttrace does not translate is a :class:`ConfigurationError` saying which names are."""
    names = value.split(",") if isinstance(value, str) else list(value)
    chosen = frozenset(str(n).strip().lower() for n in names if str(n).strip())
    unknown = sorted(chosen - set(TRANSLATABLE))
    if unknown:
        raise ConfigurationError(
            f"translate: arttrace cannot translate {', '.join(map(repr, unknown))}; it "
            f"translates {' and '.join(map(repr, TRANSLATABLE))} (the Responses API and "
            "Anthropic Messages) into Chat Completions"
        )
    return chosen


runs_translate = False
"""Whether a run chose its own protocols (``trajectory(..., translate=...)``): from then on,
until :func:`arttrace.uninstrument`, translation looks at the current run on every send."""
SendHook = Callable[[Any, Any, Any, dict[str, Any]], Any]
"""``hook(wrapped, instance, args, kwargs)`` of an httpx ``send``: the answer of a call the
layer above takes over (translation sends it as Chat Completions), else ``None``."""
send_hooks: tuple[SendHook, SendHook] | None = None
"""The sync and async send hooks, registered by translation while it may translate."""


def set_send_hooks(hooks: tuple[SendHook, SendHook] | None) -> None:
    global send_hooks
    send_hooks = hooks


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
