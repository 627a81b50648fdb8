"""ART, imported in the background while the first rollouts run.

``import art`` takes 15-35 s of CPU on a small machine (torch comes with it), and rollouts need
none of it: only capture. So a Trainer starts importing ART in a background thread when it is
built (:func:`start_art_import`) and waits for it (:func:`art_loaded`) only when a step's
groups are built, after its rollouts. A model given as a factory (``Trainer(model=build_model)``)
is built and registered then too (:class:`TrainerModel`), so a script that never imports ART
itself starts its first rollout in well under a second.

The rollout path must not import ART meanwhile: Python locks a module while it is imported, so
a thread that needs ``art`` waits until the other has imported all of it. The Trainer's modules
import ART only for type checking, or inside functions that run once it has loaded.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, TrainingError

if TYPE_CHECKING:
    import art

_MODULES = ("art", "art.trajectories", "arttrace.capture._art")
"""What building a step's groups needs: ART's types and arttrace's conversion to them."""

type ModelFactory = Callable[[], art.TrainableModel[Any]]
"""Builds the model once ART has loaded (see :class:`TrainerModel`)."""


class _Import:
    """One background import of :data:`_MODULES`: done or failed, and how long it took."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.seconds: float | None = None

    def run(self) -> None:
        started = time.perf_counter()
        try:
            for name in _MODULES:
                importlib.import_module(name)
        except BaseException as error:  # kept for the step that needs ART, which raises it
            self.error = error
        finally:
            self.seconds = time.perf_counter() - started
            self.done.set()


_lock = threading.Lock()
_import: _Import | None = None


def start_art_import() -> None:
    """Start importing ART in a daemon thread, once per process (later calls do nothing)."""
    global _import
    with _lock:
        if _import is not None:
            return
        _import = _Import()
    if all(name in sys.modules for name in _MODULES):
        _import.seconds = 0.0
        _import.done.set()
        return
    threading.Thread(target=_import.run, name="arttrace-import-art", daemon=True).start()


async def art_loaded() -> ModuleType:
    """The ``art`` module, once the background import has finished, awaited without blocking
    the event loop (the import starts here if nothing started it). A failed import is a
    :class:`~arttrace.TrainingError` with its cause, each time it is asked for."""
    start_art_import()
    assert _import is not None
    if not _import.done.is_set():
        await asyncio.to_thread(_import.done.wait)
    if _import.error is not None:
        error = _import.error
        raise TrainingError(
            f"ART could not be imported ({type(error).__name__}: {error}), so the step's "
            "groups cannot be built or shipped (its rollouts are in the journal). Check that "
            "openpipe-art and its dependencies import (`python -c 'import art'` shows the "
            "whole error), then run again with resume=True"
        ) from error
    return sys.modules["art"]


class TrainerModel:
    """The Trainer's ``art.TrainableModel``: the one it was given, or the one its factory
    builds once ART has loaded. A built model is registered with the backend then
    (``await model.register(backend)``), since the script never held it to register it."""

    def __init__(self, model: art.TrainableModel[Any] | ModelFactory, backend: Any) -> None:
        self._factory: ModelFactory | None = model if callable(model) else None
        self._model: art.TrainableModel[Any] | None = None if callable(model) else model
        self._backend = backend
        self._building: asyncio.Lock | None = None

    @property
    def built(self) -> art.TrainableModel[Any] | None:
        """The model, or ``None`` while its factory waits for ART."""
        return self._model

    async def get(self) -> art.TrainableModel[Any]:
        """The model; built and registered first if it comes from a factory."""
        if self._model is not None:
            return self._model
        module = await art_loaded()
        if self._building is None:
            self._building = asyncio.Lock()
        async with self._building:
            if self._model is None:
                assert self._factory is not None
                self._model = await self._build(module, self._factory)
        return self._model

    async def _build(self, module: ModuleType, factory: ModelFactory) -> art.TrainableModel[Any]:
        name = getattr(factory, "__qualname__", repr(factory))
        try:
            model = factory()
        except Exception as error:
            raise ConfigurationError(
                f"the Trainer's model factory {name} raised {error!r}: it must return an "
                "art.TrainableModel"
            ) from error
        trainable: type[art.TrainableModel[Any]] = module.TrainableModel
        if not isinstance(model, trainable):
            raise ConfigurationError(
                f"the Trainer's model factory {name} returned {type(model).__name__}, not an "
                "art.TrainableModel"
            )
        await model.register(self._backend)
        return model
