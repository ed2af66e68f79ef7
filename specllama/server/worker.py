"""One decoder, many clients: a single worker thread serves jobs from a bounded FIFO queue.

The engine's `stream()` is a blocking generator, so it runs here, never on the event
loop. Only the events a request reads cross over (a non-streaming one: only the end),
and the event loop is woken at most once for however many are waiting: every wake-up
is a thread taking a core from llama.cpp's, whose threads wait for each other at every
step (docs/performance.md, "specllama serve beside llama-server"). A job cancelled
(client gone, server stopping) closes its generator at the next event, between rounds:
the engine then puts both KV caches back to a prefix of what was committed, so the next
request is served correctly. Every generation keeps its cache (`keep_cache=True`): a
request that resends the conversation so far is evaluated only from where it differs
from the previous one.
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
from typing import Any

from .. import Event, Finished, SpeculativeDecoder, Stats, TargetToken, TextFlushed, TokensAccepted
from ..engine.kvreport import cache_report
from .prompts import Work


class QueueFull(Exception):
    """Too many requests are waiting; `retry_after` is a guess in seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"{retry_after}")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The server is stopping and takes no more work."""


@dataclass(frozen=True)
class Failure:
    """The generation raised; the request answers with this error."""

    error: BaseException


_END = object()


#: The events that carry text: what a stream sends on.
TEXT_EVENTS = (TokensAccepted, TargetToken, TextFlushed)


class Job:
    """One request's generation, seen from both sides. `stream`: the request reads the
    text as it comes; otherwise only the end (Finished or a Failure) is handed over."""

    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop, label: str,
                 stream: bool = True) -> None:
        self.work = work
        self.label = label
        self._loop = loop
        self._wanted: tuple[type, ...] = (Finished, *(TEXT_EVENTS if stream else ()))
        self._pending: deque[Any] = deque()
        self._ready = asyncio.Event()  # set on the event loop only
        self._lock = threading.Lock()
        self._woken = False  # a wake-up is on its way to the event loop
        self._cancelled = threading.Event()
        self.submitted = time.perf_counter()
        self.queue_s = 0.0

    def cancel(self) -> None:
        """Stop at the next round (or never start); safe from any thread, any time."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, item: Any) -> None:  # worker thread
        """Hand an event (if the request reads it), a Failure or the end over."""
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
    rejected: int = 0  # 503: queue full or shutting down
    busy_s: float = 0.0
    stats: Stats = field(default_factory=Stats)

    def as_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "rejected": self.rejected,
            "tokens": self.stats.tokens,
        }


class Worker:
    def __init__(
        self,
        decoder: SpeculativeDecoder,
        *,
        max_waiting: int,
        draft_max: int | str,
        draft_mode: str,
        log: Callable[[str], None] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.decoder = decoder
        self._prepare = prepare
        self._prepared = threading.Event()
        self.draft_max = draft_max
        self.draft_mode = draft_mode
        self.totals = Totals()
        self._log = log or (lambda _: None)
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # bounded by submit()
        self._in_flight = 0  # submitted and not yet done: the one served + the waiting
        self._lock = threading.Lock()
        self._current: Job | None = None
        self._closing = False
        self._history: list[int] = []  # the last prompt + what was generated for it
        # /health's "cache": the KV caches against _history after the last job
        self.cache: dict[str, int | bool] = {"history": 0, "consistent": True}
        self._thread = threading.Thread(target=self._run, name="specllama-decoder", daemon=True)

    # ------------------------------------------------------------ event-loop side
    def start(self) -> None:
        """Start the decoding thread; returns once it has run `prepare`."""
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
        """Cancel the current job, turn away the waiting ones, stop the thread."""
        self._closing = True
        current = self._current
        if current is not None:
            current.cancel()
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    # ------------------------------------------------------------ worker thread
    def _run(self) -> None:
        # Every llama.cpp decode of the process happens on this thread, `prepare`'s too:
        # llama.cpp's OpenMP keeps a team of threads per thread that ever decoded, and
        # decodes here ran at 0.6x (2 cores) once the main thread had decoded as well.
        try:
            if self._prepare is not None:
                self._prepare()
        except Exception as exc:  # measured again at the first request; never fatal here
            self._log(f"measuring decode costs failed: {type(exc).__name__}: {exc}")
        finally:
            self._prepared.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._closing:
                job.put(Failure(ShuttingDown()))
                job.put(_END)
                with self._lock:
                    self.totals.rejected += 1
                    self._in_flight -= 1
                continue
            self._current = job
            try:
                self._serve(job)
            finally:
                self._current = None
                with self._lock:
                    self._in_flight -= 1
                job.put(_END)

    def _serve(self, job: Job) -> None:
        started = time.perf_counter()
        job.queue_s = started - job.submitted
        if job.cancelled:  # the client left while waiting
            with self._lock:
                self.totals.cancelled += 1
            return
        decoder, work = self.decoder, job.work
        failed: Exception | None = None
        finished = False
        stream = None
        try:
            # Inside the try: arguments refused here must fail this job, not the thread.
            stream = decoder.stream(
                work.tokens,
                max_tokens=work.max_tokens,
                sampling=work.sampling,
                draft_max=self.draft_max,
                draft_mode=self.draft_mode,  # type: ignore[arg-type]
                stop=work.stop,
                keep_cache=True,
                constraint=work.constraint,
                logprobs=work.logprobs,
            )
            for event in stream:
                if job.cancelled:
                    break
                job.put(event)
                finished = isinstance(event, Finished)
        except Exception as exc:
            failed = exc
            job.put(Failure(exc))
        finally:
            if stream is not None:  # GeneratorExit in the engine: caches back to a prefix
                stream.close()
        result = stream.result if stream is not None else None  # None: it never began
        if result is not None and not finished and failed is None:
            job.put(Finished(result))  # cut short: what there is, for a stream to end on
        if result is not None:
            self._history = list(work.tokens) + list(result.tokens)
        self.cache = cache_report(self._history, self.decoder.target, self.decoder.draft).as_dict()
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
        self._log(self._summary(job, result, failed))

    @staticmethod
    def _summary(job: Job, result: Any, failed: Exception | None) -> str:
        if failed is not None:
            return f"{job.label}: failed: {type(failed).__name__}: {failed}"
        if result is None:
            return f"{job.label}: cancelled before it began"
        s = result.stats
        return (
            f"{job.label}: {result.finish_reason}, {s.prompt_tokens} prompt tokens "
            f"({s.prompt_reused} cached), {s.tokens} generated, acceptance "
            f"{s.acceptance_rate:.0%}, {s.tokens_per_step:.2f} tokens/step, "
            f"{s.tokens_per_s:.1f} tok/s, queued {job.queue_s:.2f} s"
        )
