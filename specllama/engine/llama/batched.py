"""Several generations in one target context (`serve --parallel N`).

Each generation runs on its own thread with a `SeqView`: a `Model` to the round loop,
for one sequence id of a target context that holds N. A view's decode hands its tokens
to the `Batcher` and waits; once every generation in progress has handed in its share
(its verify tokens, or a chunk of a new prompt), the batcher decodes them all in one
llama_decode and each view reads its own rows. So a round of four requests costs one
target pass of ~4(k+1) tokens, which on a CPU costs far less than four passes
(docs/performance.md, the table, row 18; docs/lab/2026-12-parallel.md).

The draft model is shared the same way: a context of N sequences, each generation's
draft steps batched with the others' drafting at the same time (a batch fires once
every generation in progress waits for one: drafts first, then the target's). Every
llama.cpp computation of the engine runs on the batcher's one thread: llama.cpp's
OpenMP keeps a spinning team of threads per thread that ever decoded, and two teams on
the same cores slow each other down.

Exactness: a sequence's rows depend only on its own cells (llama.cpp masks the others'
out of attention) and on which side of WIDE its batch falls: llama.cpp's CPU flash
attention computes a batch of WIDE query rows or more in F32 tiles and a smaller one with
F16 dot products, and the two differ by up to a logit on a real model. So every token is
computed on the side it would be alone: a prompt is cut as it would be alone (then a wide
chunk into wide pieces), and a batch never mixes shares of both sides nor lets narrow
ones add up to WIDE. Greedy output equal to the request served alone is tested, on tiny
models and on the real SmolLM2 (tests/test_parallel.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import DecodeError
from .model import Model
from .views import KVState, LogitsWanted

T = TypeVar("T")

#: Seconds between checks, while a generation waits for its batch, that the compute
#: thread is alive and not stuck in one decode past `compute_bound()`.
WATCH_S = 0.5

#: ggml's GGML_FA_TILE_Q: from this many query rows in a batch, CPU flash attention
#: takes its tiled F32 path (tests/test_parallel.py fails if a llama.cpp moves it).
WIDE = 64


class ComputeLost(DecodeError):
    """The batcher's thread died, or one decode (or call) on it has run past the bound:
    every generation would wait on it for ever."""


def compute_bound(default: float = 300.0) -> float:
    """Seconds one batch or call may take on the compute thread before it counts as hung
    (SPECLLAMA_COMPUTE_TIMEOUT): far above a 512-token batch of a big model on a CPU."""
    try:
        value = float(os.environ.get("SPECLLAMA_COMPUTE_TIMEOUT", "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


def pieces(n: int, alone: int, most: int) -> list[int]:
    """The sizes a prompt of n tokens goes in on a shared context: the chunks a model
    of n_batch `alone` decodes it in by itself (Model.decode), a chunk of WIDE or more
    then cut into near-equal pieces of at most `most` (>= 2 WIDE), each still WIDE or
    more, so others' rounds go between them."""
    chunks = [alone] * ((n - 1) // alone) + [(n - 1) % alone + 1]
    out: list[int] = []
    for c in chunks:
        m = 1 if c < WIDE else -(-c // most)
        out += [c // m + (i < c % m) for i in range(m)]
    return out


@dataclass
class _Share:
    """One sequence's part of the next batch, and what became of it."""

    view: SeqView
    tokens: list[int]
    start: int
    logits: LogitsWanted
    done: threading.Event = field(default_factory=threading.Event)
    offset: int = 0  # its first row in the batch
    batch_tokens: int = 0
    rc: int = 0
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass
class _Call:
    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class Batcher:
    """The thread that runs every decode of a parallel engine: the batches of the
    shared models, each fired once every active sequence has handed in its share, and
    other calls (measuring auto's costs) as they come."""

    def __init__(self, base: Model, on_lost: Callable[[str], None] | None = None) -> None:
        """base: the target, loaded with n_seq sequences (a draft model may join
        through its own views). on_lost(why): the compute thread is found dead or hung
        (before ComputeLost is raised in the generation that found it); an engine
        process ends there, so that it is started again (server/child.py)."""
        self.base = base
        self.bound_s = compute_bound()
        self._on_lost = on_lost
        self._busy_since: float | None = None  # the compute thread's job began then
        #: Held while a shared context changes: a batch, or a view's cache edit.
        self.lock = threading.RLock()
        self._cond = threading.Condition()
        self._active: set[int] = set()
        self._shares: dict[int, _Share] = {}
        self._calls: deque[_Call] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="specllama-compute",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ any thread
    @contextlib.contextmanager
    def active(self, seq: int) -> Iterator[None]:
        """While a generation on `seq` decodes round after round: no batch fires
        without its share (a request setting up or tidying up is not held in it)."""
        with self._cond:
            self._active.add(seq)
        try:
            yield
        finally:
            with self._cond:
                self._active.discard(seq)
                self._cond.notify_all()

    def in_progress(self) -> int:
        """Generations in progress (each active sequence)."""
        return len(self._active)

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the batcher's thread; its value, or its error raised here."""
        if threading.current_thread() is self._thread:
            return fn()
        job = _Call(fn)
        with self._cond:
            if self._closed:
                raise DecodeError("the engine is closing")
            self._calls.append(job)
            self._cond.notify_all()
        self._wait(job.done)
        if job.error is not None:
            raise job.error
        return job.value

    def hand_in(self, share: _Share) -> _Share:
        """Put a sequence's tokens into the next batch; returns once it has run."""
        seq = share.view.seq
        with self._cond:
            if self._closed:
                raise DecodeError("the engine is closing")
            # A sequence outside `active` (a request setting up: auto measuring its
            # costs, a recurrent cache cut back) joins the next batch, holding none back.
            self._shares[seq] = share
            self._cond.notify_all()
        self._wait(share.done)
        if share.error is not None:
            raise share.error
        return share

    def lost(self) -> str | None:
        """Why the compute thread cannot be counted on (None: it can)."""
        if not self._thread.is_alive() and not self._closed:
            return "the engine's compute thread died"
        since = self._busy_since
        if since is not None and time.monotonic() - since > self.bound_s:
            return (f"a decode has not returned for {self.bound_s:g} s: the engine hangs "
                    "(SPECLLAMA_COMPUTE_TIMEOUT sets this bound)")
        return None

    def _wait(self, done: threading.Event) -> None:
        """Until `done`; a dead or hung compute thread raises ComputeLost instead of
        leaving this generation, and every other, waiting for ever."""
        while not done.wait(WATCH_S):
            why = self.lost()
            if why is not None:
                if self._on_lost is not None:
                    self._on_lost(why)
                raise ComputeLost(why)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(30)

    # ------------------------------------------------------------ its thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._calls and not self._ready():
                    self._cond.wait()
                if self._calls:
                    job: _Call | None = self._calls.popleft()
                    shares: list[_Share] = []
                elif self._ready():
                    job, shares = None, self._next_batch()
                else:  # closed
                    self._fail_all(DecodeError("the engine is closing"))
                    return
                self._busy_since = time.monotonic()
            if job is not None:
                try:
                    job.value = job.fn()
                except BaseException as exc:  # handed to the caller
                    job.error = exc
                self._busy_since = None
                job.done.set()
            else:
                self._fire(shares)
                self._busy_since = None

    def _ready(self) -> bool:
        """Every generation in progress is waiting for a batch."""
        return bool(self._shares) and self._active <= self._shares.keys()

    def _next_batch(self) -> list[_Share]:
        """Shares of one model: the draft model's first (the generations drafting then
        join the others waiting on the target). The longest waiting share decides the
        side of WIDE; those of the same side join it, narrow ones while they stay under
        WIDE together, and the rest wait for the next batch."""
        model = next((s.view.base for s in self._shares.values()
                      if s.view.base is not self.base), self.base)
        mine = [s for s in self._shares.values() if s.view.base is model]  # oldest first
        wide = len(mine[0].tokens) >= WIDE
        room = model.shared.n_batch if wide else WIDE - 1
        batch, n = [], 0
        for share in mine:
            k = len(share.tokens)
            if (k >= WIDE) == wide and n + k <= room:
                batch.append(self._shares.pop(share.view.seq))
                n += k
        return batch

    def _fire(self, shares: list[_Share]) -> None:
        base = shares[0].view.base
        n = 0
        try:
            with self.lock:
                batch = base.shared.batch
                for share in shares:
                    share.offset = n
                    share.view.fill(batch, n, share.tokens, share.start, share.logits)
                    n += len(share.tokens)
                batch.n_tokens = n
                t0 = time.perf_counter()
                rc = base.submit(batch)
                seconds = time.perf_counter() - t0
        except BaseException as exc:
            for share in shares:
                share.error = exc
                share.done.set()
            return
        for share in shares:
            share.rc, share.seconds, share.batch_tokens = rc, seconds, n
            share.done.set()

    def _fail_all(self, error: BaseException) -> None:
        items: list[_Call | _Share] = [*self._calls, *self._shares.values()]
        for item in items:
            item.error = error
            item.done.set()
        self._calls.clear()
        self._shares.clear()


class SeqView(Model):
    """Sequence `seq` of a model shared through the batcher (the target by default): a
    Model whose decodes join the next batch (a prompt in chunks of an equal share of
    the batch, so the others keep streaming while it is read). It holds its own
    sequence's state; the context is its model's `shared`, held by reference."""

    def __init__(self, batcher: Batcher, seq: int, model: Model | None = None) -> None:
        """model: the one whose context this view shares (the batcher's base by default);
        kept alive while the view is, as it frees the context."""
        self.base = model or batcher.base  # no load: its context, held by reference
        shared = self.base.shared
        self._adopt(shared.model)
        spare = seq + shared.n_seq if self.base.rewinder.spare >= 0 else -1
        self._view(shared, seq, self.base.rewinder.for_seq(seq, spare))
        self.batcher = batcher
        # A new prompt's pieces: an equal share of the batch, and wide enough to stay wide.
        self.n_batch = min(shared.n_batch, max(shared.n_batch // shared.n_seq, 2 * WIDE))
        self._offset = 0
        self._rows = 0

    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        if len(tokens) <= self.n_batch or logits == "all":  # as alone (Model.decode)
            super().decode(tokens, logits)
            return
        at = 0
        for size in pieces(len(tokens), self.shared.n_batch, self.n_batch):
            at += size
            super().decode(tokens[at - size:at], logits if at == len(tokens) else "none")

    def _run(self, tokens: list[int], logits: LogitsWanted, start: int) -> tuple[int, float]:
        share = self.batcher.hand_in(_Share(self, tokens, start, logits))
        self._offset, self._rows = share.offset, len(tokens)
        self.others = share.batch_tokens - len(tokens)
        return share.rc, share.seconds

    @property
    def companions(self) -> int:  # type: ignore[override]
        """The other requests in progress now: the next batch's, for auto to price
        a round with (those that arrived since the last batch included)."""
        return self.batcher.in_progress() - 1

    def batch_row(self, i: int) -> int:
        return self._offset + (i if i >= 0 else self._rows + i)

    def pos_max(self) -> int:
        with self.batcher.lock:
            return super().pos_max()

    def _cut_memory(self, n: int, length: int) -> int:
        with self.batcher.lock:
            return super()._cut_memory(n, length)

    def checkpoint(self, next_batch: int | None = None) -> None:
        if self.rewinder.best == "trim":  # a KV cache: nothing to keep, no lock to take
            return
        self._settle_before(next_batch)  # a decode: the batcher's, outside its lock
        with self.batcher.lock:
            super().checkpoint(next_batch)

    def clear(self) -> None:
        with self.batcher.lock:
            super().clear()

    def save_state(self) -> KVState:
        self.settle()  # a decode: the batcher's, outside its lock
        with self.batcher.lock:
            return super().save_state()

    def restore(self, state: KVState) -> None:
        with self.batcher.lock:
            super().restore(state)

    def set_threads(self, n_threads: int) -> None:
        self.batcher.call(lambda: self.base.set_threads(n_threads))

    def close(self) -> None:
        """The base (the owner of the context) is closed by whoever made the batcher."""
