"""Which protocols can be translated, and how a call of each is opened: the one place the
gateway and the in-process HTTP layer ask.

``"responses"`` is :class:`._responses.ResponsesTranslation`; ``"messages"`` (Anthropic
Messages) is :mod:`._messages`, imported when first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import orjson

from .._errors import ConfigurationError
from ..capture import _context
from ._base import Translation, TranslationError, upstream_error
from ._responses import Chains, ResponsesTranslation

APIS = _context.TRANSLATABLE
"""The protocols arttrace translates (named in capture, which checks a run's choice)."""


def apis(value: str | Iterable[str] | None) -> frozenset[str]:
    """``value`` (``"responses,messages"``, a list of names, ``None``) as a set of protocol
    names; a name arttrace does not translate, or one whose translator is not installed, is a
    :class:`ConfigurationError` saying which names are."""
    if value is None:
        return frozenset()
    chosen = _context.translate_names(value)
    for name in chosen:
        missing = _missing(name)
        if missing is not None:
            raise ConfigurationError(f"translate: {missing}")
    return chosen


def _missing(api: str) -> str | None:
    """Why ``api``'s translator cannot be loaded, or ``None``."""
    if api != "messages":
        return None
    try:
        importlib.import_module(f"{__package__}._messages")
    except ImportError as error:
        return (
            "the translation of Anthropic Messages is not available in this build of "
            f"arttrace ({error}); translate 'responses' only, or update arttrace"
        )
    return None


def open_translation(api: str, body: dict[str, Any], chains: Chains) -> Translation:
    """The translation of one call to ``api`` with JSON ``body``; a request that cannot be
    translated is a :class:`TranslationError` (answered to the agent as a 400)."""
    if api == "responses":
        return ResponsesTranslation(body, chains)
    if api == "messages":
        module = importlib.import_module(f"{__package__}._messages")
        translation: Translation = module.MessagesTranslation(body)
        return translation
    raise TranslationError(f"arttrace does not translate {api!r}")


def refusal(api: str, status: int, message: str) -> bytes:
    """A JSON error body in ``api``'s own shape (what its SDK shows its user), for a call
    refused before any upstream call, or an upstream error before a stream started."""
    if api == "messages":
        module = importlib.import_module(f"{__package__}._messages")
        body: bytes = module.error_body(status, message)
        return body
    kind_openai = "invalid_request_error" if status < 500 else "server_error"
    return orjson.dumps(
        {"error": {"message": message, "type": kind_openai, "param": None, "code": status}}
    )


def upstream_message(status: int, body: bytes) -> str:
    """The message of an upstream error body, or the body quoted."""
    return upstream_error(status, body)[0]
