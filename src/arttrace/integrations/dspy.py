"""DSPy: its calls are recorded below it (the HTTP-client layer sees its default engine, the
shim its ``openai/`` route); this hook only notices when DSPy's cache answers a call inside a
run, so a run that recorded nothing because of it is warned about by that cause and its fix
(``dspy.LM(..., cache=False)``) instead of a list of guesses."""

from __future__ import annotations

from typing import Any

import wrapt
from dspy.clients.cache import Cache  # type: ignore[import-untyped]

from ..capture import _context
from ..capture._guard import guarded
from ..capture._unwrap import mark, unwrap

__all__ = ["install", "uninstall"]

FRAMEWORK = "dspy"


@mark
def _get(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    answer = wrapped(*args, **kwargs)
    if answer is not None:
        with guarded("noting an answer from DSPy's cache"):
            trajectory = _context.current_trajectory_var.get()
            if trajectory is not None:
                trajectory.call_log.cache_answered = "DSPy's"
    return answer


def install() -> None:
    """Called by ``arttrace.instrument()`` once ``dspy`` is imported."""
    uninstall()
    wrapt.wrap_function_wrapper(Cache, "get", _get)


def uninstall() -> None:
    """Called by ``arttrace.uninstrument()``."""
    unwrap(Cache, "get")
