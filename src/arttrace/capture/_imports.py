"""Run code when a module is imported: how :func:`arttrace.instrument` patches the OpenAI SDK
and hooks frameworks without importing them itself (``import openai`` alone takes seconds)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(module)`` now if ``name`` is imported, else right after it is."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        hook(module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(hook)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of a hooked module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def __getattr__(self, name: str) -> object:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader (importlib.resources and friends read it).
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        with _lock:
            hooks = _hooks.pop(module.__name__, [])
        for hook in hooks:
            hook(module)
