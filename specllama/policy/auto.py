"""`draft_max="auto"`: the draft length that maximizes expected tokens per second.

Each round it picks the k in 0..15 that maximizes rate(k) (see `costs`), with the
decode costs measured once per model and machine (`calibration`) and refined in the
loop (`loopcosts`), and the acceptance rate per draft position estimated as it goes,
per draft source (`acceptance`). k = 0 is plain target decoding, kept unless the best
k > 0 is expected to be at least `margin` faster: never meaningfully slower than the
target alone. While paused it drafts a short probe now and then, ever more rarely, so
the estimate can recover, but only where drafting could pay at an optimistic
acceptance rate. A probe's draft model, catching up, also reports how often it would
have guessed each token the target drew alone meanwhile (ModelWork.shadow): the
estimate learns from every paused token, not just from the probe's two drafts. Where
each draft ends is the stop rule's (`stoprule`). Every tuned number is a field of
`AutoTuning` (`tuning`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..engine.drafting.base import DraftStep
from ..engine.loop.events import RoundVerified
from .acceptance import AcceptanceEstimate, ConfidenceAcceptance
from .costs import Decision, RoundCosts, decide, expected_tokens
from .loopcosts import LoopCosts
from .state import AutoState, SourceState
from .stoprule import StopRule
from .tuning import AutoTuning

if TYPE_CHECKING:
    from ..engine.loop.lengths import PolicyHost

__all__ = [
    "AcceptanceEstimate",
    "AutoDraftLength",
    "AutoState",
    "AutoTuning",
    "ConfidenceAcceptance",
    "LoopCosts",
    "SourceState",
]


@dataclass
class _Tally:
    rounds: int = 0
    drafted: int = 0  # rounds where this policy chose k > 0 (probes included)
    probes: int = 0
    k_sum: int = 0  # tokens drafted in the rounds it chose k > 0
    accepted_sum: int = 0  # of those, accepted
    speedup_sum: float = 0.0  # expected speedup, summed over drafting rounds
    last: Decision | None = None


@dataclass
class AutoDraftLength:
    """The cost-aware policy of one generation call (see the module docstring)."""

    state: AutoState
    margin: float | None = None  # None: the tuning's
    _chosen: dict[str, int] = field(default_factory=dict)  # per key of state.sources
    _key_of: dict[str, str] = field(default_factory=dict)  # a round's source -> its key
    _tally: dict[str, _Tally] = field(default_factory=dict)
    _rounds: int = 0  # rounds observed in this call
    # What the cost model expected of the rounds as they were run (the k each used,
    # the acceptance known before it): tokens and seconds, summed.
    _expected_s: float = 0.0
    _alone_s: float = 0.0  # the target alone, for the same expected tokens
    _behind: int = 0  # committed tokens the draft model lacks (RoundVerified.behind)
    #: Other requests in the target's last batch (`serve --parallel`; read afresh each
    #: round, the first one included).
    companions: Callable[[], int] = lambda: 0
    _deferred: int = 0  # prompt tokens left to the draft model (may_draft) until it drafts
    _model_asked: bool = False  # the draft model is in play in this call (hybrid drafting)
    _probed: bool = False  # this round's draft is a probe
    _stop: StopRule = field(init=False)  # where this call's drafts end

    def __post_init__(self) -> None:
        self._stop = StopRule(self.state)

    @property
    def tuning(self) -> AutoTuning:
        return self.state.tuning

    @classmethod
    def for_decoder(cls, decoder: PolicyHost) -> AutoDraftLength:
        state = AutoState.for_decoder(decoder)
        keep = state.tuning.carry_over
        # A new call is a new text: probe it soon, whatever the last one taught.
        for src in state.sources.values():
            # Probe in the first round if paused (the draft model is in step with the
            # prompt then, so a probe costs the least it ever will), the next one after
            # probe_every paused rounds as usual.
            src.paused, src.probe_every = 0, 1
            src.acceptance.forget(keep)
            src.decision = None
            src.drafting = False
        state.confidence.forget(keep)
        for known in state.lookup_confidence.values():
            known.forget(keep)
        target = decoder.target
        return cls(state, companions=lambda: target.companions)

    def _margin(self) -> float:
        return self.tuning.margin if self.margin is None else self.margin

    def _decision(self, src: SourceState) -> Decision:
        if src.decision is None:
            margin = self._margin()
            if src is self.state.sources["model"] and src.drafting:
                margin = self.tuning.keep_margin
            src.decision = decide(src.acceptance.rates(), self._costs(src, self._behind),
                                  self.state.k_max, margin)
        return src.decision

    def _costs(self, src: SourceState, behind: int) -> RoundCosts:
        """A source's round costs; a paused draft model's with its catch-up on the
        `behind` tokens it missed, spread over the rounds resuming enables."""
        costs = src.costs
        companions = self.companions()
        if companions:
            # The batch this round joins, each other request in it verifying a token and
            # emitting one (at least; its prompt chunk, if any, is a one-off): k drafts
            # cost T(companions + k + 1), and must raise the whole batch's rate.
            loop = self.state.loop
            costs = replace(costs, target=tuple(loop.t(companions + n)
                                                for n in range(1, len(costs.target) + 1)),
                            shared=float(companions))
        if src is self.state.sources["model"] and not src.drafting and behind:
            catch_up = self.state.loop.catch_up_s(behind)
            costs = replace(costs, draft_wake=costs.draft_wake
                            + catch_up / self.tuning.resume_horizon)
        return costs

    def _optimistic(self, src: SourceState) -> float:
        estimate, t = src.acceptance, self.tuning
        return min(max(t.optimistic_alpha, estimate.overall), estimate.upper())

    def _hopeful(self, src: SourceState, behind: int | None = None) -> Decision:
        """The decision at an optimistic acceptance: could drafting pay at all? (A
        probe's catch-up is not priced, what it teaches is worth more than a round;
        but while the prompt is left to the draft model it would pay for all of it.)"""
        if behind is None:
            behind = self._behind if self._deferred else 0
        costs = self._costs(src, behind)
        return decide(self._optimistic(src), costs, self.state.k_max, self._margin())

    def choose(self, source: str = "model", match: int = 0) -> int:
        t = self.tuning
        if source == "lookup" and match >= t.long_match:
            self._key_of[source] = source = "lookup-long"
        else:
            self._key_of[source] = source
        src = self.state.source(source)
        tally = self._tally.setdefault(source, _Tally())
        decision = self._decision(src)
        k = decision.k
        tally.rounds += 1
        tally.last = decision
        if source == "model":
            self._model_asked = True
        elif k > 0 and self._model_does_better(src, decision):
            self._chosen[source] = 0
            return 0
        src.drafting = k > 0
        if k > 0:
            src.paused = 0
            src.probe_every = t.probe_every
            if (decision.speedup < t.marginal
                    and self.state.loop.since_plain >= t.reference_every):
                k = 0  # a plain round: the measure of the target alone
            else:
                tally.speedup_sum += decision.speedup
        else:
            k = self._probe(src, tally)
        if k > 0:
            tally.drafted += 1
            # The rule of `extend` ends the draft (a probe's too, at probe_k); the rate
            # its tokens must beat is what drafting is expected to give, at least the
            # target alone's.
            self._stop.begin(source, max(1.0, decision.speedup) / src.costs.round_s(0))
            if source == "model":
                if decision.k > 0 and t.stop_rule_cap > 0:
                    k = max(k, min(t.stop_rule_cap, self.state.k_max))
        self._chosen[source] = k
        return k

    def _probe(self, src: SourceState, tally: _Tally) -> int:
        """A paused round: the probe's k when one is due and could pay, else 0."""
        t = self.tuning
        src.paused += 1
        if src.paused < src.probe_every:
            return 0
        src.paused = 0
        src.probe_every = min(t.probe_every_max, max(t.probe_every,
                                                     t.probe_growth * src.probe_every))
        hopeful = self._hopeful(src)
        if not hopeful.speculate or t.probe_k <= 0:
            return 0
        tally.probes += 1
        self._probed = True
        return max(1, min(t.probe_k, hopeful.best_k))

    def _model_does_better(self, lookup: SourceState, decision: Decision) -> bool:
        """Hybrid drafting: a lookup round takes the place of a model draft, so it is declined
        where the draft model is expected to do better, counting the catch-up the lookup's
        tokens cost the draft model next time. Only once the model has been asked in this call
        (not with lookup alone), and only by a clear margin: where the model's gain was
        marginal, declining on any advantage lost more on copy-heavy text than it won elsewhere
        (docs/lab/2026-12-local-generation.md, "Hybrid: a lookup gives way ...")."""
        if not self._model_asked:
            return False
        model = self._decision(self.state.sources["model"])
        if not model.speculate:
            return False
        # decision.speedup is E/C against 1/T(1); the catch-up on a round's tokens (all
        # accepted) adds a share of a step a token
        n = decision.best_k + 1
        catch_up = self.state.loop.catch_up_s(n) / n / lookup.costs.round_s(0)
        return model.speedup > (1 + self.tuning.decline_margin) / (1 / decision.speedup
                                                                   + catch_up)

    def extend(self, j: int, confidence: float) -> DraftStep:
        """Draw token j of the draft begun in `choose`, or stop: the stop rule
        (`StopRule.extend`)."""
        return self._stop.extend(j, confidence)

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        """False only where drafting from `source` could not pay even at the
        optimistic acceptance that gates probes, nor (the draft model) for its
        catch-up on the `behind` tokens of the prompt it lacks. The round loop decodes
        them where this says yes; where it says no they stay missing, and this call's
        decisions price catching up on them."""
        src = self.state.source(source)
        if source == "model":
            self._behind = self._deferred = behind
            src.decision = None
        may = self._decision(src).speculate or self._hopeful(src).speculate
        if may and source == "model" and behind:  # the round loop decodes them now
            self._behind = self._deferred = 0
            src.decision = None
        return may

    def predicted_speedup(self) -> float | None:
        """The speedup over the target alone that the cost model expected for the
        rounds of this call, or None before any round."""
        if self._expected_s <= 0:
            return None
        return self._alone_s / self._expected_s

    def observe(self, outcome: RoundVerified) -> None:
        source = self._key_of.get(outcome.source, outcome.source)
        self._key_of.clear()
        self._rounds += 1
        self._expect(outcome, source)
        self._behind = outcome.behind
        if self._behind < self._deferred:  # caught up on the prompt
            self._deferred = 0
        self.state.learn_costs(outcome)
        if outcome.work.shadow and self.tuning.shadow:
            model = self.state.source("model")
            model.acceptance.observe_first(outcome.work.shadow)
            model.decision = None
        if not any(self._chosen.values()):
            self._chosen.clear()
            return  # nobody was asked to draft: nothing to learn
        # The source that drafted: the outcome's, or (nothing drafted) the one that
        # was asked for a draft and stopped at once under the confidence cutoff.
        if outcome.k == 0:
            source = next((s for s, k in self._chosen.items() if k > 0), source)
        chosen = self._chosen.get(source, 0)
        self._chosen.clear()
        probed, self._probed = self._probed, False
        if chosen == 0:
            return
        m, k = outcome.m, outcome.k
        if probed and k > 0 and m == k and self.tuning.probe_again:
            # Every draft of the probe held: probe again next round, which costs a step
            # (no paused tokens to catch up on) where waiting costs probe_every rounds.
            self.state.source(source).probe_every = 1
        tally = self._tally.setdefault(source, _Tally())
        tally.k_sum += k
        tally.accepted_sum += m
        if outcome.confidences:
            self.state.confidence_of(source).observe(outcome.confidences, m)
        # A draft cut short, by the draft model's confidence cutoff (p_min) or where a
        # lookup match ends, says nothing of the tokens it did not propose: counting the
        # cut as a rejection made auto draft too short.
        reached = m + 1 if m < k else k
        src = self.state.source(source)
        src.acceptance.observe(reached, m)
        src.decision = None

    def _expect(self, outcome: RoundVerified, source: str) -> None:
        """Add what the cost model expected of this round to the call's prediction."""
        expected = self.state.source(source)
        known = self.state.confidence_of(source)
        if outcome.confidences and known.evidence >= self.tuning.confidence_evidence:
            # What the draft model's confidence at each token said: the stop rule keeps
            # the sure tokens, which the acceptance per position does not know.
            tokens = expected_tokens([known.rate(c) for c in outcome.confidences], outcome.k)
        else:
            tokens = expected_tokens(expected.acceptance.rates(), outcome.k)
        costs = expected.costs
        self._expected_s += costs.round_s(outcome.k)
        if outcome.source == "model" and outcome.work.rows > 0:
            # A row read and nothing drawn from it cost a draft step (and, the first
            # row, the round's wake-up): no round without drafts charges them.
            extra = outcome.work.rows - outcome.k
            self._expected_s += extra * (costs.draft + costs.overhead_per_draft)
            if outcome.k == 0:
                self._expected_s += costs.draft_wake
        if outcome.source == "model" and (outcome.k > 0 or outcome.work.rows > 0):
            self._expected_s += self.state.loop.catch_up_s(outcome.work.caught_up)
        self._alone_s += costs.round_s(0) * tokens

    def describe(self) -> str:
        """One line: how much was drafted and, where drafting stopped or never began,
        why (`explain` has the reasoning)."""
        if not self._tally:
            return "auto: nothing to draft with (target alone)"
        tallies = self._tally.values()
        main = "model" if "model" in self._tally else next(iter(self._tally))
        last = self._tally[main].last
        tokens = sum(t.k_sum for t in tallies)
        # (a lookup chosen but cut before its first token drafted nothing either)
        if sum(t.drafted - t.probes for t in tallies) == 0 or tokens == 0:
            return "auto: " + self._why_not(main)
        drafting = sum(t.drafted for t in tallies)
        share = drafting / max(1, self._rounds)
        when = "" if share >= 0.95 else f" in {share:.0%} of rounds"
        line = (f"auto: drafted{when}, {tokens / max(1, drafting):.1f} tokens on average, "
                f"{sum(t.accepted_sum for t in tallies) / max(1, tokens):.0%} accepted")
        if last is not None and not last.speculate:
            line += "; then stopped: " + self._why_not(main)
        return line

    def _why_not(self, source: str) -> str:
        src, tally = self.state.source(source), self._tally[source]
        if not self._hopeful(src).speculate:
            # the catch-up only where it is why
            behind = self._behind if self._hopeful(src, 0).speculate else 0
            said = self._costs_said(source, behind=behind)
            return f"drafting would not pay on this machine ({said})"
        probed = f" (probed {tally.probes}x)" if tally.probes else ""
        return (f"drafting would not pay at the {src.acceptance.overall:.0%} acceptance "
                f"seen{probed}")

    def _costs_said(self, source: str, k: int = 1, behind: int = 0) -> str:
        """The costs a decision weighed; `behind`: the catch-up it priced."""
        costs = self.state.source(source).costs
        t1 = costs.target[0]
        verify = f"verifying {k + 1} tokens costs {costs.target[k] / t1:.1f}x one"
        if source != "model":
            return verify
        said = f"a draft step costs {costs.draft / t1:.2f}x a target step, {verify}"
        if (catch_up := self.state.loop.catch_up_s(behind)) and not self.state.source(
                source).drafting:
            said += f", catching up on {behind} missed tokens {catch_up / t1:.0f}x one"
        return said

    def explain(self) -> str:
        """The reasoning per source: the decision last made, at what acceptance and
        costs, and the tuning where it differs from the defaults."""
        parts = [self._explain(s, t) for s, t in self._tally.items()]
        if changed := self.tuning.changed():
            parts.append(f"tuning: {changed}")
        return " | ".join(parts)

    def _explain(self, source: str, tally: _Tally) -> str:
        src, d = self.state.source(source), tally.last
        assert d is not None
        k, alpha = d.best_k or 1, src.acceptance.overall
        label = {"model": "model draft", "lookup-long": "lookup after long matches"}.get(
            source, source)
        costs = self._costs_said(source, k, self._behind)
        if not d.speculate:
            msg = (f"{label}: {k} draft{'s' if k > 1 else ''} a round would run at "
                   f"{d.speedup:.2f}x the target alone at {alpha:.0%} acceptance ({costs})")
            if tally.probes:
                return msg + f"; probed {tally.probes}x"
            if not self._hopeful(src).speculate:
                return msg + (f"; even at {self._optimistic(src):.0%} acceptance it would "
                              "not, so no probes")
            return msg
        real = tally.drafted - tally.probes
        return (f"{label}: drafted in {real} of {tally.rounds} rounds, k "
                f"{tally.k_sum / max(1, tally.drafted):.1f} on average, acceptance "
                f"{alpha:.0%}: the cost model predicted {tally.speedup_sum / max(1, real):.2f}x "
                f"the target alone ({costs})")
