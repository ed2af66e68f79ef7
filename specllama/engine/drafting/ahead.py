"""Drafting ahead on idle cores: while the target verifies a draft, the draft model goes
on drafting after it on threads of its own, as if the whole draft were accepted (PEARL's
post-verify drafting, Liu et al. 2024).

If the target accepts every draft token and its own next token is the one the draft model
drew next, the text stands where the draft model already is: the tokens it drew after
that one open the next round's draft, each with the q it was drawn from, and the time
they took was hidden behind the target's. Otherwise they are dropped.

Exactness: each token drawn ahead follows q given the tokens before it, with randomness
of its own (a generator the worker alone uses). Whether they are kept depends on the
target's verdict and on the first token drawn ahead, never on the later ones, so given
the text they continue, they are draws from q like any other draft.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..llama import DraftModel
from ..penalties import penalized_after
from ..sampling import SamplingParams, confidence, probabilities, sample


@dataclass
class Ahead:
    """What the draft model drew after a draft: each token with its q and confidence.
    The last one is `pending` (drawn, not decoded) unless the worker stopped at a row."""

    tokens: list[int] = field(default_factory=list)
    qs: list[np.ndarray | None] = field(default_factory=list)
    sure: list[float] = field(default_factory=list)
    pending: bool = True
    seconds: float = 0.0  # inside the draft model's decodes
    error: BaseException | None = None


class AheadWorker:
    """A thread of its own that, given a job (`start`), decodes `first` (the draft's last
    token) and goes on drawing, one token a step, until `stop()` or `limit` tokens. The
    draft model's cache must hold the text before `first`, and nothing else may use the
    model between `start` and `stop`. One thread serves every round (`close` ends it)."""

    def __init__(self, model: DraftModel, *, p_min: float,
                 ends: Callable[[int], bool]) -> None:
        self.model, self.p_min, self.ends = model, p_min, ends
        self._cv = threading.Condition()
        self._job: tuple[int, SamplingParams, np.random.Generator, int] | None = None
        self._busy = self._closed = False
        self._stopping = threading.Event()
        self.result = Ahead()
        self._after: Sequence[int] = ()  # the text `first` ends (for the penalties)
        self._thread = threading.Thread(target=self._serve, name="specllama-ahead", daemon=True)
        self._thread.start()

    def start(self, first: int, params: SamplingParams, rng: np.random.Generator,
              limit: int, after: Sequence[int] = ()) -> None:
        """after: the text `first` ends, the draft included (the repetition penalties'
        window; only read where they are on)."""
        with self._cv:
            self._after = after
            self.result, self._job, self._busy = Ahead(), (first, params, rng, limit), True
            self._stopping.clear()
            self._cv.notify_all()

    def stop(self) -> Ahead:
        """Stop after the decode in flight (at most one draft step) and hand over."""
        self._stopping.set()
        with self._cv:
            self._cv.wait_for(lambda: not self._busy)
        return self.result

    def close(self) -> None:
        self.stop()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def _serve(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._job is not None or self._closed)
                if self._closed:
                    return
                job, self._job = self._job, None
            assert job is not None
            self._run(*job)
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def _run(self, token: int, params: SamplingParams, rng: np.random.Generator,
             limit: int) -> None:
        out = self.result
        try:
            while not self._stopping.is_set() and len(out.tokens) < limit:
                t0 = time.perf_counter()
                self.model.decode([token], "last")
                out.seconds += time.perf_counter() - t0
                drawn = self._draw(self.model.logits_row(-1), params, rng)
                if drawn is None:
                    out.pending = False  # `token` is decoded, nothing drawn after it
                    return
                token = drawn
                if self.ends(token):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the loop's thread
            out.error = exc

    def _draw(self, logits: np.ndarray, params: SamplingParams,
              rng: np.random.Generator) -> int | None:
        """One token from q (None where the draft model is too unsure to draw one); a row
        follows the draft's text and the tokens drawn ahead before it."""
        out = self.result
        if params.penalties is not None:
            logits = penalized_after(logits, self._after, params.penalties, out.tokens)
        q = None if params.greedy else probabilities(logits, params)
        sure = confidence(logits, params, q)
        if q is not None and sure < self.p_min:
            return None
        token = int(np.argmax(logits)) if q is None else sample(q, rng)
        out.tokens.append(token)
        out.qs.append(q)
        out.sure.append(sure)
        return token
