"""What the gateway refuses before it routes a request.

**Paths** that could leave a run's ``/v1`` on the upstream: a ``.`` or ``..`` segment
(``%2e%2e`` and ``%2E`` too), an encoded slash or backslash, a backslash, or a ``%`` left after
decoding (``%252e``, which an upstream that decodes twice reads as ``.``). Both the server's
decoded ``path`` and the ``raw_path`` the caller sent are read; the raw one is what is
forwarded, so the upstream decodes the caller's path once, as if it had been called directly.
No OpenAI route has such a path, so nothing is resolved: it is refused (400).

**A web page**, for a gateway without a token (which would spend the upstream's key and
journal a chosen reward for any page its user visits): a ``Host`` that is not the gateway's
address or an allowed name (DNS rebinding: the page's own name, now resolving to 127.0.0.1);
a body not declared ``application/json`` (a form or ``text/plain`` is sent cross-site without
asking; JSON needs a CORS preflight, which only allowed origins pass); and a request a browser
marks as coming from another site (``Origin``, ``Sec-Fetch-Site``). Programs send none of
these (Node's ``fetch`` sends ``Sec-Fetch-Mode: cors`` and no ``Origin``, which passes). A
gateway with a token needs only the token: a page cannot know it.

An allowed origin (``allow_origins``) gets CORS answers, so an agent running in a browser page
can call the gateway.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import unquote

from starlette.responses import Response
from starlette.types import Message, Scope, Send

from ._runs import error

_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
_OTHER_SITE = frozenset({b"cross-site", b"same-site"})
_READ = frozenset(
    {
        b"host",
        b"origin",
        b"sec-fetch-site",
        b"content-type",
        b"content-length",
        b"transfer-encoding",
    }
)
_WILDCARD = ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")


class Admission:
    """Checks one gateway makes of every request: ``host`` is the address it listens on,
    ``hosts`` the other names it answers to, ``origins`` the web pages it answers (``"*"``:
    any), ``token`` whether callers must present one."""

    def __init__(
        self, host: str, hosts: Iterable[str], origins: Iterable[str], *, token: bool
    ) -> None:
        self.token = token
        self.origins = frozenset(origins)
        self.hosts = frozenset(hosts) | {host.strip("[]").lower()}
        try:
            bound: ipaddress.IPv4Address | ipaddress.IPv6Address | None
            bound = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            bound = None  # a name: it answers to that name
        self.any_address = bound in _WILDCARD
        self.loopback = host == "localhost" or (bound is not None and bound.is_loopback)
        self.bound = bound
        if self.loopback or self.any_address:
            self.hosts |= {"localhost"}
        self._served: set[bytes] = set()
        """``Host`` values found served, as sent: the check is then one lookup."""

    # -- before the token ----------------------------------------------------------------

    def origin(self, scope: Scope) -> bytes | None:
        """The request's ``Origin`` when it is allowed (its answer then carries CORS headers)."""
        if not self.origins:
            return None
        for name, value in scope["headers"]:
            if name == b"origin":
                allowed = "*" in self.origins or value.decode("latin-1").lower() in self.origins
                return value if allowed else None
        return None

    @staticmethod
    def preflight(scope: Scope, origin: bytes) -> Response | None:
        """A browser's CORS preflight from an allowed origin: answered here (it carries no
        token, and asks for no upstream call)."""
        if scope["method"] != "OPTIONS":
            return None
        asked = dict(scope["headers"])
        if b"access-control-request-method" not in asked:
            return None
        headers = {
            "access-control-allow-origin": origin.decode("latin-1"),
            "access-control-allow-methods": _METHODS,
            "access-control-allow-headers": asked.get(
                b"access-control-request-headers", b"authorization, content-type"
            ).decode("latin-1"),
            "access-control-max-age": "600",
            "vary": "Origin",
        }
        return Response(status_code=204, headers=headers)

    # -- after the token -----------------------------------------------------------------

    def refusal(self, scope: Scope, origin: bytes | None) -> Response | None:
        """Why the request is refused, as the answer to send, or ``None``."""
        refused = _path_refusal(scope)
        if refused is not None or self.token:
            return refused
        seen = {n: v for n, v in scope["headers"] if n in _READ}  # one pass, on every call
        host = seen.get(b"host")
        if host is not None and host not in self._served:
            name = _host_name(host.decode("latin-1"))
            if self._serves(name):
                if len(self._served) < 64:  # any address may be served: keep a few
                    self._served.add(host)
                return self._browser(seen, origin)
            return error(
                400,
                f"arttrace gateway: refused a request for host {name!r}, which is not this "
                "gateway's address (a web page on another name may have been pointed at it: "
                "DNS rebinding). If you reach the gateway by that name, start it with "
                f"`--allow-host {name}` (Gateway(allow_hosts=[{name!r}])), or give it a token",
                "permission_error",
            )
        return self._browser(seen, origin)

    def _browser(self, seen: dict[bytes, bytes], origin: bytes | None) -> Response | None:
        """A refusal of what only a web page sends: a request from another page or site, or
        a body a page may post without asking."""
        if origin is None:
            page, site = seen.get(b"origin"), seen.get(b"sec-fetch-site")
            if page is not None or site in _OTHER_SITE:
                shown = page.decode("latin-1") if page is not None else "another site"
                return error(
                    403,
                    f"arttrace gateway: refused a request a browser sent from {shown}: a web "
                    "page may not call a gateway without a token. To let a page of yours call "
                    f"it, start it with `--allow-origin {shown if page else '<origin>'}` "
                    "(Gateway(allow_origins=[...])), or give it a token",
                    "permission_error",
                )
        has_body = b"transfer-encoding" in seen or seen.get(b"content-length", b"0").strip() != b"0"
        declared = seen.get(b"content-type", b"").partition(b";")[0].strip().lower()
        if has_body and declared != b"application/json":
            return error(
                415,
                "arttrace gateway: send the request body as JSON with `Content-Type: "
                "application/json` (a gateway without a token refuses other bodies, which a web "
                "page can post to it); to forward other bodies (uploads), give it a token",
            )
        return None

    def _serves(self, name: str) -> bool:
        if "*" in self.hosts or name in self.hosts:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False  # a name (what DNS rebinding sends) it was not given
        if self.any_address:
            return True
        if self.loopback:
            return address.is_loopback
        return address == self.bound


def with_cors(send: Send, origin: bytes) -> Send:
    """``send``, adding the CORS headers that let the page at ``origin`` read the answer."""

    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            added = [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
            message = {**message, "headers": [*message.get("headers", ()), *added]}
        await send(message)

    return send_with_cors


def _path_refusal(scope: Scope) -> Response | None:
    raw = scope.get("raw_path")
    if raw is not None and b"%" not in raw and b"\\" not in raw and b"/." not in raw:
        return None  # decoded, it is the same: no dot segment, no slash or backslash to hide
    paths = [scope["path"]] if raw is None else [raw.decode("latin-1"), scope["path"]]
    for path in paths:
        if "\\" in path or any(not _plain(unquote(s)) for s in path.split("/")):
            return error(
                400,
                f"arttrace gateway: refused the path {paths[0]!r}: a run's URL takes plain path "
                "segments under /runs/<run_id>/v1/, so that no call reaches outside the run's "
                "/v1 on the upstream ('.' and '..' segments, encoded or not, encoded slashes, "
                "backslashes and '%' left after decoding are refused)",
            )
    return None


def _plain(segment: str) -> bool:
    return (
        segment not in (".", "..")
        and not any(c in segment for c in "/\\%")
        and all(" " <= c != "\x7f" for c in segment)
    )


def _host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port, brackets or final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")
