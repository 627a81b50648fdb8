"""Secrets never reach what arttrace stores or exports.

A server's error body may echo the credentials it refuses (a 401 saying "Incorrect API key
provided: sk-..."); arttrace keeps error texts in records, journals and spans, so every such
text passes through :func:`redact`. It removes every credential a layer has seen the caller
send, whatever its scheme: the client's ``api_key``, the value of any credential-bearing header
(``Authorization`` with ``Bearer``, ``Basic`` (its base64, and the decoded ``user:password``
and password), ``Token``, ``Api-Key`` or any other scheme; ``api-key``, ``x-api-key``,
``x-goog-api-key``, cookies, ...), and credential-named query parameters (``?key=``,
``?api-key=``, ``?access_token=``, ...), each also as it reads percent-encoded or JSON-escaped;
and text shaped like a key (``sk-...``, ``Bearer ...``). The secrets seen are held in memory
only. Request parameters that carry headers, queries or keys are dropped from records
(:func:`scrub_params`). The exception the caller gets is untouched.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import traceback
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
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
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "x-goog-api-key", "cookie"}
)
_SECRET_WORDS = ("auth", "key", "token", "secret", "passw", "credential", "cookie", "signature")
"""A header or query parameter whose name holds one of these carries a credential."""
_SECRET_PARAMS = frozenset(
    {"extra_headers", "headers", "default_headers", "api_key", "openai_api_key", "authorization"}
)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9._+-]*)\s+(\S.*)", re.DOTALL)
"""``<scheme> <credentials>``, the form of an ``Authorization`` value."""
_PARTS = re.compile(r"[,;]")
_MAX_SECRETS = 1024
"""Values remembered at most (the oldest let go): a client signing each request (a fresh
``Signature=`` every call) must not grow them without end."""
_seen: dict[str, tuple[str, ...]] = {}
"""Each value remembered (oldest first) and the forms of it to redact."""
_known: tuple[str, ...] = ()
"""The forms to redact, longest first; replaced whole when a new value is seen (rare), read
lock-free."""
_lock = threading.Lock()


def remember(secret: object) -> None:
    """Redact ``secret`` (a key, or a credential header's value, whatever its scheme) from now
    on: the whole value, its credentials after the scheme, a ``Basic`` pair decoded (and its
    password), the values of ``name=value`` parts (Digest, cookies), each as it may be echoed
    (percent-encoded, JSON-escaped)."""
    global _known
    if isinstance(secret, bytes):
        secret = secret.decode("latin-1")
    if not isinstance(secret, str) or secret in _seen:
        return
    found = {form for value in _values(secret.strip()) for form in _forms(value)}
    forms = tuple(value for value in found if len(value) >= _MIN_SECRET)
    with _lock:
        if secret in _seen:
            return
        _seen[secret] = forms
        if len(_seen) > _MAX_SECRETS:
            del _seen[next(iter(_seen))]
        every = {form for known in _seen.values() for form in known}
        _known = tuple(sorted(every, key=len, reverse=True))


def _values(value: str) -> Iterator[str]:
    """``value`` and the credentials it holds."""
    yield value
    scheme = _SCHEME.fullmatch(value)
    if scheme is not None:
        credentials = scheme[2].strip()
        yield credentials
        if scheme[1].lower() == "basic":
            yield from _basic(credentials)
    for part in _PARTS.split(value):
        name, equals, rest = part.partition("=")
        if equals and name.split():  # "Digest username=...", "Signature=...", a cookie
            yield rest.strip().strip('"')


def _basic(credentials: str) -> Iterator[str]:
    """A ``Basic`` credential decoded: ``user:password``, and the password."""
    try:
        pair = base64.b64decode(credentials, validate=True).decode()
    except (binascii.Error, ValueError):
        return
    yield pair
    yield pair.partition(":")[2]


def _forms(value: str) -> Iterator[str]:
    """``value`` as a server may echo it: as is, percent-encoded or decoded, JSON-escaped."""
    for form in {value, urllib.parse.unquote_plus(value), urllib.parse.quote(value, safe="")}:
        yield form
        yield json.dumps(form)[1:-1]
        yield form.replace("/", "\\/")


def secret_name(name: object) -> bool:
    """Whether a header or query parameter called ``name`` carries a credential."""
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    if not isinstance(name, str):
        return False
    lowered = name.lower()
    return lowered in _SECRET_HEADERS or any(word in lowered for word in _SECRET_WORDS)


def remember_headers(headers: object) -> None:
    """Remember the values of the credential-bearing headers in ``headers`` (a mapping, or
    ``(name, value)`` pairs)."""
    for name, value in _pairs(headers):
        if secret_name(name):
            remember(value)


def remember_query(query: object) -> None:
    """Remember the values of the credential-named parameters of ``query`` (a URL, its query
    string, a mapping, or ``(name, value)`` pairs)."""
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    if isinstance(query, str):
        if "?" in query or "://" in query:  # a URL: its query
            query = query.partition("?")[2]
        query = [part.partition("=")[::2] for part in query.split("&") if "=" in part]
        query = [(urllib.parse.unquote_plus(name), value) for name, value in query]
    for name, value in _pairs(query):
        if secret_name(name):
            remember(value if isinstance(value, str | bytes) else str(value))


def remember_request(headers: object = None, url: object = None) -> None:
    """Remember the credentials a request carries in its headers and in its URL's query."""
    remember_headers(headers)
    remember_query(url if isinstance(url, str | bytes) else str(url or ""))


def _pairs(items: object) -> Iterator[tuple[object, object]]:
    if items is None:
        return
    multi = getattr(items, "multi_items", None)  # httpx.Headers: every value of a name
    if callable(multi):
        yield from multi()
    elif isinstance(items, Mapping):
        yield from items.items()
    elif isinstance(items, Iterable) and not isinstance(items, str | bytes):
        for item in items:
            if isinstance(item, tuple | list) and len(item) == 2:
                yield item[0], item[1]


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
    """Request parameters as records keep them: headers, queries and keys dropped (their
    secret values remembered for :func:`redact`), secret-shaped strings redacted."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        lowered = name.lower()
        if lowered.endswith("_query"):
            remember_query(value)
            continue
        if lowered in _SECRET_PARAMS or lowered.endswith(("_headers", "api_key")):
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
    """Remember the secrets an OpenAI client sends: its keys, its default headers and query,
    the query of its base URL, the ``auth`` of its httpx client; and those of one request
    (``extra``: its ``extra_headers`` / ``extra_query``)."""
    for name in ("api_key", "admin_api_key", "_azure_ad_token"):
        remember(getattr(client, name, None))
    remember_headers(getattr(client, "_custom_headers", None))
    remember_query(getattr(client, "_custom_query", None))
    remember_query(str(getattr(client, "base_url", "") or ""))
    auth = getattr(getattr(client, "_client", None), "auth", None)
    remember(getattr(auth, "_auth_header", None))  # httpx.BasicAuth's "Basic ..."
    for value in extra:
        if isinstance(value, Mapping):
            remember_headers(value)
            remember_query(value)


class UpstreamError(Exception):
    """The server answered with an error; the caller got that answer unchanged."""


def excerpt(data: bytes, limit: int = 500) -> str:
    """The start of a server's error body, without the keys (a 401 may echo the key)."""
    text = redact(data.decode("utf-8", "replace"))
    return text[:limit] + ("..." if len(text) > limit else "")
