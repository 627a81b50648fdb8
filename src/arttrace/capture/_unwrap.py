"""Installing and removing arttrace's ``wrapt`` wrappers without disturbing anyone else's.

Another library (an APM agent, ART's own capture) may wrap the same method before or after
arttrace. Removing arttrace's wrapper must keep theirs: it is spliced out of the chain where it
sits; where it cannot be (an outer wrapper that is not ``wrapt``'s), it stays, inert, since every
arttrace wrapper reads its settings at each call and passes through when they are off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import wrapt

_F = TypeVar("_F", bound=Callable[..., Any])
_PROXY: type[Any] = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
"""What every ``wrapt`` wrapper is: since wrapt 2, ``FunctionWrapper`` derives from
``BaseObjectProxy``, not from ``ObjectProxy``."""


def mark(wrapper: _F) -> _F:
    """Mark ``wrapper`` (a ``wrapt`` wrapper function) as arttrace's."""
    wrapper._arttrace = True  # type: ignore[attr-defined]
    return wrapper


def ours(value: object) -> bool:
    """Whether ``value`` is a ``wrapt`` function wrapper installed by arttrace."""
    return isinstance(value, wrapt.FunctionWrapper) and bool(
        getattr(value._self_wrapper, "_arttrace", False)
    )


def unwrap(owner: Any, name: str) -> None:
    """Remove arttrace's wrapper from ``owner.name``, wherever it sits in a chain of wrappers."""
    current = owner.__dict__.get(name)
    if ours(current):
        setattr(owner, name, current.__wrapped__)
        return
    outer = current
    while isinstance(outer, _PROXY):
        inner = outer.__wrapped__
        if ours(inner):
            outer.__wrapped__ = inner.__wrapped__
            return
        outer = inner
