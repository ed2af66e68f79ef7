"""What one HTTP connection tells a route: its body (bounded), its client hanging up,
and the job's batches as a stream reads them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import anyio
from starlette.requests import Request

from .apierror import APIError
from .jobs import Failure, Item

MAX_BODY = 4 * 2**20
# A body over MAX_BODY is still read (and dropped) up to this size, so the client gets
# its 413 instead of a connection reset halfway through sending.
_DRAIN_LIMIT = 4 * MAX_BODY

Batches = AsyncIterator[list[Item | Failure]]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


async def read_body(request: Request, timeout_s: float) -> bytes:
    """The body, at most MAX_BODY bytes, sent within `timeout_s` seconds (else 408:
    a slow sender holds a place of the server's limit while it sends)."""
    too_large = APIError(
        413, f"the request body is larger than {MAX_BODY} bytes", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _DRAIN_LIMIT:
        raise too_large
    size, parts = 0, []
    with anyio.move_on_after(timeout_s) as waited:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= MAX_BODY:
                parts.append(chunk)
            elif size > _DRAIN_LIMIT:
                break
    if waited.cancelled_caught:
        raise APIError(408, f"the request body took longer than {timeout_s:g} s to arrive",
                       code="request_timeout", headers={"Connection": "close"})
    if size > MAX_BODY:
        raise too_large
    return b"".join(parts)


async def cancel_when(event: anyio.Event, job: Cancellable) -> None:
    await event.wait()
    job.cancel()


async def disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def prepend(first: list[Item | Failure], rest: Batches) -> Batches:
    if first:
        yield first
    async for batch in rest:
        yield batch
