"""A request's side of the worker: the Job that carries its events from the decoding
thread to the event loop, and the ways a request is turned away."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from .. import Finished, TargetToken, TokensAccepted
from .jobs import TEXT_EVENTS, Failure, Item, Wanted
from .prompts import Work


class QueueFull(Exception):
    """Too many requests are waiting; `retry_after` is a guess in seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"{retry_after}")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server is stopping and takes no more work."""


class Unavailable(Exception):
    """The engine is down (being started again): `failure` is the 503 to answer."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


#: Put last: the request has all it will get.
END = object()


class Job:
    """One request's generation, seen from both sides: only the items it reads
    (`wanted`) cross to the event loop, each crossing a wake-up of it."""

    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop, label: str,
                 wanted: Wanted = "text") -> None:
        self.work = work
        self.label = label
        self.wanted = wanted
        self._loop = loop
        self._wanted: tuple[type, ...] = {"end": (Finished,), "text": (Finished, *TEXT_EVENTS),
                                          "all": (object,)}[wanted]
        self._pending: deque[Any] = deque()
        self._ready = asyncio.Event()  # set on the event loop only
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way to the event loop
        self._cancelled = threading.Event()
        self.on_cancel: Callable[[], None] | None = None  # tells the engine, while it runs
        self.submitted = time.perf_counter()
        self.queue_s = 0.0
        self.first_token_s: float | None = None  # from arrival (streamed requests)

    def cancel(self) -> None:
        """Stop at the next round (or never start); safe from any thread, any time."""
        self._cancelled.set()
        tell = self.on_cancel  # once: the worker clears it when the order ends
        if tell is not None:
            tell()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, item: Any) -> None:  # worker thread
        """Hand an event (if the request reads it), a Failure or the end over."""
        if self.first_token_s is None and isinstance(item, (TokensAccepted, TargetToken)):
            self.first_token_s = time.perf_counter() - self.submitted
        if item is not END and not isinstance(item, (Failure, *self._wanted)):
            return
        self._pending.append(item)
        with self._lock:
            if self._woken:
                return
            self._woken = True
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the event loop is gone: nobody is listening any more
            pass

    async def batches(self) -> AsyncIterator[list[Item | Failure]]:
        """What the worker handed over since the last batch, in order, until the end."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._lock:
                self._woken = False  # before draining: a later put() wakes us again
            batch: list[Item | Failure] = []
            while self._pending:
                item = self._pending.popleft()
                if item is END:
                    if batch:
                        yield batch
                    return
                batch.append(item)
            if batch:
                yield batch
