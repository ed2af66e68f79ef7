"""One pair, many clients: a thread per slot (`--parallel N`) serves a bounded FIFO queue.

A slot (jobs.Slot; in `specllama serve` inside an engine process: isolation.py) blocks
while it generates, so it is driven from these threads, never the event loop. Only
the events a request reads cross over (a non-streaming one: only the end), and the event
loop is woken at most once for however many are waiting: every wake-up is a thread
taking a core from llama.cpp's, whose threads wait for each other at every step
(docs/lab/2026-12-serve.md, "specllama serve beside llama-server"). A job cancelled (client
gone, server stopping) stops at the next round, or a long prompt's next step; a cancel
that races the order to the engine process is never lost (isolation.py, pipe.py).

When the engine process dies (its RPC server lost or hung, llama.cpp aborted, the OOM
killer, its compute thread dead or hung: batched.py), the request it served answers with
the reason, the waiting ones and every new one get 503 with Retry-After, and one thread
starts another engine, backing off while that fails, until it serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from .. import Drafters, GenerationResult, SpecLlamaError, Stats
from .handoff import END, Job, QueueFull, ShuttingDown, Unavailable, Wanted
from .isolation import EngineLost
from .jobs import SHUTTING_DOWN, Decoding, Failure, Order, Outcome, choice_work
from .metrics import Metrics
from .promptcache import CacheFigures
from .prompts import Work
from .state import Down, Snapshot, Totals, summary

#: Queues an admitted request's work: (work, label, what it reads) -> its Job.
Submit = Callable[[Work, str, Wanted], Job]

# Seconds between attempts to start a lost engine again: doubling up to this.
BACKOFF_MAX_S = 10.0


class Worker:
    def __init__(
        self,
        engine: Decoding,
        *,
        max_waiting: int,
        draft_max: int | str,
        drafters: Drafters,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """engine: started already; it serves `engine.parallel` requests at once."""
        self.engine = engine
        self.parallel = parallel = engine.parallel
        self._prepared = threading.Event()
        self.draft_max = draft_max
        self.drafters = drafters
        self.totals = Totals()
        self.metrics = Metrics()
        self._log = log or (lambda _: None)
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # bounded by submit()
        self._in_flight = 0  # submitted and not yet done: those served + the waiting
        self._lock = threading.Lock()
        self._current: set[Job] = set()
        self._restarting = threading.Lock()  # one thread starts a lost engine again
        self._closing = False
        self._stop = threading.Event()  # ends a back-off wait at once
        self._orders = 0
        self.down: Down | None = None
        # /health's "cache": the KV caches against the last request after it
        self.cache: dict[str, int | bool] = {"history": 0, "consistent": True}
        self.prompt_cache = CacheFigures()  # as the engine last told (empty after a restart)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"specllama-decoder-{i}")
                         for i in range(parallel)]
        self._running = parallel  # threads not yet ended: the last one closes the engine

    # ------------------------------------------------------------ event-loop side
    def start(self) -> None:
        """Start the decoding thread; returns once it has run the engine's `prepare`."""
        for thread in self._threads:
            thread.start()
        self._prepared.wait()

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    @property
    def busy(self) -> bool:
        return bool(self._current)

    @property
    def serving(self) -> int:
        """Requests being generated now (at most `parallel`)."""
        return len(self._current)

    def snapshot(self) -> Snapshot:
        """The figures as they stand, all at once (under the lock the threads count in)."""
        with self._lock:
            stats = Stats()
            stats.merge(self.totals.stats)
            return Snapshot(replace(self.totals, stats=stats), busy=self.busy,
                            serving=self.serving, waiting=self.waiting,
                            parallel=self.parallel, cache=dict(self.cache),
                            prompt_cache=self.prompt_cache, engine_pid=self.engine.pid,
                            down=self.down)

    def submit(self, work: Work, label: str, wanted: Wanted = "text") -> Job:
        """Admit and queue `work` at once (see `admitted`)."""
        with self.admitted() as submit:
            return submit(work, label, wanted)

    @contextlib.contextmanager
    def admitted(self) -> Iterator[Submit]:
        """A place among the requests in flight, taken before the request's own work
        (tokenizing, templates, a grammar's compile) so that a full queue, a server
        stopping or an engine down turns it away first (QueueFull, ShuttingDown,
        Unavailable). Inside, `submit` queues the work; leaving without it frees the
        place (the request failed its checks, or only counted its tokens)."""
        with self._lock:
            if self._closing:
                self.totals.rejected += 1
                raise ShuttingDown
            if self.down is not None:
                self.totals.rejected += 1
                raise Unavailable(self.down.failure())
            if self._in_flight >= self.max_waiting + self.parallel:
                self.totals.rejected += 1
                raise QueueFull(self._retry_after())
            self._in_flight += 1
        queued = False

        def submit(work: Work, label: str, wanted: Wanted) -> Job:
            nonlocal queued
            job = Job(work, asyncio.get_running_loop(), label, wanted)
            with self._lock:
                if self._closing:  # it stopped meanwhile: the place goes with the answer
                    raise ShuttingDown
                queued = True
                self._jobs.put(job)
            return job

        try:
            yield submit
        finally:
            if not queued:
                with self._lock:
                    self._in_flight -= 1

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: the waiting jobs at the mean service time."""
        done = self.totals.completed + self.totals.cancelled + self.totals.failed
        mean = self.totals.busy_s / done if done else 1.0
        return max(1, math.ceil(mean * self._in_flight / self.parallel))

    def stop_accepting(self) -> None:
        """From now on new and waiting requests are answered 'shutting down'.
        Plain assignment: this runs inside a signal handler."""
        self._closing = True

    def close(self, timeout: float = 30.0) -> None:
        """Cancel the current jobs, turn away the waiting ones, stop the threads (and
        with them the engine)."""
        self._closing = True
        self._stop.set()
        for job in list(self._current):
            job.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.engine.kill()  # a no-op unless a thread is stuck

    # ------------------------------------------------------------ worker threads
    def _run(self, index: int) -> None:
        # Every llama.cpp decode of an in-process engine happens on thread 0 (with
        # --parallel, on the batcher's), `prepare`'s too: llama.cpp's OpenMP keeps a
        # team of threads per thread that ever decoded, and decodes ran far slower once
        # the main thread had decoded too (docs/lab/2026-12-serve.md, "The cause, and the fix").
        if index == 0:
            try:
                why = self.engine.prepare()
                if why:
                    self._log(why)
            finally:
                self._prepared.set()
        self._prepared.wait()
        try:
            while (job := self._jobs.get()) is not None:
                with self._lock:
                    self._current.add(job)
                lost, starts = None, self.engine.starts
                try:
                    self._serve(job)
                except EngineLost as exc:
                    lost = exc
                except Exception as exc:  # a defect of ours: this request fails, not the thread
                    job.put(Failure.of(exc))
                    with self._lock:
                        self.totals.failed += 1
                    self._log(f"{job.label}: failed: {type(exc).__name__}: {exc}")
                finally:
                    with self._lock:
                        self._current.discard(job)
                        self._in_flight -= 1
                    job.put(END)
                if lost is not None:
                    self._recover(lost, starts)
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last:
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
        # A request's choices run one after another: a later one finds the prompt in the
        # slot's caches. A failure or a cancel (the client gone) ends them all.
        results: list[GenerationResult] = []
        failure: Failure | None = None
        for choice in range(job.work.choices):
            try:
                outcome = self._choice(job, choice)
            except EngineLost as lost:
                self._account(job, started, results, lost)
                raise
            if outcome is None and not choice:  # the client left while waiting
                with self._lock:
                    self.totals.cancelled += 1
                return
            if outcome is None:
                break
            failure = outcome.failure
            if outcome.result is not None:
                results.append(outcome.result)
            if failure is not None or outcome.result is None or \
                    outcome.result.finish_reason == "interrupted":
                break
        self._account(job, started, results, failure)

    def _choice(self, job: Job, choice: int) -> Outcome | None:
        """Choice `choice` of the job on the engine: its outcome, its failure handed over;
        None when the job was cancelled first. EngineLost: answered, then raised."""
        with self._lock:
            self._orders += 1
            order_id = self._orders
        order = self._order(order_id, job, choice)
        engine = self.engine
        starts = engine.starts
        # Before the check below: a cancel from here on reaches an engine process's
        # child, or is seen by that check or by run's own reads of `cancelled`
        # (isolation.py).
        job.on_cancel = lambda: engine.cancel(order.id)
        try:
            if job.cancelled:
                return None
            outcome = engine.run(order, job.put, lambda: job.cancelled)
        except EngineLost as lost:
            down = Down(str(lost), lost.remote, time.monotonic())
            with self._lock:  # from now on new requests get 503 (unless another thread
                if engine.starts == starts:  # has started it again)
                    self.down = down
            job.put(down.failure() if lost.remote else Failure(
                500, f"generation failed: {lost}; the engine is being restarted"))
            raise
        finally:
            job.on_cancel = None  # the order is over: a late cancel has nothing to tell
        if outcome.failure is not None:
            job.put(outcome.failure)
        if outcome.cache:  # (none from an order cancelled before it was sent)
            with self._lock:
                self.cache, self.prompt_cache = outcome.cache, outcome.prompt_cache
        return outcome

    def _order(self, order_id: int, job: Job, choice: int) -> Order:
        """Choice `choice` of the job as its slot serves it (jobs.choice_work: its seed):
        the request's own draft settings where it gave them, the server's otherwise.
        Every event is read only by the round-event stream (apis/roundstream.py), whose
        last figures compare the turn with the target alone."""
        work = job.work
        return Order(order_id, choice_work(work, choice), job.wanted,
                     self.draft_max if work.draft_max is None else work.draft_max,
                     self.drafters if work.drafters is None else work.drafters,
                     compare=job.wanted == "all", choice=choice)

    def _account(self, job: Job, started: float, results: list[GenerationResult],
                 failed: Failure | EngineLost | None) -> None:
        with self._lock:
            self.totals.add(time.perf_counter() - started, results, job.work.choices,
                            failed is not None)
        if job.first_token_s is not None:
            self.metrics.first_token(job.first_token_s)
        for result in results if failed is None else []:
            self.metrics.finished(result.stats)
        why = None if failed is None else failed.message if isinstance(failed, Failure) \
            else f"engine lost: {failed}"
        for line in summary(job.label, job.queue_s, results, why):
            self._log(line)

    def _recover(self, lost: EngineLost, starts: int) -> None:
        """The engine died serving a job (answered already): answer the waiting ones,
        then start the engine again (backing off) until it serves or the server stops.
        Jobs served beside it were lost with it: the first of their threads here does
        this (`starts`: the engine's starts when the job began), the others wait."""
        engine = self.engine  # an engine process: one in this process is never lost
        with self._restarting:
            if engine.starts == starts and not self._stop.is_set():
                self._restart(lost, engine)

    def _restart(self, lost: EngineLost, engine: Decoding) -> None:
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
            job.put(END)
            with self._lock:
                self.totals.rejected += 1
                self._in_flight -= 1
