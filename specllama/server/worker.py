"""One engine, many clients: a single worker thread serves jobs from a bounded FIFO queue.

The engine (jobs.Engine, in `specllama serve` inside an engine process: isolation.py)
blocks while it generates, so it is driven from this thread, never the event loop. Only
the events a request reads cross over (a non-streaming one: only the end), and the event
loop is woken at most once for however many are waiting: every wake-up is a thread
taking a core from llama.cpp's, whose threads wait for each other at every step
(docs/performance.md, "specllama serve beside llama-server"). A job cancelled (client
gone, server stopping) stops at the next round.

When the engine process dies (its RPC server lost or hung, llama.cpp aborted, the OOM
killer), the request it served answers with the reason, the waiting ones and every new
one get 503 with Retry-After, and this thread starts another engine, backing off while
that fails, until it serves again.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import Event, Finished, SpecLlamaError, Stats, TargetToken, TokensAccepted
from .isolation import EngineLost, EngineProcess
from .jobs import SHUTTING_DOWN, TEXT_EVENTS, Evaluated, Failure, Order, Outcome
from .metrics import Metrics
from .promptcache import CacheFigures
from .prompts import Work

# Seconds between attempts to start a lost engine again: doubling up to this.
BACKOFF_MAX_S = 10.0


class Decoding(Protocol):
    def prepare(self) -> str | None: ...
    def run(self, order: Order, put: Callable[[Event | Evaluated], None],
            cancelled: Callable[[], bool]) -> Outcome: ...
    def close(self) -> None: ...


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


_END = object()


class Job:
    """One request's generation, seen from both sides. `stream`: the request reads the
    text as it comes; otherwise only the end (Finished or a Failure) is handed over."""

    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop, label: str,
                 stream: bool = True) -> None:
        self.work = work
        self.label = label
        self.stream = stream
        self._loop = loop
        self._wanted: tuple[type, ...] = (Finished, *(TEXT_EVENTS if stream else ()))
        self._pending: deque[Any] = deque()
        self._ready = asyncio.Event()  # set on the event loop only
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way to the event loop
        self._cancelled = threading.Event()
        self.on_cancel: Callable[[], None] | None = None  # tells the engine, once it runs
        self.submitted = time.perf_counter()
        self.queue_s = 0.0
        self.first_token_s: float | None = None  # from arrival (streamed requests)

    def cancel(self) -> None:
        """Stop at the next round (or never start); safe from any thread, any time."""
        self._cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, item: Any) -> None:  # worker thread
        """Hand an event (if the request reads it), a Failure or the end over."""
        if self.first_token_s is None and isinstance(item, (TokensAccepted, TargetToken)):
            self.first_token_s = time.perf_counter() - self.submitted
        if item is not _END and not isinstance(item, (Failure, *self._wanted)):
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

    async def batches(self) -> AsyncIterator[list[Event | Failure]]:
        """What the worker handed over since the last batch, in order, until the end."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            with self._lock:
                self._woken = False  # before draining: a later put() wakes us again
            batch: list[Event | Failure] = []
            while self._pending:
                item = self._pending.popleft()
                if item is _END:
                    if batch:
                        yield batch
                    return
                batch.append(item)
            if batch:
                yield batch


@dataclass
class Totals:
    """What the server did, for /health and the summary at exit."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0  # 503: queue full, shutting down, engine down
    engine_restarts: int = 0
    busy_s: float = 0.0
    stats: Stats = field(default_factory=Stats)

    def as_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "rejected": self.rejected,
            "engine_restarts": self.engine_restarts,
            "tokens": self.stats.tokens,
        }


@dataclass(frozen=True)
class Down:
    """Why the engine is not serving, and when the next start is due."""

    reason: str
    remote: bool
    retry_at: float  # time.monotonic(); a start may be under way past it

    def failure(self) -> Failure:
        wait = max(1, math.ceil(self.retry_at - time.monotonic()))
        what = "the target's RPC server is unreachable" if self.remote else \
            "the engine is restarting"
        return Failure(503, f"{what} ({self.reason}); retry later", "engine_unavailable", wait)


class Worker:
    def __init__(
        self,
        engine: Decoding,
        *,
        max_waiting: int,
        draft_max: int | str,
        drafters: tuple[str, ...],
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self._prepared = threading.Event()
        self.draft_max = draft_max
        self.drafters = drafters
        self.totals = Totals()
        self.metrics = Metrics()
        self._log = log or (lambda _: None)
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # bounded by submit()
        self._in_flight = 0  # submitted and not yet done: the one served + the waiting
        self._lock = threading.Lock()
        self._current: Job | None = None
        self._closing = False
        self._stop = threading.Event()  # ends a back-off wait at once
        self._orders = 0
        self.down: Down | None = None
        # /health's "cache": the KV caches against the last request after it
        self.cache: dict[str, int | bool] = {"history": 0, "consistent": True}
        self.prompt_cache = CacheFigures()  # as the engine last told (empty after a restart)
        self._thread = threading.Thread(target=self._run, name="specllama-decoder", daemon=True)

    # ------------------------------------------------------------ event-loop side
    def start(self) -> None:
        """Start the decoding thread; returns once it has run the engine's `prepare`."""
        self._thread.start()
        self._prepared.wait()

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    @property
    def busy(self) -> bool:
        return self._current is not None

    def submit(self, work: Work, label: str, stream: bool = True) -> Job:
        job = Job(work, asyncio.get_running_loop(), label, stream)
        with self._lock:
            if self._closing:
                self.totals.rejected += 1
                raise ShuttingDown
            if self.down is not None:
                self.totals.rejected += 1
                raise Unavailable(self.down.failure())
            if self._in_flight > self.max_waiting:
                self.totals.rejected += 1
                raise QueueFull(self._retry_after())
            self._in_flight += 1
            self._jobs.put(job)
        return job

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: the waiting jobs at the mean service time."""
        done = self.totals.completed + self.totals.cancelled + self.totals.failed
        mean = self.totals.busy_s / done if done else 1.0
        return max(1, math.ceil(mean * self._in_flight))

    def stop_accepting(self) -> None:
        """From now on new and waiting requests are answered 'shutting down'.
        Plain assignment: this runs inside a signal handler."""
        self._closing = True

    def close(self, timeout: float = 30.0) -> None:
        """Cancel the current job, turn away the waiting ones, stop the thread (and
        with it the engine)."""
        self._closing = True
        self._stop.set()
        current = self._current
        if current is not None:
            current.cancel()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)
        if isinstance(self.engine, EngineProcess):
            self.engine.kill()  # a no-op unless the thread is stuck

    # ------------------------------------------------------------ worker thread
    def _run(self) -> None:
        # Every llama.cpp decode of an in-process engine happens on this thread,
        # `prepare`'s too: llama.cpp's OpenMP keeps a team of threads per thread that
        # ever decoded, and decodes here ran at 0.6x (2 cores) once the main thread had
        # decoded as well.
        try:
            why = self.engine.prepare()
            if why:
                self._log(why)
        finally:
            self._prepared.set()
        try:
            while (job := self._jobs.get()) is not None:
                self._current = job
                lost = None
                try:
                    self._serve(job)
                except EngineLost as exc:
                    lost = exc
                finally:
                    self._current = None
                    with self._lock:
                        self._in_flight -= 1
                    job.put(_END)
                if lost is not None:
                    self._recover(lost)
        finally:
            self.engine.close()

    def _serve(self, job: Job) -> None:
        started = time.perf_counter()
        job.queue_s = started - job.submitted
        down = self.down
        if self._closing or down is not None:
            job.put(SHUTTING_DOWN if self._closing or down is None else down.failure())
            with self._lock:
                self.totals.rejected += 1
            return
        if job.cancelled:  # the client left while waiting
            with self._lock:
                self.totals.cancelled += 1
            return
        self._orders += 1
        order = Order(self._orders, job.work, "text" if job.stream else "end",
                      self.draft_max, self.drafters)
        engine = self.engine
        if isinstance(engine, EngineProcess):
            job.on_cancel = lambda: engine.cancel(order.id)
        try:
            outcome = engine.run(order, job.put, lambda: job.cancelled)
        except EngineLost as lost:
            with self._lock:  # from now on new requests get 503
                self.down = Down(str(lost), lost.remote, time.monotonic())
            job.put(self.down.failure() if lost.remote else Failure(
                500, f"generation failed: {lost}; the engine is being restarted"))
            self._account(job, started, None, lost)
            raise
        if outcome.failure is not None:
            job.put(outcome.failure)
        self.cache, self.prompt_cache = outcome.cache, outcome.prompt_cache
        self._account(job, started, outcome.result, outcome.failure)

    def _account(self, job: Job, started: float, result: Any,
                 failed: Failure | EngineLost | None) -> None:
        with self._lock:
            t = self.totals
            t.busy_s += time.perf_counter() - started
            if failed is not None:
                t.failed += 1
            elif job.cancelled or result is None or result.finish_reason == "interrupted":
                t.cancelled += 1
            else:
                t.completed += 1
            if result is not None:
                t.stats.merge(result.stats)
        if job.first_token_s is not None:
            self.metrics.first_token(job.first_token_s)
        if result is not None and failed is None:
            self.metrics.finished(result.stats)
        self._log(self._summary(job, result, failed))

    def _recover(self, lost: EngineLost) -> None:
        """The engine died serving a job (answered already): answer the waiting ones,
        then start the engine again (backing off) until it serves or the server stops."""
        engine = self.engine
        assert isinstance(engine, EngineProcess)  # an in-process engine cannot be lost
        self._log(f"engine lost: {lost}; starting it again")
        delay = 0.0
        while not self._stop.wait(delay):
            self._answer_waiting()
            try:
                engine.start()
            except SpecLlamaError as exc:  # EngineLost included: it died while loading
                delay = min(max(1.0, 2 * delay), BACKOFF_MAX_S)
                remote = lost.remote or isinstance(exc, EngineLost) and exc.remote
                with self._lock:
                    self.down = Down(str(exc), remote, time.monotonic() + delay)
                self._log(f"engine not started: {exc}; next try in {delay:g} s")
                continue
            with self._lock:
                self.down = None
                self.totals.engine_restarts += 1
            self._log(f"engine started again (pid {engine.pid})")
            return

    def _answer_waiting(self) -> None:
        """Jobs that were queued when the engine died get their 503 now, not later."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is None:  # close(): put it back for the main loop
                self._jobs.put(None)
                return
            failure = SHUTTING_DOWN if self._closing else (self.down or Down(
                "starting", False, time.monotonic())).failure()
            job.put(failure)
            job.put(_END)
            with self._lock:
                self.totals.rejected += 1
                self._in_flight -= 1

    @staticmethod
    def _summary(job: Job, result: Any, failed: Failure | EngineLost | None) -> str:
        if failed is not None:
            why = failed.message if isinstance(failed, Failure) else f"engine lost: {failed}"
            return f"{job.label}: failed: {why}"
        if result is None:
            return f"{job.label}: cancelled before it began"
        s = result.stats
        return (
            f"{job.label}: {result.finish_reason}, {s.prompt_tokens} prompt tokens "
            f"({s.prompt_reused} cached), {s.tokens} generated, acceptance "
            f"{s.acceptance_rate:.0%}, {s.tokens_per_step:.2f} tokens/step, "
            f"{s.tokens_per_s:.1f} tok/s, queued {job.queue_s:.2f} s"
        )
