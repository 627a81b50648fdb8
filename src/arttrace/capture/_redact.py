"""Secrets never reach what arttrace stores or exports.

A server's error body may echo the API key (a 401 saying "Incorrect API key provided: sk-...");
arttrace keeps error texts in records, journals and spans, so every such text passes through
:func:`redact`. It removes the keys the shim has seen in requests (the client's ``api_key``, the
values of ``Authorization``/``api-key`` headers) and text shaped like a key (``sk-...``,
``Bearer ...``). The keys seen are held in memory only. Request parameters that carry headers or
keys are dropped from records (:func:`scrub_params`). The exception the caller gets is untouched.
"""

from __future__ import annotations

import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
_MIN_SECRET = 8
"""Shorter values ("test", "EMPTY") are placeholders; removing them would garble messages."""
_SHAPES = re.compile(
    r"(?:\bBearer\s+)[A-Za-z0-9._~+/=-]{8,}"
    r"|\bsk-[A-Za-z0-9_-]{8,}"
    r"|\bAIza[0-9A-Za-z_-]{20,}",
    re.IGNORECASE,
)
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "x-goog-api-key"}
)
_SECRET_PARAMS = frozenset(
    {"extra_headers", "headers", "default_headers", "api_key", "openai_api_key", "authorization"}
)
_known: tuple[str, ...] = ()
"""The keys seen, longest first; replaced whole when a new one is seen (rare), read lock-free."""
_lock = threading.Lock()


def remember(secret: object) -> None:
    """Redact ``secret`` (a key or a header value) from now on."""
    if not isinstance(secret, str):
        return
    value = secret.strip()
    if value.lower().startswith("bearer "):
        value = value[7:].strip()
    global _known
    if len(value) >= _MIN_SECRET and value not in _known:
        with _lock:
            _known = tuple(sorted({*_known, value}, key=len, reverse=True))


def remember_headers(headers: object) -> None:
    """Remember the values of the secret-bearing headers in ``headers`` (a mapping)."""
    if isinstance(headers, Mapping):
        for name, value in headers.items():
            if isinstance(name, str) and name.lower() in _SECRET_HEADERS:
                remember(value)


def redact(text: str) -> str:
    """``text`` without the keys seen and without anything shaped like a key."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _SHAPES.sub(REDACTED, text)


def error_text(error: BaseException) -> str:
    """``Type: message`` of ``error``, redacted: how records keep an error."""
    return redact(f"{type(error).__name__}: {error}")


def exception_attributes(error: BaseException) -> dict[str, str]:
    """Overrides for ``span.record_exception(error, attributes=...)``: its message and
    traceback, redacted."""
    return {
        "exception.message": redact(str(error)),
        "exception.stacktrace": redact("".join(traceback.format_exception(error))),
    }


def scrub_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Request parameters as records keep them: headers and keys dropped (their secret values
    remembered for :func:`redact`), secret-shaped strings redacted."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name.lower() in _SECRET_PARAMS or name.lower().endswith(("_headers", "api_key")):
            remember_headers(value)
            remember(value)
            continue
        out[name] = _redacted(value)
    return out


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def remember_client(client: Any, extra: Iterable[object] = ()) -> None:
    """Remember the secrets an OpenAI client sends: its ``api_key`` and default headers."""
    remember(getattr(client, "api_key", None))
    remember_headers(getattr(client, "_custom_headers", None))
    for value in extra:
        remember_headers(value)


class UpstreamError(Exception):
    """The server answered with an error; the caller got that answer unchanged."""


def excerpt(data: bytes, limit: int = 500) -> str:
    """The start of a server's error body, without the keys (a 401 may echo the key)."""
    text = redact(data.decode("utf-8", "replace"))
    return text[:limit] + ("..." if len(text) > limit else "")
