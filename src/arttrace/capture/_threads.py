"""A run reaches the worker threads it starts.

asyncio tasks and ``asyncio.to_thread`` copy context variables; a ``threading.Thread``, a
``ThreadPoolExecutor.submit`` or a ``loop.run_in_executor`` do not, so a call made there would
belong to no run and be lost. While :func:`arttrace.instrument` is on, work started or
submitted inside a run carries the run and its ``@trainable`` scopes into its thread (as
OpenTelemetry's threading instrumentation carries the trace context), and only those: the
thread's other context variables are left as they were. Outside a run nothing is wrapped.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from . import _context

_on = False
_originals: dict[tuple[type, str], Any] = {}


def install() -> None:
    """Patch ``Thread.start`` and ``ThreadPoolExecutor.submit`` (once); idempotent."""
    global _on
    _on = True
    for owner, name, patched in _PATCHES:
        if (owner, name) not in _originals:  # else ours is still in place, maybe under another's
            _originals[(owner, name)] = owner.__dict__[name]
            setattr(owner, name, patched)


def uninstall() -> None:
    """Stop carrying runs; restore the methods where arttrace's patch is still the outermost
    (under another library's patch it stays, inert)."""
    global _on
    _on = False
    for owner, name, patched in _PATCHES:
        if owner.__dict__.get(name) is patched:
            setattr(owner, name, _originals.pop((owner, name)))


def _carried(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` running in the current run's context, or ``fn`` itself outside a run."""
    trajectory = _context.current_trajectory_var.get() if _on else None
    if trajectory is None:
        return fn
    scopes = _context.trainable_scopes.get()

    @functools.wraps(fn)
    def in_run(*args: Any, **kwargs: Any) -> Any:
        run = _context.current_trajectory_var.set(trajectory)
        scope = _context.trainable_scopes.set(scopes)
        try:
            return fn(*args, **kwargs)
        finally:
            _context.trainable_scopes.reset(scope)
            _context.current_trajectory_var.reset(run)

    return in_run


def _start(self: threading.Thread) -> None:
    run = self.run  # subclasses override run(): wrap this instance's, whatever it is
    carried = _carried(run)
    if carried is not run:
        self.run = carried  # type: ignore[method-assign]
    _originals[(threading.Thread, "start")](self)


def _submit(
    self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Future[Any]:
    result: Future[Any] = _originals[(ThreadPoolExecutor, "submit")](
        self, _carried(fn), *args, **kwargs
    )
    return result


_PATCHES: tuple[tuple[type, str, Any], ...] = (
    (threading.Thread, "start", _start),
    (ThreadPoolExecutor, "submit", _submit),
)
