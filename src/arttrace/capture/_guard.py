"""Never break the host: a failure inside arttrace's own code is caught, logged once per place,
and marks what it concerns. It never reaches the caller's call, stream or warning filter.

Every layer (the OpenAI shim, the framework hooks) runs its capture code under :func:`guarded`,
the one form of this rule; what a failure means for a record is the ``on_error`` callback's to
say (usually: the call is marked as not captured whole, so it is not trained on).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

_log = logging.getLogger("arttrace")
_logged: set[str] = set()
_lock = threading.Lock()
_T = TypeVar("_T")


def guarded(where: str, on_error: Callable[[BaseException], object] | None = None) -> Guard:
    """Run the block; an ``Exception`` raised in it is logged (once per ``where``, with its
    traceback) and handed to ``on_error``, whose own failure is swallowed too. The manager
    holds no state of a run: it may be entered again (a stream reuses one for every chunk)."""
    return Guard(where, on_error)


class Guard:
    """:func:`guarded` as a plain context manager (a generator-based one costs several times
    more), and as :meth:`call`, the same rule for one function call at the cost of that call:
    the form a stream runs for every chunk."""

    __slots__ = ("on_error", "where")

    def __init__(self, where: str, on_error: Callable[[BaseException], object] | None) -> None:
        self.where, self.on_error = where, on_error

    def __enter__(self) -> None:
        return None

    def call(self, fn: Callable[[_T], object], arg: _T) -> None:
        """``fn(arg)``, guarded as the block of a ``with`` would be."""
        try:
            fn(arg)
        except Exception as error:
            self.failed(error)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if not isinstance(error, Exception):
            return False  # no error, or one that is not ours to stop (KeyboardInterrupt, ...)
        self.failed(error)
        return True

    def failed(self, error: Exception) -> None:
        """What the guard does with ``error`` raised in its block: log it, mark what failed."""
        report(self.where, error)
        if self.on_error is not None:
            try:
                self.on_error(error)
            except Exception as second:
                report(f"{self.where} (marking the failure)", second)


def report(where: str, error: BaseException) -> None:
    """Log an internal failure of arttrace: with its traceback the first time at ``where``,
    in one line after that."""
    with _lock:
        first = where not in _logged
        _logged.add(where)
    if first:
        _log.error(
            "arttrace failed in %s; the application is unaffected, the call is marked "
            "(please report this): %r",
            where,
            error,
            exc_info=error,
        )
    else:
        _log.debug("arttrace failed in %s again: %r", where, error)
