"""What cannot be sent to the Ray workers, or loaded there, named with the fix: the variable
of a rollout (or the part of an example) that does not pickle, found by walking what pickling
it pickles; the module a worker cannot import, and the path to send it with."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ray import cloudpickle

from .._errors import ConfigurationError

_dumps: Callable[[Any], bytes] = cloudpickle.dumps  # untyped in Ray


def pickled(obj: Any, what: str, root: str) -> bytes:
    """``obj`` pickled as Ray sends it, or a ConfigurationError naming what in it cannot be
    pickled (``root`` is how the path to that part starts: ``rollout``, ``example``)."""
    try:
        return bytes(_dumps(obj))
    except Exception as error:
        chain = _culprit(obj, set(), 0)
        raise ConfigurationError(_unpicklable(what, root, obj, chain, error)) from None


_Hop = tuple[str, Any, Exception]
"""A step into an object (``.attr``, ``[key]``, ``=name`` for a variable the path then
starts from, or :data:`_THROUGH`), the part it reaches, and the error pickling that part
gave."""

_THROUGH = "~"
"""The step from a decorator's wrapper (``functools.wraps``, as ``@at.trainable``'s) to the
function it wraps: not named, since the user wrote that function, not the wrapper's
variable (``fn``)."""


def _culprit(obj: Any, seen: set[int], depth: int) -> list[_Hop]:
    """The steps from ``obj`` to the innermost part of it that does not pickle."""
    if depth > 12 or id(obj) in seen:
        return []
    seen.add(id(obj))
    try:
        for step, part in _parts(obj):
            try:
                _dumps(part)
            except Exception as error:
                return [(step, part, error), *_culprit(part, seen, depth + 1)]
    except Exception:  # a part we cannot walk: stop here
        pass
    return []


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What pickling ``obj`` pickles, each with the step that reaches it."""
    if isinstance(obj, types.MethodType):
        yield "=self", obj.__self__
        yield ".__func__", obj.__func__
    elif isinstance(obj, functools.partial):
        yield ".func", obj.func
        for i, arg in enumerate(obj.args):
            yield f".args[{i}]", arg
        for key, value in obj.keywords.items():
            yield f".keywords[{key!r}]", value
    elif isinstance(obj, types.FunctionType):  # pickled by value: its code's references
        wrapped = getattr(obj, "__wrapped__", None)
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False):
            if wrapped is not None and cell.cell_contents is wrapped:
                yield _THROUGH, wrapped  # a decorator's (@at.trainable's) function: the user's
            else:
                yield f"={name}=its variable {name!r}", cell.cell_contents
        for name in dict.fromkeys(_global_names(obj.__code__)):
            if name in obj.__globals__:
                yield f"={name}=its global {name!r}", obj.__globals__[name]
        for i, default in enumerate(obj.__defaults__ or ()):
            yield f"=default={f'its default value {i}'}", default
    elif type(obj) is dict:
        for key, value in obj.items():
            yield f"[{key!r}]", value
    elif type(obj) in (list, tuple, set, frozenset):
        for i, item in enumerate(obj):
            yield f"[{i}]", item
    else:
        reduced = obj.__reduce_ex__(5)
        if not isinstance(reduced, tuple):
            return
        state = reduced[2] if len(reduced) > 2 else None
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            for name, value in state.items():
                yield f".{name}", value
        for i, item in enumerate(reduced[3] if len(reduced) > 3 and reduced[3] else ()):
            yield f"[{i}]", item
        for key, value in reduced[4] if len(reduced) > 4 and reduced[4] else ():
            yield f"[{key!r}]", value
        for i, arg in enumerate(reduced[1] if len(reduced) > 1 else ()):
            yield f".__reduce__()[1][{i}]", arg


def _unpicklable(what: str, root: str, obj: Any, chain: list[_Hop], error: Exception) -> str:
    """``what`` cannot be sent: which part of it, of what type, holds what cannot be pickled.
    The part named is the first variable on the way that is not a function (a helper
    function's global client is named as that client, used by that helper)."""
    path, top, top_at, via = root, "", -1, ""
    for i, (step, _part, _) in enumerate(chain):
        if step == _THROUGH:
            continue
        if step.startswith("="):  # a variable: the path starts again from its name
            _, path, *described = step.split("=", 2)
            if described and (not top or _is_function(chain[top_at][1])):
                if top and not via:
                    via = top
                top, top_at = described[0], i
        else:
            path += step
            if not top:
                top, top_at = path, i
    used = ""
    if via:
        top, used = top.replace("its ", "the ", 1), f" that {via} uses"
    leaf, cause = (chain[-1][1], chain[-1][2]) if chain else (obj, error)
    if top_at in (-1, len(chain) - 1):
        holds = f"{top or root}{used} is {_a(leaf)}"
    else:
        holds = f"{top} ({_a(chain[top_at][1])}){used} holds {_a(leaf)} at {path}"
    fix = (
        "Keep examples to plain data (text, numbers, ids) and build such objects inside the rollout"
        if root == "example"
        else f"Create it inside {what} (or once per worker, on first use), or define {what} "
        "in a module the workers import, so that it is sent by name, not by value"
    )
    return (
        f"{what} cannot be sent to the Ray workers: {holds}, which cannot be pickled "
        f"({type(cause).__name__}: {cause}). {fix}"
    )


def _is_function(obj: Any) -> bool:
    return isinstance(obj, types.FunctionType | types.MethodType | functools.partial)


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


_LOCKS = {"_thread.lock": "threading.Lock", "_thread.RLock": "threading.RLock"}


def _a(obj: Any) -> str:
    """``a threading.Lock``, ``an openai.AsyncOpenAI``."""
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    name = _LOCKS.get(name, name.removeprefix("builtins."))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def example_name(index: int, example: Any) -> str:
    key = example.get("id") if isinstance(example, Mapping) else None
    return f"example {index}" + ("" if key is None else f" (id {key!r})")


# -- what cannot be loaded on a worker --------------------------------------------------------


def load_error(what: str, error: Exception) -> dict[str, Any]:
    """Why ``what`` could not be unpickled on this worker, with the fix."""
    module = getattr(error, "name", None) if isinstance(error, ImportError) else None
    cause = f"{type(error).__name__}: {error}"
    return {"what": what, "module": module, "cause": cause}


def load_message(what: str, module: str | None, cause: str) -> str:
    """What could not be loaded on the workers, and the fix: on the driver, where the module
    lives is known, and the fix names its path."""
    if not module:
        return (
            f"{what} cannot be loaded on the Ray workers ({cause}): the workers must have the "
            "code and package versions this process has (install them on every node, or "
            "send them with RayExecutor(runtime_env=...))"
        )
    top = module.split(".")[0]
    local = sys.modules.get(top)
    path = _module_path(local) if local is not None else None
    send = repr(path) if path else f"'<the folder or .py file of {top}>'"
    return (
        f"{what} cannot be loaded on the Ray workers: they cannot import module {module!r} "
        f"({cause}). Send it with RayExecutor(runtime_env={{'py_modules': [{send}]}}) or "
        "runtime_env={'working_dir': '<your project folder>'}, or install it on every node"
    )


def _module_path(module: types.ModuleType) -> str | None:
    """What ``py_modules`` takes for ``module``: its package folder, or its ``.py`` file."""
    paths = list(getattr(module, "__path__", []))
    if paths:
        return str(paths[0])
    file = getattr(module, "__file__", None)
    return str(file) if file else None
