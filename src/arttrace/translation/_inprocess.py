"""Translation in this process: which calls translate, and the hooks that make them.

``instrument(translate=...)`` sets the protocols for the process, ``trajectory(...,
translate=...)`` for one run (its choice wins). While :func:`arttrace.instrument` is on, a
``POST`` to ``.../responses`` or ``.../messages`` through httpx (which the ``openai`` and
``anthropic`` SDKs, and the OpenAI Agents SDK's default model, all send through) is made as a
``POST`` to ``.../chat/completions`` with the same client, recorded by the HTTP layer as a
Chat Completions call with exact tokens, and answered with an ``httpx.Response`` whose body,
whole or streamed, is the agent's protocol (:mod:`._send`). Capture does not know translation:
:func:`configure` registers the send hooks with it (``capture._context.set_send_hooks``),
:func:`reset` removes them.

The OpenAI SDK shim records a Responses call itself; for a call that is translated it stands
aside (:func:`stand_aside`: an outer wrapper of ``Responses.create`` marks the call), so the
call is recorded once, below, as the chat call it became.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from ..capture import _context
from ..capture._guard import guarded
from ._registry import apis

_process: frozenset[str] = frozenset()
aside: ContextVar[bool] = ContextVar("arttrace_translation_aside", default=False)
"""Set while the SDK shim stands aside for a translated call: the HTTP layer records it."""


def configure(value: str | Iterable[str] | None) -> None:
    """The protocols this process translates (``instrument(translate=...)``); the send hooks
    registered, for them and for the runs that choose their own."""
    global _process
    _process = apis(value)
    _context.set_send_hooks(_HOOKS)


def active() -> bool:
    """Whether any call may be translated (the first, cheapest check of every send)."""
    return bool(_process) or _context.runs_translate


def _hook(is_async: bool) -> _context.SendHook:
    """The send hook of ``Client.send`` (of ``AsyncClient.send`` when ``is_async``)."""

    def hook(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if not active():
            return None
        from . import _send  # httpx is imported (this is its send): what needs it can load

        return _send.send(wrapped, instance, args, kwargs, apis_here(), aside.get(), is_async)

    return hook


_HOOKS = (_hook(is_async=False), _hook(is_async=True))


def apis_here() -> frozenset[str]:
    """The protocols translated here: the current run's choice, else the process's."""
    run = _context.current_trajectory_var.get()
    own: frozenset[str] | None = getattr(run, "translate", None) if run is not None else None
    return _process if own is None else own


# -- the OpenAI SDK shim stands aside -----------------------------------------------------------


def stand_aside(module: Any = None) -> None:
    """Wrap ``Responses.create`` (sync and async) outermost, so that a translated call passes
    the shim (it is recorded below, as the chat call it becomes). Called again, it moves its
    wrapper back outside (the shim may have been put around it since)."""
    import wrapt  # once openai is: instrument() itself loads no wrapt
    from openai.resources.responses import AsyncResponses, Responses

    for cls, wrapper in ((Responses, _create), (AsyncResponses, _acreate)):
        _unwrap_aside(cls)
        wrapt.wrap_function_wrapper(cls, "create", wrapper)


def _unwrap_aside(cls: Any) -> None:
    """Splice this module's wrapper out of ``cls.create``, wherever it sits in the chain."""
    import wrapt

    outer: Any = None
    current = cls.__dict__.get("create")
    while isinstance(current, wrapt.FunctionWrapper):
        if getattr(current._self_wrapper, "_aside", False):
            if outer is None:
                cls.create = current.__wrapped__
            else:
                outer.__wrapped__ = current.__wrapped__
            return
        outer, current = current, current.__wrapped__


def reset() -> None:
    """Translate nothing, as before :func:`arttrace.instrument`: no protocol, no run's choice
    looked at, no send hook, the wrappers of :func:`stand_aside` removed."""
    global _process
    _process = frozenset()
    _context.runs_translate = False
    _context.set_send_hooks(None)
    restore()


def restore() -> None:
    """Remove the wrappers of :func:`stand_aside`."""
    import sys

    if "openai.resources.responses" not in sys.modules:
        return
    from openai.resources.responses import AsyncResponses, Responses

    for cls in (Responses, AsyncResponses):
        _unwrap_aside(cls)


def _translated_here() -> bool:
    with guarded("deciding whether to translate a Responses call"):
        return "responses" in apis_here()
    return False


def _create(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if not active() or not _translated_here():
        return wrapped(*args, **kwargs)
    marks = _context.capturing.set(True), aside.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        aside.reset(marks[1])
        _context.capturing.reset(marks[0])


def _acreate(wrapped: Any, instance: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    if not active() or not _translated_here():
        return wrapped(*args, **kwargs)
    return _acreate_aside(wrapped, args, kwargs)


async def _acreate_aside(wrapped: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    marks = _context.capturing.set(True), aside.set(True)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        aside.reset(marks[1])
        _context.capturing.reset(marks[0])


_create._aside = True  # type: ignore[attr-defined]
_acreate._aside = True  # type: ignore[attr-defined]
