"""Run code when a module is imported: how :func:`arttrace.instrument` patches the OpenAI SDK
and hooks frameworks without importing them itself (``import openai`` alone takes seconds).

A hook runs once its module has loaded, but never inside an import of arttrace's own: when
``arttrace.capture._chat`` imports ``openai``, the hook that patches ``openai`` needs
``_chat`` whole, so hooks that fire while a module of arttrace is still loading in this thread
wait until the outermost one has loaded. Which modules the application imported first (``import
anthropic`` before arttrace, ``httpx2`` before ``httpx``) then changes nothing.

Each hook waits under a key, at most once: :func:`arttrace.instrument` called again adds
nothing, and :func:`forget` (``uninstrument()``) removes every waiting hook and the finder.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from types import ModuleType

Hook = Callable[[ModuleType], None]

_hooks: dict[str, dict[Hashable, Hook]] = {}
_lock = threading.Lock()
_OWN = __name__.partition(".")[0] + "."


class _Loading(threading.local):
    """This thread's imports of arttrace's own modules under way, and the hooks waiting for
    the outermost to finish."""

    depth = 0

    def __init__(self) -> None:
        self.waiting: list[tuple[Hook, ModuleType]] = []


_loading = _Loading()


def when_imported(name: str, hook: Hook, *, key: Hashable | None = None) -> None:
    """Call ``hook(module)`` now if ``name`` is imported, else right after it is. A hook with
    the same ``key`` (by default, the hook itself) already waiting for ``name`` is replaced."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        _run([hook], module)
        return
    with _lock:
        _hooks.setdefault(name, {})[hook if key is None else key] = hook
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())


def forget() -> None:
    """Drop every waiting hook and remove the finder (:func:`arttrace.uninstrument`)."""
    with _lock:
        _hooks.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def waiting() -> dict[str, int]:
    """How many hooks wait for each module (what ``uninstrument()`` must leave empty)."""
    with _lock:
        return {name: len(hooks) for name, hooks in _hooks.items()}


def _run(hooks: list[Hook], module: ModuleType) -> None:
    if _loading.depth:
        _loading.waiting.extend((hook, module) for hook in hooks)
        return
    for hook in hooks:
        hook(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of a hooked module, and of arttrace's
    own modules (to know when they have loaded)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _hooks and not fullname.startswith(_OWN):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
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
        if not module.__name__.startswith(_OWN):
            self.loader.exec_module(module)
            with _lock:
                hooks = list(_hooks.pop(module.__name__, {}).values())
            _run(hooks, module)
            return
        _loading.depth += 1
        try:
            self.loader.exec_module(module)
        finally:
            _loading.depth -= 1
            if not _loading.depth:
                waiting, _loading.waiting = _loading.waiting, []
                for hook, hooked in waiting:
                    _run([hook], hooked)
