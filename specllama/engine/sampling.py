"""Pure numpy sampling and the exact acceptance rule.

Names follow the papers (Leviathan et al. 2023; Chen et al. 2023): `p` is the
target's processed distribution, `q` the draft's, `residual` the distribution a
rejected position is resampled from. Every random draw takes an injected
`np.random.Generator`, so all of this is testable without a model.

Processing order (the same for p and q): the repetition penalties (penalties.py, applied
by whoever reads the row, who knows the text before it), temperature, then top-k, top-p,
min-p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from ..errors import InvalidParameterError
from .penalties import Penalties

# Candidates examined before falling back to a full sort for top-p; nucleus
# sets on real vocabularies are almost always far smaller.
_TOP_P_PARTIAL = 512
# Block size of the two-level inverse-CDF draw in `sample`.
_BLOCK = 256
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Up to this 1/T, z * (1/T) overflows only for |z| > 3e34, no logit a model writes (-inf,
# a mask's, stays -inf without a warning); were one that far, numpy would warn and the
# product would still be -inf, weight 0, as under errstate.
_NO_OVERFLOW_SCALE = 1e4


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from logits. temperature 0 means greedy (argmax). penalties:
    the repetition penalties, None where they change nothing (a `Penalties` that changes
    nothing becomes None, so the round loop's one check per row is `is not None`)."""

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    penalties: Penalties | None = None

    def __post_init__(self) -> None:
        validate_sampling(self)
        if self.penalties is not None and not self.penalties.active:
            object.__setattr__(self, "penalties", None)  # frozen: normalised once, here

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def validate_sampling(params: SamplingParams) -> None:
    """Raise InvalidParameterError naming the first out-of-range value."""
    t, k, tp, mp = params.temperature, params.top_k, params.top_p, params.min_p
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not np.isfinite(t) or t < 0:
        raise InvalidParameterError(f"temperature must be a number >= 0, got {t!r}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise InvalidParameterError(f"top_k must be an integer >= 0 (0 = off), got {k!r}")
    if not isinstance(tp, (int, float)) or isinstance(tp, bool) or not (0.0 < tp <= 1.0):
        raise InvalidParameterError(f"top_p must be in (0, 1], got {tp!r}")
    if not isinstance(mp, (int, float)) or isinstance(mp, bool) or not (0.0 <= mp <= 1.0):
        raise InvalidParameterError(f"min_p must be in [0, 1], got {mp!r}")
    seed = params.seed
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
    if params.penalties is not None and not isinstance(params.penalties, Penalties):
        raise InvalidParameterError(
            f"penalties must be a Penalties or None, got {params.penalties!r}")


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution over the vocabulary (float64, sums to 1).

    Greedy gives a one-hot vector on the argmax (first index on ties).
    """
    n = logits.shape[-1]
    if params.greedy:
        out = np.zeros(n, dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out

    z = _scaled(logits, params.temperature)
    keep: np.ndarray | None = None  # indices that survive filtering; None = all

    if 0 < params.top_k < n:
        keep = np.argpartition(-z, params.top_k - 1)[: params.top_k]

    if params.top_p < 1.0:
        keep = _nucleus(z, keep, params.top_p)

    if keep is None:
        probs = np.exp(z, out=z).astype(np.float64)  # z's max is 0 already
    else:
        probs = np.zeros(n, dtype=np.float64)
        zk = z[keep]
        probs[keep] = np.exp(zk - zk.max())
    probs /= probs.sum()

    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
        probs /= probs.sum()
    return probs


def _scaled(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(logits - max) / T as a new float32 array, its largest entry 0. Shifting before
    scaling keeps every temperature finite: logits / 1e-38 overflow to inf, and inf - inf
    is NaN; (logits - max) / T only reaches -inf, whose weight is exactly 0. exp in
    float32 is faster than in float64 and off by ~1e-7 relative: far below anything
    a statistical test (or a user) could see; sums and normalisation are float64."""
    z = np.subtract(logits, np.maximum.reduce(logits), dtype=np.float32)
    scale = 1.0 / temperature
    if scale <= _NO_OVERFLOW_SCALE:  # (errstate costs ~10 us a row: not where unneeded)
        return np.multiply(z, np.float32(scale), out=z)
    with np.errstate(over="ignore"):  # a product past float32 is -inf: weight 0, as it is
        if scale <= _FLOAT32_MAX:
            return np.multiply(z, np.float32(scale), out=z)
        # 1/T is past float32 (T < ~3e-39): divide in float64 instead, where 0 / T stays
        # 0 (inf * 0 would be NaN) and a gap of one float32 ulp still counts.
        return np.divide(z, temperature, dtype=np.float64).astype(np.float32)


def filtered(params: SamplingParams, n: int) -> bool:
    """Whether top-k, top-p or min-p cut a row of n ids: else p is `weights` over their
    sum, which the fast paths use."""
    return 0 < params.top_k < n or params.top_p < 1.0 or params.min_p > 0.0


def weights(logits: np.ndarray, temperature: float) -> np.ndarray:
    """exp((logits - max) / T) in float32, unnormalised, the largest 1: p without filters
    is these over their float64 sum."""
    z = _scaled(logits, temperature)
    return np.exp(z, out=z)


def _exp_shifted(z: np.ndarray) -> np.ndarray:
    """exp(z - max z), in place: unnormalised weights, the largest 1."""
    z -= np.maximum.reduce(z)
    return np.exp(z, out=z)


def _nucleus(z: np.ndarray, keep: np.ndarray | None, top_p: float) -> np.ndarray:
    """Smallest set of highest-probability indices whose mass reaches top_p."""
    cand = np.arange(z.shape[0]) if keep is None else keep
    zc = z[cand]
    w = np.exp(zc - zc.max()).astype(np.float64)
    total = w.sum()
    if cand.shape[0] > _TOP_P_PARTIAL:
        # Sorting only the head is exact when the head alone already reaches top_p.
        head = np.argpartition(-w, _TOP_P_PARTIAL - 1)[:_TOP_P_PARTIAL]
        if w[head].sum() >= top_p * total:
            cand, w = cand[head], w[head]
    order = np.argsort(-w, kind="stable")
    cum = np.cumsum(w[order])
    # A hair of slack so a set summing to exactly top_p is not lost to rounding.
    n_keep = int(np.searchsorted(cum, top_p * total * (1 - 1e-12), side="left")) + 1
    return cand[order[: min(n_keep, order.shape[0])]]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p at temperature 1 (-inf stays -inf: tokens a constraint forbids)."""
    z = logits.astype(np.float64)
    z -= z.max()
    return z - np.log(np.exp(z).sum())


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector by inverse CDF.

    `probs` may be unnormalised weights, float32 or float64: the draw is scaled by
    their total. Two levels (blocks, then within one block) so a 50k–250k
    vocabulary costs one vectorised sum instead of a full cumulative sum; the draw
    is the same inverse CDF.
    """
    return _draw(probs, rng)[0]


def _draw(probs: np.ndarray, rng: np.random.Generator) -> tuple[int, float]:
    """`sample`, and the total of `probs` it summed on the way (one pass fewer for a
    caller that normalises)."""
    n = probs.shape[0]
    if n <= 4 * _BLOCK:
        total = float(np.add.reduce(probs, dtype=np.float64))
        return _invert(probs, rng.random() * total), total
    full = n - n % _BLOCK
    # Block sums in the input's precision (256 terms, pairwise: ~1e-7 relative),
    # accumulated in float64; every numpy call counts right after a decode.
    block_mass = np.add.reduce(probs[:full].reshape(-1, _BLOCK), axis=1)
    block_cdf = np.add.accumulate(block_mass, dtype=np.float64)
    head = float(block_cdf[-1])
    tail = float(np.add.reduce(probs[full:], dtype=np.float64)) if full < n else 0.0
    u = rng.random() * (head + tail)
    if u >= head and tail > 0.0:  # the last, partial block
        return full + _invert(probs[full:], u - head), head + tail
    b = int(min(np.searchsorted(block_cdf, u, side="right"), block_cdf.shape[0] - 1))
    while block_mass[b] <= 0.0:  # u landed on a rounding edge next to an empty block
        b -= 1
    u -= block_cdf[b] - block_mass[b]
    return b * _BLOCK + _invert(probs[b * _BLOCK : (b + 1) * _BLOCK], u), head + tail


def _invert(probs: np.ndarray, u: float) -> int:
    """First index whose CDF (of `probs`, summed in float64) exceeds u, never one with
    zero probability (rounding)."""
    cdf = np.add.accumulate(probs, dtype=np.float64)
    i = int(np.searchsorted(cdf, u, side="right"))
    if i >= probs.shape[0] or probs[i] <= 0.0:
        i = int(np.flatnonzero(probs[: min(i, probs.shape[0] - 1) + 1] > 0.0)[-1])
    return i


def sample_logits_and_p(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[int, float]:
    """One token from the processed distribution of `logits`, and its probability there:
    the same draw as `sample(probabilities(logits, params), rng)` (one uniform, the same
    inverse CDF).

    The round loop calls this for every token the target draws itself, right after a
    decode has flushed the CPU caches, where every numpy call costs tens of
    microseconds: without filters it samples the float32 weights exp((l - max) / T) as
    they are, skipping the normalised float64 vector `probabilities` builds (0.3 ms a
    token here).
    """
    if params.greedy:
        return int(np.argmax(logits)), 1.0
    n = logits.shape[-1]
    if filtered(params, n):
        probs = probabilities(logits, params)
        token = sample(probs, rng)
        return token, float(probs[token])
    w = weights(logits, params.temperature)
    token, total = _draw(w, rng)
    return token, float(w[token]) / total


def confidence(logits: np.ndarray, params: SamplingParams, q: np.ndarray | None = None) -> float:
    """The draft model's probability of its likeliest token: the top of q (its processed
    distribution, computed from `logits` unless given), or for greedy, where q is
    one-hot, the top of the softmax of the raw logits (the model's own certainty)."""
    if params.greedy:
        weights = _exp_shifted(np.array(logits, dtype=np.float32))  # a copy: logits stay
        return 1.0 / float(np.add.reduce(weights, dtype=np.float64))
    return float((probabilities(logits, params) if q is None else q).max())


def on_target_vocab(q: np.ndarray, n_target: int) -> np.ndarray:
    """q over the target's vocabulary of `n_target` ids, the one place p and q are aligned.

    A pair may differ by up to 128 ids at the end of the vocabulary (Qwen2.5 7B has 152,064,
    its 0.5B draft 151,936). Ids the draft lacks get q = 0. Ids past the target's end are
    cut: the target gives them p = 0, so a draft of one is always rejected
    (`acceptance_probability`), and max(0, p − q) is 0 there. Not renormalised: the rule
    needs the q the draft token was really drawn from.
    """
    n = q.shape[0]
    if n == n_target:
        return q
    if n > n_target:
        return q[:n_target]
    out = np.zeros(n_target, dtype=q.dtype)
    out[:n] = q
    return out


def acceptance_probability(p: np.ndarray | Row, q: np.ndarray | None, token: int) -> float:
    """min(1, p(d)/q(d)); q=None means the draft put all its mass on `token`. (Of p only
    p(d) and its length are read: a `Row` will do.)"""
    if token >= p.shape[0]:
        return 0.0  # an id only the draft has: the target gives it p = 0
    q_d = 1.0 if q is None else float(q[token])
    if q_d <= 0.0:
        # The draft cannot propose a token it gives zero mass; treat defensively.
        return 0.0
    return min(1.0, float(p[token]) / q_d)


def first_draft_acceptance(
    draft_logits: np.ndarray, token: int, p_token: float, params: SamplingParams,
    p_min: float = 0.0,
) -> float | None:
    """How likely the draft's first token would have been accepted at a position where
    the target drew `token` alone, with probability p_token = p(token); None where the
    draft would not have drafted at all (its top token below `p_min`).

    Greedy: 1 if the draft's argmax is that token, else 0 (exact). Sampling: min(1,
    q(x)/p(x)) for x ~ p, whose expectation is sum_x min(p(x), q(x)), the acceptance
    probability of a first draft token; one draw of it is an unbiased estimate.
    """
    if params.greedy:
        return float(int(np.argmax(draft_logits)) == token)
    q = probabilities(draft_logits, params)
    if q.max() < p_min:
        # Not drafted there, so not a rejection either: counting these made the F32
        # pair's estimate 0.53 at T = 0.8 where drafts were accepted 0.7 of the time.
        return None
    if token >= q.shape[0] or p_token <= 0.0:
        return 0.0
    return min(1.0, float(q[token]) / p_token)


def residual(p: np.ndarray, q: np.ndarray | None, token: int) -> np.ndarray:
    """norm(max(0, p − q)): where a rejected position is resampled from."""
    if q is None:
        r = p.copy()
        if token < r.shape[0]:
            r[token] = 0.0
    else:
        r = np.maximum(p - on_target_vocab(q, p.shape[0]), 0.0)
    total = r.sum()
    if total <= 0.0:
        # Only reachable when p == q up to rounding, where rejection has ~zero probability.
        return p
    return r / total


def check_proposal(p: np.ndarray, token: int, rng: np.random.Generator) -> int:
    """A token proposed with all its mass (a lookup), checked against p as the acceptance
    rule checks any draft: kept with probability p(token), else a draw from the residual,
    p without it. The result follows p exactly, whatever was proposed (the lookups that
    feed a draft model: it verifies their tokens in one batch and keeps its own law)."""
    if rng.random() < acceptance_probability(p, None, token):
        return token
    return sample(residual(p, None, token), rng)


class Verdict(NamedTuple):
    """The acceptance rule's answer: `accepted` drafts, then `token`, the correction
    drawn from the residual or a token drawn from p itself (bonus, plain step), whose
    probability under the target's processed distribution at its row is `p`."""

    accepted: int
    token: int
    p: float


class Row(Protocol):
    """p of one row, as the rule reads it: p(token), and the whole vector where needed
    (loop/rows.py's `LazyP` normalises it only then)."""

    shape: tuple[int, ...]

    def __getitem__(self, token: int) -> float: ...

    def vector(self) -> np.ndarray: ...


def verify(
    p_rows: Callable[[int], np.ndarray | Row],
    drafts: list[int],
    qs: list[np.ndarray | None],
    rng: np.random.Generator,
    draw: Callable[[int, np.random.Generator], tuple[int, float]] | None = None,
) -> Verdict:
    """The acceptance rule over one draft.

    m drafts are accepted left to right, then one more token is drawn: the correction
    from the residual at the first rejection, or a bonus token from p_{k+1} when all k
    are accepted. p rows are computed lazily so a rejection at position 1 never
    processes the later rows (a `Row` is normalised only where the residual needs all of
    it). `draw(i, rng)`, when given, samples p_{i+1} directly and returns the token
    with its p; it must equal `sample(p_rows(i), rng)` in distribution.
    """
    for i, d in enumerate(drafts):
        row = p_rows(i)
        if rng.random() < acceptance_probability(row, qs[i], d):
            continue
        p = row if isinstance(row, np.ndarray) else row.vector()
        x = sample(residual(p, qs[i], d), rng)
        return Verdict(i, x, float(p[x]))
    k = len(drafts)
    if draw is not None:
        return Verdict(k, *draw(k, rng))
    last = p_rows(k)
    p = last if isinstance(last, np.ndarray) else last.vector()
    x = sample(p, rng)
    return Verdict(k, x, float(p[x]))


def verify_greedy(argmax_rows: Callable[[int], int], drafts: list[int]) -> Verdict:
    """Temperature 0: accept while the draft equals the target's argmax (p is one-hot)."""
    for i, d in enumerate(drafts):
        best = argmax_rows(i)
        if d != best:
            return Verdict(i, best, 1.0)
    return Verdict(len(drafts), argmax_rows(len(drafts)), 1.0)
