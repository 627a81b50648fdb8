"""Turning capture on and off: the OpenAI SDK shim, the framework hooks and the HTTP-client
layer together.

Nothing is imported here that the application has not imported: the SDK is patched, and each
framework and HTTP client hooked, when the application imports it (at once if it already has).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

from .capture import _context, _http, _imports, _threads
from .capture._calls import Settings
from .integrations import _hooks

if TYPE_CHECKING:
    import openai

    _Client = TypeVar("_Client", openai.OpenAI, openai.AsyncOpenAI)
else:
    _Client = TypeVar("_Client")

_SHIM = "arttrace.capture._openai"


def instrument(
    *,
    request_training_data: bool = True,
    export_tokens: bool = False,
    translate: str | Iterable[str] | None = None,
) -> None:
    """Capture every model call the application makes: Chat Completions through the OpenAI
    SDK; the frameworks that are installed (LangChain, LlamaIndex, Google ADK), hooked when they
    are imported; and, below every client arttrace does not wrap (LiteLLM, DSPy, raw httpx,
    aiohttp, requests, ``urllib``), each POST to an OpenAI-compatible ``/chat/completions``,
    ``/responses`` or ``/completions`` path, read at the HTTP layer. A call seen by several
    layers is kept once. Threads started or submitted inside a run (``threading.Thread``,
    ``ThreadPoolExecutor``, ``loop.run_in_executor``) carry the run, so their calls are
    recorded in it.

    ``translate``: protocols (``"responses"``, ``"messages"``) whose calls through httpx (the
    ``openai`` and ``anthropic`` SDKs, the OpenAI Agents SDK) are made as Chat Completions
    calls to the same server, so every turn trains with exact tokens, and answered in the
    caller's protocol (``docs/translation.md``); a run can choose its own with
    ``trajectory(..., translate=...)``.

    ``request_training_data``: on ``@trainable`` calls, ask for ``logprobs=True`` and vLLM's
    ``return_token_ids`` when the caller did not set them (sampling parameters are never
    touched). ``export_tokens``: also put token ids and logprobs on exported span attributes
    (large).

    Idempotent: calling it again changes the settings; :func:`uninstrument` undoes it.
    """
    from .translation import _inprocess

    _inprocess.configure(translate)  # first: a bad value changes nothing
    _context.set_shim_settings(Settings(request_training_data, export_tokens))
    _imports.when_imported("openai", _patch_openai)
    _threads.install()
    _hooks.hook_frameworks()
    _http.install()
    # Outside the shim's wrapper, for calls that instrument() or a run translates: such a call
    # is recorded below it, as the Chat Completions call it becomes.
    _imports.when_imported("openai", _inprocess.stand_aside)


def uninstrument() -> None:
    """Undo all that :func:`instrument` did (idempotent): the global patch, the framework and
    HTTP-client hooks, the hooks still waiting for a module to be imported, translation.
    Clients passed to :func:`wrap_openai` stay wrapped."""
    if _context.shim_settings() is None:
        return
    _imports.forget()
    _http.uninstall()
    from .translation import _inprocess

    _inprocess.reset()
    _hooks.unhook_frameworks()
    _threads.uninstall()
    shim = sys.modules.get(_SHIM)
    if shim is not None:
        shim.unpatch()
    _context.set_shim_settings(None)


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return _context.shim_settings() is not None


def wrap_openai(
    client: _Client, *, request_training_data: bool = True, export_tokens: bool = False
) -> _Client:
    """Capture the Chat Completions calls of this one client, without a global patch.

    Returns the same client. Copies made later with ``client.with_options()`` are not wrapped.
    The options are :func:`instrument`'s.
    """
    from .capture import _openai

    return _openai.wrap(client, Settings(request_training_data, export_tokens))


def _patch_openai(_module: ModuleType) -> None:
    if _context.shim_settings() is not None:
        from .capture import _openai

        _openai.patch()
