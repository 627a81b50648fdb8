"""A run reaches the work it hands to other threads, and only that work.

asyncio tasks and ``asyncio.to_thread`` copy context variables; a ``threading.Thread``, a
``ThreadPoolExecutor.submit`` or a ``loop.run_in_executor`` do not, so a call made there would
belong to no run and be lost. While :func:`arttrace.instrument` is on:

- each ``submit`` (so each ``run_in_executor``) carries the submitter's run and ``@trainable``
  scopes into its task, or explicitly no run, whatever worker thread runs it, as
  OpenTelemetry's threading instrumentation attaches the submitter's context per task. The
  pool's worker threads that ``submit`` starts carry no run of their own.
- a ``Thread`` started inside a run carries it for its whole life. Calls it makes after the
  run ended belong to no run, and a :class:`RunOutlivedWarning` says so once per cause (one
  for a thread that outlived its run, another when other runs are open: a shared worker, such
  as a queue consumer, started inside one run).

Only the run and the scopes are carried: the thread's other context variables are left as
they were. Where arttrace cannot know whose work a thread does (a queue), :func:`carry` hands
the run over explicitly; it needs no ``instrument()``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, NamedTuple, ParamSpec, TypeVar, cast

from .._errors import ConfigurationError
from . import _context
from ._guard import guarded
from ._warnings import warn_run_outlived

if TYPE_CHECKING:
    from ._calls import CallLog
    from ._context import TrainableScope
    from ._trajectory import Trajectory

P = ParamSpec("P")
R = TypeVar("R")

_on = False
_originals: dict[tuple[type, str], Any] = {}


class _Carried(NamedTuple):
    """What a thread or task takes from where it was started: the run (or ``None``, no run),
    the ``@trainable`` scopes, and how it got there (``"thread"`` or ``"task"``)."""

    trajectory: Trajectory | None
    scopes: tuple[TrainableScope, ...]
    how: str


_carried: ContextVar[_Carried | None] = ContextVar("arttrace_carried", default=None)
"""Set where arttrace carried a run into another thread: a call made there after that run ended
is reported with its cause (:func:`report_late_call`)."""
_submitting: ContextVar[bool] = ContextVar("arttrace_submitting", default=False)
"""Set while the pool's own ``submit`` runs: a thread it starts is the pool's worker, which
serves every later task, so it carries no run (each task carries its own)."""
_pending: dict[int, _Carried] = {}
"""Threads started inside a run and not yet running, by ``id``: the run their first step
enters. Keyed by ``id``, not the thread: a ``Thread`` subclass may be unhashable."""


def carry(fn: Callable[P, R], /) -> Callable[P, R]:
    """``fn`` bound to the run and ``@trainable`` scopes current here, wherever it is called.

    For work a long-lived thread does on behalf of whichever run hands it over (a queue
    consumer, a worker pool started before the runs): put ``carry(work)`` on the queue, and the
    LLM calls of ``work()`` record into the run that put it there, as policy turns if it was
    handed over inside ``@trainable`` code. Outside a run, ``fn`` is bound to no run. A
    coroutine function stays one (its coroutine runs in the run). Needs no
    :func:`arttrace.instrument`; work handed over after its run ended records nothing, and a
    :class:`~arttrace.RunOutlivedWarning` says so.
    """
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigurationError(
            f"carry() cannot bind the generator function {fn.__qualname__!r}: its body runs "
            "later, at each next(). Carry the function that iterates it instead."
        )
    return _bound(fn, _here("task"))


def install() -> None:
    """Patch ``Thread.start``, ``Thread._bootstrap`` and ``ThreadPoolExecutor.submit`` (once);
    idempotent."""
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


def report_late_call(log: CallLog) -> bool:
    """A call started or ended after the run of ``log`` ended: if arttrace carried that run
    into this thread, warn once per cause and say so (the run's log records nothing more
    either way)."""
    carried = _carried.get()
    if carried is None or carried.trajectory is None or carried.trajectory.call_log is not log:
        return False  # not carried here by arttrace (a leftover asyncio task): the log says so
    shared = carried.how == "thread" and len(_context.open_runs) > 0
    warn_run_outlived(log.name, "shared worker" if shared else carried.how)
    return True


def _here(how: str) -> _Carried:
    return _Carried(_context.current_trajectory_var.get(), _context.trainable_scopes.get(), how)


_Tokens = tuple[
    Token["Trajectory | None"], Token["tuple[TrainableScope, ...]"], Token["_Carried | None"]
]


def _enter(carried: _Carried) -> _Tokens:
    return (
        _context.current_trajectory_var.set(carried.trajectory),
        _context.trainable_scopes.set(carried.scopes),
        _carried.set(carried),
    )


def _leave(tokens: _Tokens) -> None:
    run, scopes, carried = tokens
    _carried.reset(carried)
    _context.trainable_scopes.reset(scopes)
    _context.current_trajectory_var.reset(run)


def _bound(fn: Callable[P, R], carried: _Carried) -> Callable[P, R]:
    """``fn`` running in ``carried``'s run and scopes (no run if it has none), then restoring
    the caller's; a failure of arttrace's here runs ``fn`` as it is."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def in_run_async(*args: Any, **kwargs: Any) -> Any:
            tokens = _entered(carried)
            try:
                return await fn(*args, **kwargs)
            finally:
                _left(tokens)

        return cast(Callable[P, R], in_run_async)

    @functools.wraps(fn)
    def in_run(*args: P.args, **kwargs: P.kwargs) -> R:
        tokens = _entered(carried)
        try:
            return fn(*args, **kwargs)
        finally:
            _left(tokens)

    return in_run


def _entered(carried: _Carried) -> _Tokens | None:
    with guarded("entering a run in another thread"):
        return _enter(carried)
    return None  # the guard caught a failure: the work runs without the run


def _left(tokens: _Tokens | None) -> None:
    if tokens is not None:
        with guarded("leaving a run in another thread"):
            _leave(tokens)


def _start(self: threading.Thread) -> None:
    key = None
    with guarded("carrying a run into a thread"):
        if _on and not _submitting.get():
            carried = _here("thread")
            if carried.trajectory is not None:
                key = id(self)
                _pending[key] = carried
    try:
        _originals[(threading.Thread, "start")](self)
    except BaseException:
        if key is not None:
            _pending.pop(key, None)
        raise


def _bootstrap(self: threading.Thread) -> None:
    """The new thread's first step (``Thread.run`` is left alone: a subclass may make it a
    read-only property): enter the run its ``start`` carried, then run as usual."""
    if _pending:
        with guarded("entering a run in a thread"):
            carried = _pending.pop(id(self), None)
            if carried is not None:
                context = getattr(self, "_context", None)  # 3.14+: run() runs in its own
                if isinstance(context, contextvars.Context):
                    context.run(_enter, carried)
                else:
                    _enter(carried)
    _originals[(threading.Thread, "_bootstrap")](self)


def _submit(
    self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Future[Any]:
    task = fn
    with guarded("carrying a run into submitted work"):
        if _on:
            task = _bound(fn, _here("task"))
    submitting = _submitting.set(True)
    try:
        result: Future[Any] = _originals[(ThreadPoolExecutor, "submit")](
            self, task, *args, **kwargs
        )
    finally:
        _submitting.reset(submitting)
    return result


_PATCHES: tuple[tuple[type, str, Any], ...] = (
    (threading.Thread, "start", _start),
    (threading.Thread, "_bootstrap", _bootstrap),
    (ThreadPoolExecutor, "submit", _submit),
)
