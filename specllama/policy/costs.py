"""The cost model, as pure functions (docs/architecture.md, "The cost model").

    rate(k) = E(k) / C(k)
    E(k)    = 1 + sum_{j=1..k} prod_{i<=j} a_i      tokens one round emits
    C(k)    = T_t(k+1) + k * (T_d + o_d) + w_d + o_r   seconds one round takes (w_d: k > 0)

a_i is the acceptance rate at draft position i given the draft got there (with one
rate a for every position E(k) = (1 - a^(k+1)) / (1 - a)), T_t(n) one target
decode of n tokens, T_d one draft step, w_d what the first draft step of a round
costs on top (the draft model's weights, evicted by the target's decode, come back
from memory), o_r and o_d our own per-round and per-draft-token overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Speculate only when the best k is expected to beat the target alone by this much.
DEFAULT_MARGIN = 0.03


def expected_tokens(accept: float | Sequence[float], k: int) -> float:
    """Expected tokens one round emits with k drafts: the accepted prefix plus the
    correction or bonus token. `accept` is one rate for every position, or a_i
    per position (a_i = P(accept i | 1..i-1 accepted))."""
    if k <= 0:
        return 1.0
    total, run = 1.0, 1.0
    for i in range(k):
        a = accept if isinstance(accept, (int, float)) else accept[min(i, len(accept) - 1)]
        run *= a
        total += run
    return total


@dataclass(frozen=True)
class RoundCosts:
    """Seconds one round takes with k drafts: C(k) = T_t(k+1) + k(T_d + o_d) + w_d + o_r.

    target[n - 1] is one target decode of n tokens (so target[k] verifies k drafts).
    """

    target: Sequence[float]
    draft: float  # one draft step
    overhead: float = 0.0  # ours, per round
    overhead_per_draft: float = 0.0  # ours, per drafted token (sampling q, ...)
    draft_wake: float = 0.0  # the first draft step of a round, on top of `draft`
    #: tokens other requests emit in the same target batch (`serve --parallel`): a
    #: round's rate is the batch's, so drafts pay only if they raise the whole batch's
    shared: float = 0.0

    @property
    def k_max(self) -> int:
        return len(self.target) - 1

    def round_s(self, k: int) -> float:
        wake = self.draft_wake if k > 0 else 0.0
        return self.target[k] + k * (self.draft + self.overhead_per_draft) + wake + self.overhead

    @classmethod
    def from_ratios(
        cls, t1: float, ratios: Sequence[float], draft_ratio: float, overhead: float = 0.0,
        overhead_per_draft: float = 0.0,
    ) -> RoundCosts:
        """From T_t(n)/T_t(1) for n = 1.. (ratios[0] == 1) and T_d/T_t(1)."""
        return cls(tuple(t1 * r for r in ratios), t1 * draft_ratio, overhead, overhead_per_draft)


def expected_rate(accept: float | Sequence[float], k: int, costs: RoundCosts) -> float:
    """Expected tokens per second with k drafts a round (the batch's, when shared)."""
    return (expected_tokens(accept, k) + costs.shared) / costs.round_s(k)


@dataclass(frozen=True)
class Decision:
    k: int  # the draft length to use (0 = plain target step)
    best_k: int  # the best k >= 1 (what speculation would use)
    speedup: float  # expected rate(best_k) / rate(0)

    @property
    def speculate(self) -> bool:
        return self.k > 0


def decide(
    accept: float | Sequence[float],
    costs: RoundCosts,
    k_max: int | None = None,
    margin: float = DEFAULT_MARGIN,
) -> Decision:
    """The k in 0..k_max maximizing expected tokens/s; 0 unless the best k > 0
    beats plain decoding by at least `margin` (relative)."""
    k_max = costs.k_max if k_max is None else min(k_max, costs.k_max)
    base = expected_rate(accept, 0, costs)
    best_k, best = 0, 0.0
    rates = [accept] * k_max if isinstance(accept, (int, float)) else accept
    if len(rates) < k_max:
        rates = [*rates, *[rates[-1]] * (k_max - len(rates))]
    # E(k) built up incrementally: O(k_max) (this runs every round, so no method calls)
    target, per_draft = costs.target, costs.draft + costs.overhead_per_draft
    fixed = costs.overhead + costs.draft_wake
    run, tokens = 1.0, 1.0 + costs.shared
    for k in range(1, k_max + 1):
        run *= rates[k - 1]
        tokens += run
        r = tokens / (target[k] + k * per_draft + fixed)
        if r > best:
            best_k, best = k, r
    speedup = best / base if base > 0 else 0.0
    chosen = best_k if best_k > 0 and speedup > 1.0 + margin else 0
    return Decision(chosen, best_k, speedup)
