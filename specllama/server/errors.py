"""One error responder for the whole server: every refusal and failure, from the guard
before any route to a route's own checks, answered as JSON in the shape of the API the
request was for (its Dialect's `error`), never as text or a traceback.

Which API a request was for is its route's: the routes that speak an API are
registered here with their dialect (`speaking`), and a request is matched against them
as Starlette routes it, so a refusal before routing (a wrong Origin on /v1/messages)
and an unknown path under an API get the same shape as that API's own errors.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

from .apierror import APIError
from .apis.base import Body
from .handoff import QueueFull, ShuttingDown, Unavailable
from .jobs import SHUTTING_DOWN, Failure

INTERNAL = APIError(500, "internal server error", type="server_error")

Endpoint = Callable[[Request], Awaitable[Response]]


class Shape(Protocol):
    """What the responder asks of a Dialect: the body of an error answer."""

    def error(self, exc: APIError) -> Body: ...


class OpenAIShape:
    """OpenAI's error body: for its APIs and for every route that speaks none."""

    def error(self, exc: APIError) -> Body:
        return exc.body()


class ErrorResponse(JSONResponse):
    """A JSON error that always encodes: a message quoting what a client sent (a key
    with a lone surrogate) falls back to JSON's \\u escapes rather than failing."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


class Errors:
    """The responder; `log` gets one line per unexpected failure (never the client)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self._routes: list[tuple[Route, Shape]] = []
        self.default: Shape = OpenAIShape()

    def speaking(self, shape: Shape, route: Route) -> Route:
        """`route` answers its errors in `shape` (returned, for the route table)."""
        self._routes.append((route, shape))
        return route

    def shape(self, scope: Scope) -> Shape:
        """The shape of the API the request is for: its route's (a method the route
        lacks still counts), else that of the API whose paths it is under (an unknown
        /v1/messages/... is Anthropic's client asking), else OpenAI's."""
        for route, shape in self._routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                return shape
        path, best, found = scope.get("path", ""), 0, self.default
        for route, shape in self._routes:
            base = route.path.partition("{")[0].rstrip("/") + "/"
            if path.startswith(base) and len(base) > best:
                best, found = len(base), shape
        return found

    def answer(self, exc: APIError, scope: Scope) -> Response:
        return ErrorResponse(self.shape(scope).error(exc), status_code=exc.status,
                             headers=exc.headers)

    def unexpected(self, exc: BaseException, scope: Scope) -> Response:
        """A defect of ours: one line in the log, a 500 in the API's shape."""
        self.log(f"internal error on {scope.get('method')} {scope.get('path')}: "
                 f"{type(exc).__name__}: {exc}")
        return self.answer(INTERNAL, scope)

    def guarded(self, endpoint: Endpoint) -> Endpoint:
        """The endpoint with every exception it raises answered here."""

        @functools.wraps(endpoint)
        async def answering(request: Request) -> Response:
            try:
                return await endpoint(request)
            except APIError as exc:
                return self.answer(exc, request.scope)
            except Exception as exc:
                return self.unexpected(exc, request.scope)

        return answering


def from_failure(failure: Failure) -> APIError:
    """A job's Failure (the engine's, the queue's) as the API error it answers."""
    headers = {} if failure.retry_after is None else {"Retry-After": str(failure.retry_after)}
    return APIError(failure.status, failure.message, code=failure.code, headers=headers,
                    type="server_error" if failure.status >= 500 else "invalid_request_error")


def turned_away(exc: QueueFull | ShuttingDown | Unavailable) -> APIError:
    """Why the worker took no more work, as the 503 that says so."""
    if isinstance(exc, QueueFull):
        return APIError(503, "the server is busy: too many requests are waiting; retry later",
                        type="server_error", code="queue_full",
                        headers={"Retry-After": str(exc.retry_after)})
    return from_failure(SHUTTING_DOWN if isinstance(exc, ShuttingDown) else exc.failure)
