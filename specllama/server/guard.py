"""The browser boundary: an ASGI middleware that refuses what a web page could send.

A page the user opens may POST to 127.0.0.1 (`text/plain` needs no preflight) and,
through DNS rebinding (its own name resolving to 127.0.0.1), read the answers. So, as
Ollama does (OLLAMA_ORIGINS), before any work:
- a Host header that does not name this machine: 403 (DNS rebinding sends the page's
  own name); any Host when bound to all interfaces, where the API key is the guard;
- an Origin that is neither this server's own nor one of `--allowed-origins`: 403;
  allowed ones get matching CORS answers (preflight included), refused ones none;
- a POST whose Content-Type is not application/json: 415 (the "simple" requests a page
  may send without asking first: text/plain, forms, no type at all).

And `Limit`, around the whole app: a request past the number in progress at once gets
the API's own 503 (JSON, Retry-After) before any work, not uvicorn's plain-text one.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .apierror import APIError
from .errors import Errors

_METHODS = "GET, POST, DELETE, OPTIONS"
_HEADERS = ("Authorization", "Content-Type")
_TOKEN = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP header name
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """`--allowed-origins` as given (repeated, comma-separated) -> normalized entries;
    ValueError naming one that is not `scheme://host[:port]`, `*` or `null`."""
    entries = []
    for value in values:
        for entry in value.split(","):
            entry = entry.strip().rstrip("/").lower()
            if not entry:
                continue
            parts = urlsplit(entry)
            if entry not in ("*", "null") and not (
                    parts.scheme and parts.netloc and not parts.path and not parts.query):
                raise ValueError(f"{entry!r} is not an origin: scheme://host[:port] "
                                 "('*' matching any text), '*' or 'null'")
            entries.append(entry)
    return tuple(dict.fromkeys(entries))


class Guard:
    """Wraps the app; `bound_host` is --host, `allowed_origins` from origin_patterns."""

    def __init__(self, app: ASGIApp, *, bound_host: str, errors: Errors,
                 allowed_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.errors = errors
        self.bound = _bare(bound_host)
        self.any_host = _all_interfaces(self.bound)
        # Names of this machine besides loopback addresses and *.localhost: the bound
        # address and the host name (what a LAN client may type; no DNS lookup here).
        self.names = {"localhost", socket.gethostname().lower()}
        if not self.any_host:
            self.names.add(self.bound)
        self.any_origin = "*" in allowed_origins
        self.patterns = [re.compile(".*".join(map(re.escape, p.split("*"))))
                         for p in allowed_origins]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        local = scope.get("server") or (None, None)
        refusal = self._refusal(scope["method"], headers, local)
        origin = headers.get("origin")
        if origin is None or (refusal is not None and refusal.status == 403):
            app = self.app if refusal is None else self.errors.answer(refusal, scope)
            await app(scope, receive, send)
            return
        # An allowed Origin from here on.
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin, headers)(scope, receive, send)
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  *_cors(origin)]}
            await send(message)

        app = self.app if refusal is None else self.errors.answer(refusal, scope)
        await app(scope, receive, with_cors)

    def _refusal(self, method: str, headers: Headers,
                 local: tuple[str | None, int | None]) -> APIError | None:
        host = headers.get("host")
        if host and not self.any_host and not self._this_machine(_host_of(host), local[0]):
            return APIError(403, f"the Host header {host!r} does not name this machine: "
                            "this server answers requests addressed to localhost, a loopback "
                            f"address or {self.bound} (a page on another site reaching it "
                            "through DNS rebinding sends its own name)",
                            code="forbidden_host")
        origin = headers.get("origin")
        if origin is not None and not self._allowed(origin, local):
            return APIError(403, f"the web origin {origin!r} may not use this server; "
                            "start it with --allowed-origins naming it to allow it",
                            code="forbidden_origin")
        if method == "POST":
            media = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media != "application/json":
                return APIError(415, "the request body must be JSON, sent with the header "
                                f"'Content-Type: application/json' (not {media or 'none'!r})",
                                code="unsupported_media_type")
        return None

    def _this_machine(self, name: str, local: str | None) -> bool:
        if name in self.names or name.endswith(".localhost") or name == local:
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:  # a name
            return False

    def _allowed(self, origin: str, local: tuple[str | None, int | None]) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or any(p.fullmatch(origin) for p in self.patterns):
            return True
        # This server's own pages: this machine's names on this server's port.
        parts = urlsplit(origin)
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # a port that is not a number
            return False
        return (parts.scheme in _DEFAULT_PORTS and parts.hostname is not None
                and port == local[1] and self._this_machine(parts.hostname, local[0]))


class Limit:
    """At most `limit` requests in progress at once, streams and bodies still arriving
    included; one more is answered 503 in the API's shape before any work. /health is
    neither counted nor refused, so a probe gets through while requests fill the limit.
    uvicorn's own limit_concurrency (on connections, idle ones too; a plain-text 503)
    stays as a backstop above this one (runner.py)."""

    def __init__(self, app: ASGIApp, limit: int, errors: Errors) -> None:
        self.app = app
        self.limit = limit
        self.errors = errors
        self.active = 0  # requests in progress (one event loop: no lock)
        self._busy = APIError(503, f"the server is busy: {limit} requests are in progress "
                              "at once, its most; retry later", type="server_error",
                              code="too_many_requests", headers={"Retry-After": "1"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            await self.errors.answer(self._busy, scope)(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


def _bare(host: str) -> str:
    """A host without brackets, a trailing dot or capitals: '[::1]' -> '::1'."""
    return host.strip().strip("[]").rstrip(".").lower()


def _all_interfaces(host: str) -> bool:
    try:
        return not host or ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name
        return False


def _host_of(header: str) -> str:
    """The name or address of a Host header, without its port."""
    header = header.strip()
    if header.startswith("["):  # [v6]:port
        return _bare(header.partition("]")[0])
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return _bare(header)


def _cors(origin: str) -> list[tuple[bytes, bytes]]:
    # The origin echoed (never "*"), so a cache keys the answer by Origin; Retry-After
    # readable by the page, as the 503s carry it.
    return [(b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", b"Retry-After"),
            (b"vary", b"Origin")]


def _preflight(origin: str, headers: Headers) -> Response:
    """The browser asking before a request with a key or JSON: yes, for the headers it
    names (an SDK adds its own), with the methods the API has."""
    asked = [h.strip() for h in headers.get("access-control-request-headers", "").split(",")]
    allowed = dict.fromkeys([*_HEADERS, *(h for h in asked if _TOKEN.match(h))])
    answer = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": _METHODS,
        "Access-Control-Allow-Headers": ", ".join(allowed),
        "Access-Control-Max-Age": "600",
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }
    if headers.get("access-control-request-private-network") == "true":
        answer["Access-Control-Allow-Private-Network"] = "true"  # Chrome's, for a local server
    return Response(status_code=204, headers=answer)
