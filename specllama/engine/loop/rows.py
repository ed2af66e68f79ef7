"""Reading the target's rows of a verify pass for the acceptance rule, and where a stop
string cuts the output."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

import numpy as np

from ..drafting.base import Draft
from ..sampling import (
    Row,
    SamplingParams,
    filtered,
    probabilities,
    sample_logits_and_p,
    weights,
)


class Rows:
    """Reads the target's rows for the acceptance rule and keeps, for the round's record,
    q_i(d_i) and p_i(d_i) of each row read (None where none is). Greedy p is one-hot:
    1 where d_i is the target's argmax, else 0."""

    def __init__(self, draft: Draft, logits_row: Callable[[int], np.ndarray],
                 params: SamplingParams) -> None:
        self.drafts = draft.tokens
        self._logits_row = logits_row
        self._params = params
        self.p: list[float | None] = [None] * len(self.drafts)
        self.q = tuple(1.0 if q is None else _at(q, d) for d, q in zip(self.drafts, draft.qs))

    def probs(self, i: int) -> LazyP:
        """p_i, the target's processed distribution at row i (normalised as read)."""
        p = LazyP(self._logits_row(i), self._params)
        if i < len(self.drafts):
            self.p[i] = _at(p, self.drafts[i])
        return p

    def draw(self, i: int, rng: np.random.Generator) -> tuple[int, float]:
        """A token straight from p_{i+1} (the bonus, or a plain step), and its p."""
        return sample_logits_and_p(self._logits_row(i), self._params, rng)

    def argmax(self, i: int) -> int:
        best = int(np.argmax(self._logits_row(i)))
        if i < len(self.drafts):
            self.p[i] = 1.0 if best == self.drafts[i] else 0.0
        return best


class LazyP:
    """p of one verify row, normalised only as far as it is read (`sampling.Row`). The
    rule reads p(d) of each draft it accepts: the float32 weights and their float64 sum
    give it, without the normalised float64 vector `probabilities` builds (a quarter of a
    row's cost at 49k ids, `bench.overhead --items`); the vector is made once something
    needs all of it (the residual after a rejection). With top-k, top-p or min-p it is
    `probabilities` at once. Either way p(d) is the float64 weight over the float64 sum."""

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self.shape: tuple[int, ...] = logits.shape
        self._vector: np.ndarray | None = None
        if params.greedy or filtered(params, logits.shape[-1]):
            self._vector = probabilities(logits, params)
            return
        self._weights = weights(logits, params.temperature)
        self._total = float(np.add.reduce(self._weights, dtype=np.float64))

    def __getitem__(self, token: int) -> float:
        if self._vector is not None:
            return float(self._vector[token])
        return float(self._weights[token]) / self._total

    def vector(self) -> np.ndarray:
        """All of p (float64, sums to 1)."""
        if self._vector is None:
            self._vector = self._weights.astype(np.float64)
            self._vector /= self._total
        return self._vector


def _at(dist: np.ndarray | Row, token: int) -> float:
    """dist(token); 0 for an id beyond it (pairs whose vocabularies differ in size)."""
    return float(dist[token]) if token < dist.shape[0] else 0.0


def tokens_covering(piece: Callable[[int], bytes], tokens: Sequence[int], n_chars: int) -> int:
    """The fewest leading `tokens` whose text reaches `n_chars` characters: where a stop
    string cut the text, the token it begins in is the last one kept. One pass, decoding
    as TextStream does (a character split across tokens counts once it is whole)."""
    if n_chars <= 0:
        return 0
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    length = 0
    for j, token in enumerate(tokens, 1):
        length += len(utf8.decode(piece(token)))
        if length >= n_chars:
            return j
    return len(tokens)
