"""Hooking each installed framework when it is imported (see the package's docstring)."""

from __future__ import annotations

import functools
import importlib
import sys
from types import ModuleType

from ..capture._guard import guarded
from ..capture._imports import when_imported

FRAMEWORKS = {
    "langchain": "langchain_core",
    "llama_index": "llama_index.core",
    "google_adk": "google.adk",
    "openai_agents": "agents",
    "dspy": "dspy.clients.cache",
}
"""Integration module -> the framework module whose import triggers it."""

_enabled = False


def hook_frameworks() -> None:
    """Install each integration now if its framework is imported, else when it is."""
    global _enabled
    _enabled = True
    for name, module in FRAMEWORKS.items():  # at once if the framework is imported
        when_imported(module, functools.partial(_on_import, name), key=(__package__, name))


def unhook_frameworks() -> None:
    global _enabled
    _enabled = False
    for name in FRAMEWORKS:
        integration = sys.modules.get(f"{__package__}.{name}")
        if integration is not None:
            with guarded(f"unhooking {FRAMEWORKS[name]}"):
                integration.uninstall()


def _on_import(name: str, _module: ModuleType) -> None:
    _install(name)


def _install(name: str) -> None:
    if not _enabled:
        return
    # A framework version arttrace cannot hook must not break the application.
    with guarded(f"hooking {FRAMEWORKS[name]} (its calls through the OpenAI SDK are still seen)"):
        importlib.import_module(f"{__package__}.{name}").install()
