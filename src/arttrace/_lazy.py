"""Names a module loads on first use, and old spellings it still answers for one release,
written once for every package's ``__init__``::

    __getattr__, __dir__ = lazy(__name__, {"Trainer": "._trainer"}, deprecated={"Old": "New"})

A lazy name imports its home module (relative to the package) when it is first read, so ART,
torch, starlette and Ray load only for the names that need them. A deprecated name gives the
current one (``"New"`` in the same module, or a full path such as ``"arttrace.New"``), with a
``DeprecationWarning`` at the line that read it.
"""

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy(
    module: str,
    homes: Mapping[str, str],
    *,
    deprecated: Mapping[str, str] | None = None,
    shown: Callable[[Any], Any] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``module``'s ``__getattr__`` and ``__dir__``: ``homes`` maps a name to the module that
    defines it (``"._trainer"``), ``deprecated`` an old name to its current one, ``shown`` is
    applied to each value loaded (the root's re-homing of ``__module__``)."""
    renamed = {
        old: new if "." in new else f"{module}.{new}" for old, new in (deprecated or {}).items()
    }

    def __getattr__(name: str) -> Any:
        if name in renamed:
            warnings.warn(
                f"{module}.{name} is deprecated and will be removed in the next release: "
                f"use {renamed[name]}",
                DeprecationWarning,
                stacklevel=2,
            )
            path, _, new = renamed[name].rpartition(".")
            return getattr(importlib.import_module(path), new)
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, module), name)
        return value if shown is None else shown(value)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module]), *homes})

    return __getattr__, __dir__
