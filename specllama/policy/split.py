"""Drafting ahead or in turn: whether the draft model should draft on cores of its own
while the target verifies (engine/drafting/ahead.py), and on how many.

Taking turns, each model decodes on every thread: a round costs
    C(k) = T_t(k+1) + k T_d + w_d                 (policy/costs.py)
Drafting ahead, the target verifies on N - n threads while the draft model draws on n
of its own; where every draft was accepted and the target's own token was the one the
draft model drew next (chance a^(k+1)), the next round's draft is already drawn:
    C'(k) = T'_t(k+1) + T'_d / 2 + (1 - pi_k) (k T_d + w_d)
    pi_k  = a^(k+1) min(1, T'_t(k+1) / ((k+1) T'_d))   (the draft must keep up)
(T'_d / 2: the verdict waits, on average, for half the draft step then in flight)
where T'_t and T'_d are measured with both models decoding at once (they share the
memory bandwidth as well as the cores); a draft drawn in turn runs on every thread
(T_d). The better of the two at the acceptance `auto` expects decides, by a margin; on 2
cores drafting ahead loses (docs/lab/2026-12-laptop-class.md, "Drafting on idle cores").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.decoder import AHEAD_MAX, SpeculativeDecoder
from ..engine.llama import Model
from .calibration import cache_key, cache_root
from .costs import RoundCosts, expected_tokens
from .state import AutoState

#: Drafting ahead must be expected this much faster than taking turns.
SPLIT_MARGIN = 0.05
#: Target batch sizes timed with the draft model decoding at the same time.
SIZES = (1, 2, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class Concurrent:
    """Costs measured with both models decoding at once: the target's T'(n) for each n of
    `sizes` on `threads - draft_threads` threads, the draft model's step on the rest."""

    threads: int
    draft_threads: int
    sizes: tuple[int, ...]
    target: tuple[float, ...]
    draft: float

    def t(self, n: int) -> float:
        """T'(n), interpolated between the sizes measured (the largest beyond them)."""
        for i, size in enumerate(self.sizes):
            if n <= size:
                if i == 0 or size == n:
                    return self.target[i]
                lo, hi = self.sizes[i - 1], size
                w = (n - lo) / (hi - lo)
                return self.target[i - 1] + w * (self.target[i] - self.target[i - 1])
        return self.target[-1] * n / self.sizes[-1]


@dataclass(frozen=True)
class Split:
    """The choice: `draft_threads` (0: in turn) and what the cost model expected of each,
    in tokens per second at acceptance `alpha`."""

    draft_threads: int
    in_turn: float
    ahead: float
    alpha: float

    def describe(self) -> str:
        gain = self.ahead / self.in_turn if self.in_turn else 0.0
        if self.draft_threads:
            return (f"drafting ahead on {self.draft_threads} thread(s): expected {gain:.2f}x "
                    f"drafting in turn at {self.alpha:.0%} acceptance")
        return (f"drafting in turn: drafting ahead would run at {gain:.2f}x of it at "
                f"{self.alpha:.0%} acceptance (both models at once share the cores)")


def ahead_round_s(c: Concurrent, k: int, alpha: float, in_turn: RoundCosts) -> float:
    """C'(k): a round's expected seconds with drafts drawn ahead (module docstring);
    `in_turn`: the costs of drafting in turn (its draft step and wake-up)."""
    verify = c.t(k + 1)
    if k == 0:
        return verify
    drawn = min(1.0, verify / ((k + 1) * c.draft)) if c.draft > 0 else 1.0
    reuse = alpha ** (k + 1) * drawn
    step = in_turn.draft + in_turn.overhead_per_draft
    # the worker stops after the step in flight, unless it drew all it may before
    wait = c.draft / 2 if AHEAD_MAX * c.draft > verify else 0.0
    return verify + wait + in_turn.overhead + (1.0 - reuse) * (k * step + in_turn.draft_wake)


def best_rate(round_s: Sequence[float], alpha: float) -> float:
    """max over k of E(k) / C(k), `round_s[k]` being C(k)."""
    return max(expected_tokens(alpha, k) / s for k, s in enumerate(round_s) if s > 0)


def choose(in_turn: RoundCosts, measured: Sequence[Concurrent], alpha: float,
           margin: float = SPLIT_MARGIN) -> Split:
    """The split whose best k runs fastest at acceptance `alpha`: in turn (0) unless
    drafting ahead on some measured split beats it by `margin`."""
    ks = range(in_turn.k_max + 1)
    serial = best_rate([in_turn.round_s(k) for k in ks], alpha)
    rates = {c.draft_threads: best_rate([ahead_round_s(c, k, alpha, in_turn) for k in ks],
                                        alpha) for c in measured}
    if not rates:
        return Split(0, serial, 0.0, alpha)
    n, rate = max(rates.items(), key=lambda item: item[1])
    return Split(n if rate > serial * (1 + margin) else 0, serial, rate, alpha)


def candidates(threads: int) -> list[int]:
    """Draft thread counts worth measuring: a quarter and an eighth of the threads (one
    at least, and never half or more)."""
    return sorted({n for n in (max(1, threads // 8), max(1, threads // 4)) if n < threads})


def measure(target: Model, draft: Model, threads: int, draft_threads: int,
            reps: int = 5) -> Concurrent:
    """T'(n) of the target on `threads - draft_threads` threads while the draft model
    decodes one token after another on `draft_threads`, and the draft's step meanwhile.
    Both caches are put back as they were; the models' threads too."""
    saved = (target.n_threads, draft.n_threads)
    base_t, base_d = len(target.cached), len(draft.cached)
    target.set_threads(threads - draft_threads)
    draft.set_threads(draft_threads)
    steps: list[float] = []
    stop, drafting = threading.Event(), threading.Event()

    def keep_drafting() -> None:
        token = draft.bos if draft.bos >= 0 else 0
        while not stop.is_set() and len(draft.cached) < draft.n_ctx - 1:
            t0 = time.perf_counter()
            draft.decode([token], "last")
            steps.append(time.perf_counter() - t0)
            drafting.set()
            if len(draft.cached) - base_d >= 32:
                draft.truncate(base_d)
    worker = threading.Thread(target=keep_drafting, daemon=True)
    worker.start()
    try:
        # a tiny target finishes before the thread is scheduled: time only once it drafts
        while worker.is_alive() and not drafting.wait(0.01):
            pass
        times = [statistics.median(_timed(target, n, base_t) for _ in range(reps))
                 for n in SIZES]
    finally:
        stop.set()
        worker.join()
        draft.truncate(base_d)
        target.set_threads(saved[0])
        draft.set_threads(saved[1])
    step = statistics.median(steps) if steps else 0.0
    return Concurrent(threads, draft_threads, SIZES, tuple(times), step)


def _timed(model: Model, n: int, base: int) -> float:
    token = model.bos if model.bos >= 0 else 0
    t0 = time.perf_counter()
    model.decode([token] * n, "all")
    elapsed = time.perf_counter() - t0
    model.truncate(base)
    return elapsed


def for_decoder(decoder: SpeculativeDecoder, setting: int | str,
                say: Callable[[str], None] = lambda _: None) -> Split | None:
    """Apply `draft_threads` to a loaded pair: a number as it is; "auto" measured on
    the split candidates and decided at the acceptance auto expects of the draft model
    (None where there is nothing to decide: no draft model, or one thread)."""
    threads = decoder.threads
    if decoder.draft is None or threads < 2:
        return None
    if isinstance(setting, int):
        decoder.set_threads(threads, min(setting, threads - 1))
        return None
    state = AutoState.for_decoder(decoder)
    measured = [measured_once(decoder.target, decoder.draft, threads, n, say)
                for n in candidates(threads)]
    split = choose(state.costs("model"), measured, state.source("model").acceptance.overall)
    decoder.set_threads(threads, split.draft_threads)
    return split


def measured_once(target: Model, draft: Model, threads: int, draft_threads: int,
                  say: Callable[[str], None] = lambda _: None) -> Concurrent:
    """`measure`, kept in the cache beside the calibrations (per pair of model files,
    thread split, machine and llama.cpp version)."""
    key = {"target": cache_key(target.path, threads - draft_threads),
           "draft": cache_key(draft.path, draft_threads), "sizes": list(SIZES)}
    ident = json.dumps(key, sort_keys=True)
    path = cache_root() / "splits" / (
        f"{target.path.stem}.{draft.path.stem}.t{threads}.d{draft_threads}."
        f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data["key"] == key:
            return Concurrent(threads, draft_threads, tuple(data["sizes"]),
                              tuple(data["target"]), float(data["draft"]))
    say(f"measuring both models decoding at once, the draft on {draft_threads} of "
        f"{threads} threads (once; a few seconds)")
    c = measure(target, draft, threads, draft_threads)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "sizes": list(c.sizes), "target": list(c.target),
                                   "draft": c.draft}), encoding="utf-8")
        os.replace(tmp, path)
    return c
