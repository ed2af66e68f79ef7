"""How many tokens to draft each round.

Three policies:

- `FixedDraftLength(k)`: always k (0 = the target alone).
- `HeuristicDraftLength`: +2 after a fully accepted draft, -1 otherwise.
- `AutoDraftLength` (`draft_max="auto"`, the default of the CLI): cost-aware.
  Each round it picks the k in 0..15 that maximizes the expected tokens per
  second (DESIGN.md section 5),

      rate(k) = E(k) / C(k)
      E(k)    = 1 + sum_{j=1..k} prod_{i<=j} a_i      tokens one round emits
      C(k)    = T_t(k+1) + k * (T_d + o_d) + o_r      seconds one round takes

  where a_i is the acceptance rate at draft position i given the draft got
  there (estimated online, with decay, per draft source; with one rate a for
  every position E(k) = (1 - a^(k+1)) / (1 - a)), T_t(n) the measured cost of
  one target decode of n tokens, T_d one draft step, o_r and o_d our own
  per-round and per-draft-token overhead. k = 0 is plain target decoding, and
  it is kept unless the best k > 0 is expected to be at least `margin` faster:
  never meaningfully slower than the target alone. While speculation is off
  it drafts a short probe now and then (with backoff) so the acceptance
  estimate stays current, but only if drafting could pay at a high
  acceptance rate by more than such a probe costs (a paused draft model lags
  behind and must catch up on every token since it last drafted).

The pure functions (`expected_tokens`, `RoundCosts`, `decide`) hold the math;
`AutoState` holds what survives across calls of one decoder (calibrated and
refined costs, acceptance estimates, probe schedule); `AutoDraftLength` is the
per-call policy the round loop talks to.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from ..errors import InvalidParameterError

if TYPE_CHECKING:
    from ..engine.decoder import SpeculativeDecoder
    from .calibration import CostCurve

DraftMax = int | Literal["auto", "heuristic"]
MAX_DRAFT = 64
AUTO_MAX_DRAFT = 15  # auto verifies at most 16 tokens at once (the calibrated range)
#: Recommended confidence cutoff (`SpeculativeDecoder(p_min=...)`): stop a draft
#: when the draft model's most likely next token has less probability than this
#: (drafting.ModelDraft; exact, and a no-op at temperature 0). Measured on the
#: SmolLM2 Q4_1/Q4_0 pair at temperature 0.8 (2284 draft positions): the exact
#: acceptance is still 0.55 where q's top probability is below 0.3 and 0.93
#: above 0.9, so a cutoff pays only where verifying is dear. Replaying those
#: drafts under two cost profiles: 0.2 gains 1-5% for fixed k = 2..6 with the
#: Q4_1 target's costs (DESIGN.md section 5) and is neutral (-0.1..+1.6%) where
#: drafting pays (verifying 5 tokens 1.8x one, a draft step 0.2x: a flat,
#: memory-bound target with a 5x cheaper draft); 0.5 gains 2-30% in the first
#: case (still far slower than the target alone) but loses 5-7% in the second
#: at k <= 4, and llama.cpp's 0.75 loses 10-14% there.
DEFAULT_P_MIN = 0.2
#: Speculate only when the best k is expected to beat the target alone by this much.
DEFAULT_MARGIN = 0.05
SOURCES = ("model", "lookup")


@dataclass(frozen=True)
class RoundOutcome:
    """What one round cost and gave: the input of adaptive policies."""

    k: int  # tokens drafted (0 = plain target step)
    accepted: int
    source: Literal["model", "lookup"]
    target_s: float  # target decode time of this round (one pass of k+1 tokens)
    draft_s: float  # draft model decode time of this round (0 for lookup)


class DraftLengthPolicy(Protocol):
    def choose(self, source: str = "model") -> int:
        """Draft length for the next round from this source (0 = plain target step)."""
        ...

    def observe(self, outcome: RoundOutcome) -> None:
        """Outcome of the last round."""
        ...

    def describe(self) -> str:
        """One line for the stats: what the policy did and why."""
        ...

    def may_draft(self, source: str = "model") -> bool:
        """Whether this call may ask `source` for a draft at all. False lets the round
        loop leave the draft model's share of the prompt for later: a draft model
        catches up on its own the first time it drafts."""
        ...


# ============================================================================ simple policies


class FixedDraftLength:
    def __init__(self, k: int) -> None:
        self.k = k

    def choose(self, source: str = "model") -> int:
        return self.k

    def observe(self, outcome: RoundOutcome) -> None:
        pass

    def describe(self) -> str:
        return "target alone (draft length 0)" if self.k == 0 else f"fixed draft length {self.k}"

    def may_draft(self, source: str = "model") -> bool:
        return self.k > 0


class HeuristicDraftLength:
    """+2 after a fully accepted draft, -1 otherwise (llama.cpp's server heuristic)."""

    def __init__(self, k_max: int = 16, k_min: int = 1, start: int = 4) -> None:
        self.k_max, self.k_min = k_max, k_min
        self.k = max(k_min, min(start, k_max))

    def choose(self, source: str = "model") -> int:
        return self.k

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.k == 0:
            return
        step = 2 if outcome.accepted == outcome.k else -1
        self.k = max(self.k_min, min(self.k_max, self.k + step))

    def describe(self) -> str:
        return f"heuristic draft length in [{self.k_min}, {self.k_max}] (+2 all accepted, -1 else)"

    def may_draft(self, source: str = "model") -> bool:
        return True


# ============================================================================ the math


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
    """Seconds one round takes with k drafts: C(k) = T_t(k+1) + k(T_d + o_d) + o_r.

    target[n - 1] is one target decode of n tokens (so target[k] verifies k drafts).
    """

    target: Sequence[float]
    draft: float  # one draft step
    overhead: float = 0.0  # ours, per round
    overhead_per_draft: float = 0.0  # ours, per drafted token (sampling q, ...)

    @property
    def k_max(self) -> int:
        return len(self.target) - 1

    def round_s(self, k: int) -> float:
        return self.target[k] + k * (self.draft + self.overhead_per_draft) + self.overhead

    @classmethod
    def from_ratios(
        cls, t1: float, ratios: Sequence[float], draft_ratio: float, overhead: float = 0.0,
        overhead_per_draft: float = 0.0,
    ) -> RoundCosts:
        """From T_t(n)/T_t(1) for n = 1.. (ratios[0] == 1) and T_d/T_t(1)."""
        return cls(tuple(t1 * r for r in ratios), t1 * draft_ratio, overhead, overhead_per_draft)


def expected_rate(accept: float | Sequence[float], k: int, costs: RoundCosts) -> float:
    """Expected tokens per second with k drafts a round."""
    return expected_tokens(accept, k) / costs.round_s(k)


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
    target, per_draft, fixed = costs.target, costs.draft + costs.overhead_per_draft, costs.overhead
    run, tokens = 1.0, 1.0
    for k in range(1, k_max + 1):
        run *= rates[k - 1]
        tokens += run
        r = tokens / (target[k] + k * per_draft + fixed)
        if r > best:
            best_k, best = k, r
    speedup = best / base if base > 0 else 0.0
    chosen = best_k if best_k > 0 and speedup > 1.0 + margin else 0
    return Decision(chosen, best_k, speedup)


# ============================================================================ estimates


class AcceptanceEstimate:
    """Acceptance per draft position, from decayed counts.

    Position i is "reached" in a round when positions 1..i-1 were accepted and
    the round meant to draft at least i tokens; it then counts as accepted or
    not (a rejection, or a draft cut short by the confidence cutoff). The
    overall rate is shrunk towards `prior`, and each position towards the
    overall rate, so rarely reached positions borrow from the rest.
    """

    def __init__(
        self,
        prior: float = 0.6,
        prior_weight: float = 4.0,
        position_weight: float = 3.0,
        decay: float = 0.97,
        positions: int = AUTO_MAX_DRAFT,
    ) -> None:
        self.prior, self.prior_weight = prior, prior_weight
        self.position_weight, self.decay = position_weight, decay
        self.reached = [0.0] * positions
        self.accepted = [0.0] * positions
        self.rounds = 0
        self._rates: list[float] | None = None

    def observe(self, reached: int, accepted: int) -> None:
        """Positions 1..reached were reached; 1..accepted of them accepted."""
        if reached <= 0:
            return
        self.rounds += 1
        self._rates = None
        d = self.decay
        n = len(self.reached)
        for i in range(n):
            self.reached[i] *= d
            self.accepted[i] *= d
        for i in range(min(reached, n)):
            self.reached[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0

    @property
    def overall(self) -> float:
        return (sum(self.accepted) + self.prior_weight * self.prior) / (
            sum(self.reached) + self.prior_weight
        )

    def rates(self) -> list[float]:
        if self._rates is None:
            a, w = self.overall, self.position_weight
            self._rates = [(acc + w * a) / (r + w) for acc, r in zip(self.accepted, self.reached)]
        return self._rates


@dataclass
class _SourceState:
    acceptance: AcceptanceEstimate
    # calibration.RecentMedian of one draft step / the target's T(1) at that time: a
    # ratio, so a machine that gets busier or quieter (which moves T(1)) does not leave
    # a stale draft cost behind while drafting is paused and the draft is not observed
    draft_step: object
    probe_every: int
    since_probe: int = 0
    hold: int = 0  # rounds the last "k = 0" still stands without deciding again


class AutoState:
    """What the auto policy keeps across calls of one decoder: costs (calibrated,
    then refined by every round), acceptance per source, the probe schedule."""

    PROBE_FIRST, PROBE_MAX = 8, 64
    #: While paused, decide again only every this many rounds: costs and acceptance
    #: move slowly, and right after a decode every microsecond of Python counts.
    RECHECK = 8

    def __init__(
        self,
        target_curve: CostCurve,
        draft_step_s: float = 0.0,
        *,
        draft_catchup_s: float = 0.0,
        priors: dict[str, float] | None = None,
        calibration: dict | None = None,
    ) -> None:
        from .calibration import OnlineCurve, RecentMedian

        priors = {"model": 0.6, "lookup": 0.5, **(priors or {})}
        self.target = OnlineCurve(target_curve)
        self.k_max = max(0, min(AUTO_MAX_DRAFT, target_curve.max_n - 1))
        self.sources = {
            src: _SourceState(
                AcceptanceEstimate(prior=priors[src], positions=max(1, self.k_max)),
                RecentMedian(draft_step_s / target_curve.t(1) if src == "model" else 0.0),
                self.PROBE_FIRST,
            )
            for src in SOURCES
        }
        # What each token the draft model lags behind costs when it catches up (its
        # marginal cost in a batch, T_d(2) - T_d(1)): the hidden price of a probe, since
        # a paused draft model falls behind by one token a round.
        self.draft_catchup_ratio = max(0.0, draft_catchup_s) / target_curve.t(1)
        self.overhead_round = RecentMedian(0.0)
        self.overhead_draft = RecentMedian(0.0)
        self.calibration = calibration or {}
        self._target_snapshot: tuple[float, ...] | None = None
        #: Set once online timings contradict the calibrated curve (see observe_target).
        self.stale_note = ""

    @classmethod
    def for_decoder(cls, decoder: SpeculativeDecoder, *, refresh: bool = False) -> AutoState:
        """The decoder's state, created (and its models calibrated) on first use;
        refresh=True measures the costs again instead of reading the cache."""
        state = getattr(decoder, "_auto_state", None)
        if state is None or refresh:
            state = cls.calibrated(decoder, refresh=refresh)
            decoder._auto_state = state  # type: ignore[attr-defined]
        return state

    @classmethod
    def calibrated(cls, decoder: SpeculativeDecoder, *, refresh: bool = False) -> AutoState:
        from .calibration import DRAFT_MAX_N, TARGET_MAX_N, calibrate

        target = calibrate(decoder.target, TARGET_MAX_N, use_cache=not refresh)
        info = {"target": target.to_dict()}
        draft_step = catchup = 0.0
        if decoder.draft is not None:
            draft = calibrate(decoder.draft, DRAFT_MAX_N, use_cache=not refresh)
            info["draft"] = draft.to_dict()
            draft_step = draft.curve.t(1)
            catchup = draft.curve.t(2) - draft.curve.t(1)
        return cls(target.curve, draft_step, draft_catchup_s=catchup, calibration=info)

    def source(self, name: str) -> _SourceState:
        return self.sources[name if name in self.sources else "model"]

    def costs(self, source: str) -> RoundCosts:
        if self._target_snapshot is None:
            self._target_snapshot = tuple(self.target.snapshot(self.k_max + 1))
        return RoundCosts(
            self._target_snapshot,
            self.source(source).draft_step.value * self._target_snapshot[0],  # type: ignore[attr-defined]
            max(0.0, self.overhead_round.value),
            max(0.0, self.overhead_draft.value),
        )

    def observe_target(self, n: int, seconds: float) -> None:
        self.target.observe(n, seconds)
        self._target_snapshot = None
        if n > 1 and not self.stale_note:
            self._check_stale()

    def _check_stale(self) -> None:
        """When real decodes keep contradicting the cached curve (it was measured
        while the machine was busy, say), drop the cache file so the next load
        measures again; this run already follows the online estimate."""
        from .calibration import forget

        n = self.target.stale()
        if n is None:
            return
        measured, cached = self.target.ratio(n), self.target.base.ratio(n)
        path = (self.calibration.get("target") or {}).get("path")
        forgotten = forget(path)
        self.stale_note = (
            f"calibration looked stale (verifying {n} tokens: {cached:.1f}x one token "
            f"calibrated, {measured:.1f}x seen)"
            + ("; it will be measured again at the next load" if forgotten else "")
        )


# ============================================================================ auto


@dataclass
class _Tally:
    rounds: int = 0
    drafted: int = 0  # rounds where this policy chose k > 0 (probes included)
    k_sum: int = 0
    probes: int = 0
    speedup_sum: float = 0.0  # expected speedup, summed over drafting rounds
    last: Decision | None = None


@dataclass
class AutoDraftLength:
    """The cost-aware policy of one generation call (see the module docstring)."""

    state: AutoState
    margin: float = DEFAULT_MARGIN
    probe_k: int = 2
    # Probe only if drafting would pay at an optimistic acceptance (this, or the
    # current estimate if higher, at most 0.95) by more than the margin plus what
    # the probe's catch-up of the lagging draft model costs.
    optimistic_alpha: float = 0.9
    cutoff: bool = False  # the draft model may stop short (p_min > 0): count it as a miss
    _chosen: dict[str, int] = field(default_factory=dict)
    _tally: dict[str, _Tally] = field(default_factory=dict)
    _t_mark: float | None = None
    # source of the last round's draft ("" none): a draft model that did not draft then
    # (or ever, its prompt share deferred) catches up first, which is no draft step
    _in_sync: str = ""
    _plain_rounds: int = 0  # paused rounds so far (the fast path times every 4th)

    @classmethod
    def for_decoder(cls, decoder: SpeculativeDecoder, **kwargs) -> AutoDraftLength:
        kwargs.setdefault("cutoff", getattr(decoder, "p_min", 0.0) > 0.0)
        return cls(AutoState.for_decoder(decoder), **kwargs)

    # ------------------------------------------------------------------ choose
    def choose(self, source: str = "model") -> int:
        if self._t_mark is None:
            self._t_mark = time.perf_counter()
        st = self.state
        src = st.source(source)
        tally = self._tally.get(source)
        if tally is None:
            tally = self._tally[source] = _Tally()
        elif src.hold > 0 and src.since_probe + 1 < src.probe_every:
            # paused, and no probe due: the last decision stands (the fast path)
            src.hold -= 1
            src.since_probe += 1
            tally.rounds += 1
            self._chosen[source] = 0
            return 0
        costs = st.costs(source)
        decision = decide(src.acceptance.rates(), costs, st.k_max, self.margin)
        k = decision.k
        tally.rounds += 1
        tally.last = decision
        if k > 0:
            src.probe_every = AutoState.PROBE_FIRST
            src.since_probe = 0
            src.hold = 0
            tally.speedup_sum += decision.speedup
        else:
            src.hold = AutoState.RECHECK - 1
            src.since_probe += 1
            if src.since_probe >= src.probe_every:
                hopeful = self._hopeful(source, costs)
                src.since_probe = 0
                src.probe_every = min(AutoState.PROBE_MAX, 2 * src.probe_every)
                if hopeful.speculate:
                    k = max(1, min(self.probe_k, hopeful.best_k))
                    tally.probes += 1
        if k > 0:
            tally.drafted += 1
            tally.k_sum += k
        self._chosen[source] = k
        return k

    def may_draft(self, source: str = "model") -> bool:
        """False only where drafting from `source` could not pay even at the
        optimistic acceptance that gates probes: then it will not draft at all
        unless the measured costs change."""
        st = self.state
        src = st.source(source)
        costs = st.costs(source)
        if decide(src.acceptance.rates(), costs, st.k_max, self.margin).speculate:
            return True
        return self._hopeful(source, costs).speculate

    def _optimistic(self, src: _SourceState) -> float:
        return min(0.95, max(self.optimistic_alpha, src.acceptance.overall))

    def _hopeful(self, source: str, costs: RoundCosts) -> Decision:
        """The decision at the optimistic acceptance, with the probe's own price on
        top of the margin: whether probing (or drafting at all) could pay."""
        alpha = self._optimistic(self.state.source(source))
        margin = self.margin + self._probe_price(source, costs)
        return decide(alpha, costs, self.state.k_max, margin)

    def _probe_price(self, source: str, costs: RoundCosts) -> float:
        """The share of a paused stretch's time a probe adds: the draft model lags one
        token per paused round and catches up in one batch when it drafts again."""
        if source != "model":
            return 0.0
        return self.state.draft_catchup_ratio

    # ----------------------------------------------------------------- observe
    def observe(self, outcome: RoundOutcome) -> None:
        now = time.perf_counter()
        st = self.state
        if outcome.k == 0 and not any(self._chosen.values()):
            # A plain round nobody asked to draft in (paused): the fast path of the
            # full bookkeeping below, which runs right after a decode, where every
            # line of Python shows. Costs move slowly: every 4th such round is timed.
            self._plain_rounds += 1
            if not self._plain_rounds & 3:
                st.observe_target(1, outcome.target_s)
                if self._t_mark is not None:
                    st.overhead_round.add(
                        (now - self._t_mark) - outcome.target_s - outcome.draft_s
                    )
            self._t_mark = now
            self._in_sync = ""
            self._chosen.clear()
            return
        # The source that drafted: the outcome's, or (nothing drafted) the one that
        # was asked for a draft and stopped at once under the confidence cutoff.
        source = outcome.source
        if outcome.k == 0:
            source = next((s for s, k in self._chosen.items() if k > 0), source)
        chosen = self._chosen.get(source, 0)
        src = st.source(source)

        st.observe_target(outcome.k + 1, outcome.target_s)
        if outcome.draft_s > 0.0 and self._in_sync == source:
            # Only when the draft model was in step: after rounds without it, its
            # first decode catches up on several tokens, which a probe pays but
            # steady drafting does not.
            step = outcome.draft_s / max(1, outcome.k)
            src.draft_step.add(step / st.target.t(1))  # type: ignore[attr-defined]
        self._in_sync = source if chosen > 0 else ""
        if self._t_mark is not None:
            ours = (now - self._t_mark) - outcome.target_s - outcome.draft_s
            if outcome.k == 0:
                st.overhead_round.add(ours)
            else:
                st.overhead_draft.add((ours - st.overhead_round.value) / outcome.k)
        self._t_mark = now

        if chosen > 0:
            m, k = outcome.accepted, outcome.k
            if m < k:
                reached = m + 1  # rejected at m + 1
            elif k < chosen and self.cutoff and source == "model":
                reached = k + 1  # the cutoff stopped the draft at k + 1
            # (a lookup draft stops short where the match's text ends or is too
            # short to trust: that says nothing about acceptance)
            else:
                reached = k
            src.acceptance.observe(reached, m)
        self._chosen.clear()

    # ---------------------------------------------------------------- describe
    def describe(self) -> str:
        if not self._tally:
            return "auto: nothing to draft with (target alone)"
        parts = [self._describe_source(s, t) for s, t in self._tally.items()]
        if self.state.stale_note:
            parts.append(self.state.stale_note)
        return "auto: " + " | ".join(parts)

    def _describe_source(self, source: str, tally: _Tally) -> str:
        st = self.state
        src = st.source(source)
        alpha = src.acceptance.overall
        d = tally.last
        assert d is not None
        k = d.best_k or 1
        costs = st.costs(source)
        t1 = costs.target[0]
        verify = f"verifying {k + 1} tokens costs {costs.target[k] / t1:.1f}x one token here"
        if source == "model":
            verify += f" and a draft step {costs.draft / t1:.2f}x"
        label = "" if source == "model" else f"{source}: "
        real = tally.drafted - tally.probes
        share = real / tally.rounds
        if not d.speculate:
            after = f" after drafting in {share:.0%} of rounds" if real else ""
            msg = (f"{label}speculation paused{after}: {verify}; at {alpha:.0%} acceptance "
                   f"drafting {k} would run at {d.speedup:.2f}x the target alone")
            if tally.probes:
                msg += f" (probed {tally.probes}x)"
            elif not self._hopeful(source, costs).speculate:
                msg += (f"; even at {self._optimistic(src):.0%} acceptance it would not pay,"
                        " so no probes")
            return msg
        mean_k = tally.k_sum / max(1, tally.drafted)
        expected = tally.speedup_sum / max(1, real)
        when = "" if share >= 0.95 else f" in {share:.0%} of rounds (paused in the rest)"
        return (f"{label}drafted{when}, k {mean_k:.1f} on average, acceptance {alpha:.0%}: "
                f"expected {expected:.2f}x the target alone ({verify})")


# ============================================================================ factory


def make_policy(draft_max: DraftMax, decoder: SpeculativeDecoder) -> DraftLengthPolicy:
    """The policy for a `draft_max` setting: an int is a fixed k (0 = target alone),
    "auto" the cost-aware policy, "heuristic" +2/-1."""
    if draft_max == "auto":
        return AutoDraftLength.for_decoder(decoder)
    if draft_max == "heuristic":
        return HeuristicDraftLength()
    if (
        not isinstance(draft_max, int)
        or isinstance(draft_max, bool)
        or not 0 <= draft_max <= MAX_DRAFT
    ):
        raise InvalidParameterError(
            f"draft_max must be 'auto', 'heuristic' or an integer in [0, {MAX_DRAFT}], "
            f"got {draft_max!r}"
        )
    return FixedDraftLength(draft_max)
