"""The checks of a gateway's options, made by ``Gateway`` and, before anything heavy loads, by
the ``arttrace gateway`` command. Each returns what is wrong (a phrase starting "must",
"has" or "is", which the caller prefixes with the option's name), or ``None``."""

from __future__ import annotations

import math
from urllib.parse import urlsplit

_UPSTREAM_EXAMPLE = "the policy server's OpenAI base URL, like http://127.0.0.1:8000/v1"


def upstream_problem(url: str) -> str | None:
    """What is wrong with ``url`` as the upstream, or ``None``."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError as error:
        if "port" in str(error).lower():
            return f"has a port out of range (0 to 65535): it must be {_UPSTREAM_EXAMPLE}"
        return f"is not a URL ({error}): it must be {_UPSTREAM_EXAMPLE}; got {url!r}"
    if parts.scheme not in ("http", "https") or not url.startswith(f"{parts.scheme}://"):
        return f"must start with http:// or https://: it is {_UPSTREAM_EXAMPLE}; got {url!r}"
    if not parts.hostname:
        return f"has no host: it must be {_UPSTREAM_EXAMPLE}; got {url!r}"
    if parts.query or parts.fragment:
        return f"must have no ?query or #fragment: it is {_UPSTREAM_EXAMPLE}; got {url!r}"
    return None


def port_problem(port: int) -> str | None:
    if isinstance(port, int) and not isinstance(port, bool) and 0 <= port <= 65535:
        return None
    return f"must be 0 to 65535 (0: any free port), got {port!r}"


def timeout_problem(timeout: float | None) -> str | None:
    if timeout is None or (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and timeout > 0
    ):
        return None
    return f"must be a number of seconds greater than 0, got {timeout!r}"


def origin_problem(origin: str) -> str | None:
    """What is wrong with ``origin`` as an allowed origin, or ``None``."""
    if origin == "*":
        return None
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        return (
            "must be a web page's origin as a browser sends it, like http://localhost:3000 "
            f"(scheme, host and port; no path), or '*' for any; got {origin!r}"
        )
    return None


def host_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a host name the gateway answers to, or ``None``."""
    if not name or any(c in name for c in "/ @") or name.count(":") == 1:
        return (
            "must be a host name or address as callers write it in the gateway's URL, like "
            f"gateway.internal (no scheme, port or path), or '*' for any; got {name!r}"
        )
    return None
