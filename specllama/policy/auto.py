"""`draft_max="auto"`: the draft length that maximizes expected tokens per second.

Each round it picks the k in 0..15 that maximizes rate(k) (see `costs`), with
the decode costs measured once per model and machine (`calibration`) and the
acceptance rate per draft position estimated as it goes, per draft source. k = 0
is plain target decoding, kept unless the best k > 0 is expected to be at least
`margin` faster: never meaningfully slower than the target alone. While paused it
drafts a short probe after PROBE_EVERY rounds of a call, then ever more rarely, so the
acceptance estimate can recover, but only where drafting could pay at an optimistic
acceptance rate. A probe's draft model, catching up, also reports how often it would
have guessed each token the target drew alone meanwhile (RoundOutcome.shadow): the
estimate learns from every paused token, not just from the probe's two drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..engine.lengths import DraftStep, RoundOutcome
from .calibration import DRAFT_MAX_N, TARGET_MAX_N, CostCurve, cached, calibrate
from .costs import DEFAULT_MARGIN, Decision, RoundCosts, decide, expected_tokens

if TYPE_CHECKING:
    from ..engine.decoder import SpeculativeDecoder

AUTO_MAX_DRAFT = 15  # auto verifies at most 16 tokens at once (the calibrated range)
LEARN = 0.1  # weight of the latest round in the running cost estimates
SPIKE = 1.5  # a round's time counts as at most this many times the running estimate
LEARN_FIRST, SPIKE_FIRST, FIRST_ROUNDS = 0.5, 4.0, 8  # a decoder's first rounds weigh more
AVERAGE_FIRST = 4  # a batch size's first decodes are averaged (LoopCosts.observe)
#: Acceptance is learnt per source; lookup drafts after a match of LONG_MATCH tokens or
#: more (the whole n-gram window of engine/lookup.py repeated: real copying) apart from
#: shorter ones. Measured here on the copy and built-in prompts, first-token acceptance:
#: short matches 0.77 greedy, 0.70 at T = 0.8; long ones 1.00 and 0.86-1.00.
SOURCES = ("model", "lookup", "lookup-long")
LONG_MATCH = 8
#: A probe costs more than its drafts: the draft model first catches up on every token
#: the target decoded alone since the call began (a batch of 32 cost 90 ms here, 3.3 F32
#: target steps), so what probing costs grows with how late in a call the last probe
#: comes: 12% of a paused call's time with a probe every 16 rounds. Reading the draft's
#: rows while it catches up (RoundOutcome.shadow) tells how it would have done on every
#: paused token, so one early probe says much: the first comes after PROBE_EVERY paused
#: rounds of a call, each next one PROBE_GROWTH times later, at most PROBE_EVERY_MAX.
PROBE_EVERY = 8
PROBE_GROWTH = 4
PROBE_EVERY_MAX = 256
PROBE_K = 2
#: Probe only if drafting would pay at this acceptance (or the estimate, if higher),
#: or at the estimate's upper bound (UPPER_Z deviations) once the first draft position
#: has been seen often: on the F32 pair at T = 0.8 (first-draft acceptance ~0.6) probes
#: kept coming though the shadow of every paused token said they would not pay. Every
#: probe makes the draft model catch up on all the tokens paused before it (2.6 ms each
#: on the F32 pair, 7% of a target step), so probes that cannot pay cost that much of
#: the paused time whatever their spacing: at 2 deviations auto ran at 0.94x the target
#: alone in simulated generations where drafting could not pay, at 0.5 at 0.98x.
OPTIMISTIC_ALPHA = 0.9
UPPER_Z = 0.5
#: A new call keeps this share of the acceptance evidence: a new text may differ, so
#: its first probe is not ruled out by the last call's estimate.
CARRY_OVER = 0.5
#: Drafting resumes after a pause only if it pays for the draft model's catch-up too
#: (every token it missed, in one batch: 8 tokens cost 2.4 draft steps here), spread
#: over this many rounds; and once drafting, auto keeps at it while the best k is
#: expected within KEEP_MARGIN of the target alone, not `margin` faster. Without that
#: band, an estimate near the boundary (F32 pair, greedy: acceptance 0.72-0.76, one
#: rejection moving it by 0.03) flipped drafting off and on every few rounds, each flip
#: a catch-up and often a long pause after an unlucky probe.
RESUME_HORIZON = 16
KEEP_MARGIN = -0.02
#: T(1), the cost of the target alone that every decision is weighed against, is only
#: seen in rounds without a draft: while drafting pays by less than MARGINAL, one round
#: in REFERENCE_EVERY decodes plainly (under 1% of the time at a 1.15x gain). Without
#: it, T(1) kept a first decode's 49 ms where later ones took 34 (F32 pair, greedy):
#: auto predicted 1.15x and ran at 0.86x.
REFERENCE_EVERY = 32
MARGINAL = 1.3
#: What one token of catch-up costs until a catch-up is seen, in draft steps (SmolLM2
#: Q4_0 here: a batch of 8 took 2.4 steps, of 64 13.3).
CATCH_UP_PRIOR = 0.25
#: While drafting, a model draft may run up to STOP_RULE_CAP tokens and ends where the
#: next token is not worth its cost (`AutoDraftLength.extend`): the draft model's
#: confidence tells which tokens will be accepted. Teacher forcing on the F32 pair,
#: greedy: drafts with confidence 0.2-0.4 matched the target 52% of the time, 0.6-0.8
#: 91%, above 0.9 100%; at T = 0.8 acceptance went from 0.59 to 0.97 over the same range.
#: Simulated on those records with the loop's costs, drafts that end by the rule ran
#: 1.10x-1.13x the target alone greedy where the best fixed k ran 1.06x (T = 0.8: 1.03x
#: against 1.01x); past 8 tokens the gain was under 1%.
STOP_RULE_CAP = 8
#: In hybrid drafting a lookup gives way to the draft model only where the model is
#: expected to be this much faster (`AutoDraftLength._model_does_better`).
DECLINE_MARGIN = 0.1
CONFIDENCE_BINS = 10
#: The prediction counts what each drafted token's confidence says once this many
#: verified drafts (decayed) have taught what confidences are worth.
CONFIDENCE_EVIDENCE = 30


class AcceptanceEstimate:
    """Acceptance per draft position, from decayed counts.

    Position i is "reached" in a round when positions 1..i-1 were accepted and
    the round meant to draft at least i tokens; it then counts as accepted or
    not (a rejection; a draft cut short is not counted past its end). The
    overall rate is shrunk towards `prior`, and each position towards the
    overall rate, so rarely reached positions borrow from the rest. Strongly
    (`position_weight`): measured by teacher forcing on the F32 pair, greedy,
    acceptance at position 2 given position 1 is within 0.02 of position 1's on
    four of five prompts, and with a weight of 3 two early rejections at position 2
    held its estimate at 0.5 where 0.76 was true, so auto drafted 1 for a call.
    """

    def __init__(
        self,
        prior: float = 0.6,
        prior_weight: float = 4.0,
        position_weight: float = 8.0,
        decay: float = 0.97,
        positions: int = AUTO_MAX_DRAFT,
    ) -> None:
        self.prior, self.prior_weight = prior, prior_weight
        self.position_weight, self.decay = position_weight, decay
        self.reached = [0.0] * positions
        self.accepted = [0.0] * positions

    def observe(self, reached: int, accepted: int) -> None:
        """Positions 1..reached were reached; 1..accepted of them accepted."""
        if reached <= 0:
            return
        d = self.decay
        for i in range(len(self.reached)):
            hit = i < reached
            self.reached[i] = self.reached[i] * d + hit
            self.accepted[i] = self.accepted[i] * d + (hit and i < accepted)

    def observe_first(self, chances: tuple[float, ...] | list[float]) -> None:
        """Position 1 reached once per value, accepted with that probability (first-draft
        acceptance measured without drafting: RoundOutcome.shadow)."""
        d = self.decay
        for chance in chances:
            self.reached = [r * d for r in self.reached]
            self.accepted = [a * d for a in self.accepted]
            self.reached[0] += 1.0
            self.accepted[0] += chance

    def forget(self, keep: float) -> None:
        """Keep this share of the evidence (a new text begins)."""
        self.reached = [r * keep for r in self.reached]
        self.accepted = [a * keep for a in self.accepted]

    def upper(self) -> float:
        """An upper confidence bound on first-draft acceptance (1 without evidence)."""
        a, n = self.overall, self.reached[0]
        if n <= 0:
            return 1.0
        return min(1.0, a + UPPER_Z * (max(a * (1 - a), 0.05) / n) ** 0.5)

    @property
    def overall(self) -> float:
        return (sum(self.accepted) + self.prior_weight * self.prior) / (
            sum(self.reached) + self.prior_weight
        )

    def rates(self) -> list[float]:
        a, w = self.overall, self.position_weight
        return [(acc + w * a) / (r + w) for acc, r in zip(self.accepted, self.reached)]


class ConfidenceAcceptance:
    """P(a drafted token is accepted | the draft model's confidence at it), per tenth of
    confidence, from decayed counts shrunk towards sqrt(confidence) (close to what the F32
    pair showed greedy; at T = 0.8 acceptance rose less steeply: the counts learn it).
    `next_rate` is the mean acceptance of the rows the draft model read, what the next
    row is worth before it is read."""

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.98) -> None:
        self.prior_weight, self.decay = prior_weight, decay
        self.seen = [0.0] * CONFIDENCE_BINS
        self.accepted = [0.0] * CONFIDENCE_BINS
        self.next_rate = 0.7

    @staticmethod
    def _bin(confidence: float) -> int:
        return min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))

    def rate(self, confidence: float) -> float:
        b = self._bin(confidence)
        prior = ((b + 0.5) / CONFIDENCE_BINS) ** 0.5
        return (self.accepted[b] + self.prior_weight * prior) / (self.seen[b] + self.prior_weight)

    def read(self, rate: float) -> None:
        """A row was read whose token would be accepted at `rate`."""
        self.next_rate += LEARN * (rate - self.next_rate)

    def observe(self, confidences: tuple[float, ...], accepted: int) -> None:
        """The first `accepted` drafts were accepted, the next (if any) rejected."""
        for i, c in enumerate(confidences[: accepted + 1]):
            b = self._bin(c)
            self.seen[b] = self.seen[b] * self.decay + 1.0
            self.accepted[b] = self.accepted[b] * self.decay + (i < accepted)

    def forget(self, keep: float) -> None:
        self.seen = [n * keep for n in self.seen]
        self.accepted = [a * keep for a in self.accepted]

    @property
    def evidence(self) -> float:
        return sum(self.seen)


class LoopCosts:
    """The costs as the round loop meets them, learnt from every round.

    Calibration times each model alone; in the loop they take turns. Measured here
    (SmolLM2 F32 target, Q4_0 draft, 2 threads): T(3) was 1.21-1.25 of a step in the loop
    against 1.11 calibrated (Intel Xeon), and a draft step 13 ms in the loop against 7.9
    ms calibrated (AMD EPYC: the target's decode evicts the draft's weights). So: T(n) is
    the running mean of the loop's decodes of n tokens (the calibrated curve, scaled to
    the loop, until one is seen); the draft step the running mean of the steps after a
    round's first (the calibrated one, scaled alike, until a round drafts two); the first
    step's extra, w_d, and our own time per round and per drafted token running means.
    """

    def __init__(self, curve: CostCurve, draft_step: float) -> None:
        self.curve = curve
        self.scale = 1.0  # loop / calibration, all batch sizes together
        self.verify: dict[int, float] = {}  # n -> running mean of T(n) in the loop
        self._seen: dict[int, int] = {}  # n -> decodes of n tokens learnt from
        self.calibrated_draft_step = draft_step
        self.loop_draft_step: float | None = None  # None until a round drafts two tokens
        self.draft_wake = 0.0
        self.catch_up: float | None = None  # per token the draft model caught up on
        self.overhead = 0.0
        self.overhead_per_draft = 0.0
        self._rounds = 0
        self.since_plain = REFERENCE_EVERY - 2  # rounds since one without a draft

    @property
    def draft_step(self) -> float:
        """As measured in the loop; until then calibrated, scaled like the target's
        decodes (the machine's state now)."""
        if self.loop_draft_step is not None:
            return self.loop_draft_step
        return self.calibrated_draft_step * self.scale

    def t(self, n: int) -> float:
        return self.verify.get(n, self.scale * self.curve.t(n))

    @property
    def catch_up_per_token(self) -> float:
        return self.catch_up if self.catch_up is not None else CATCH_UP_PRIOR * self.draft_step

    def catch_up_s(self, behind: int) -> float:
        """What the draft model's next draft spends catching up on `behind` tokens it
        missed, beyond a round's usual first step (one missed token, after a fully
        accepted round, is part of `draft_wake`)."""
        return 0.0 if behind < 2 else behind * self.catch_up_per_token

    def round_costs(self, model: bool, verify: tuple[float, ...]) -> RoundCosts:
        """verify: T(1..k+1) for every k considered (built once for all sources)."""
        return RoundCosts(
            verify,
            self.draft_step if model else 0.0,
            self.overhead,
            self.overhead_per_draft,
            self.draft_wake if model else 0.0,
        )

    def observe(self, outcome: RoundOutcome) -> None:
        k, n = outcome.k, outcome.k + 1
        self._rounds += 1
        self.since_plain = 0 if k == 0 else self.since_plain + 1
        # Quick at first (a calibration taken on a busy machine can be ten times off),
        # then slow: a round then counts as at most 1.5x the running estimate (another
        # process's spike was 6x here). Spikes in the first rounds (the first decodes
        # after loading, weights still paging in: 3x here) fade within a few rounds.
        early = self._rounds <= FIRST_ROUNDS
        learn, spike = (LEARN_FIRST, SPIKE_FIRST) if early else (LEARN, SPIKE)
        # The first decode of each size is not learnt from (49 ms against 34 for the
        # next ones, F32 pair: llama.cpp builds a graph of that shape); the next
        # AVERAGE_FIRST are averaged, then a running mean: auto drafts 4 only now and
        # then, and T(5) learnt at LEARN alone stayed 20% low through a call.
        count = self._seen[n] = self._seen.get(n, 0) + 1
        if outcome.target_s > 0 and count > 1:
            seen = self.t(n)
            measured = min(max(outcome.target_s, seen / spike), seen * spike)
            self.scale += learn * (measured / self.curve.t(n) - self.scale)
            averaged = max(learn, 1.0 / (count - 1)) if count <= AVERAGE_FIRST + 1 else learn
            self.verify[n] = seen + averaged * (measured - seen)
        # A draft model's decodes: its first row, then one per row after (k - 1, or k
        # when it read a row and drew nothing from it).
        rows = outcome.draft_rows or k
        if outcome.source == "model" and rows > 1 and outcome.draft_steps_s > 0:
            step, seen = outcome.draft_steps_s / (rows - 1), self.draft_step
            if self.loop_draft_step is None:
                self.loop_draft_step = min(step, seen * SPIKE_FIRST)
            else:
                step = min(max(step, seen / spike), seen * spike)
                self.loop_draft_step = seen + learn * (step - seen)
        # A round's first draft decode: one step, its wake-up (w_d) and, after rounds
        # without a model draft, a catch-up on what they emitted, learnt apart.
        if outcome.source == "model" and rows > 0:
            first = outcome.draft_s - outcome.draft_steps_s if outcome.draft_steps_s > 0 \
                else outcome.draft_s - (rows - 1) * self.draft_step
            extra = max(0.0, first - self.draft_step)
            behind = outcome.draft_caught_up
            if behind < 2:
                wake = min(extra, self.draft_wake * SPIKE + self.draft_step)
                self.draft_wake += LEARN * (wake - self.draft_wake)
            else:
                per_token = max(0.0, extra - self.draft_wake) / behind
                if self.catch_up is None:
                    self.catch_up = min(per_token, self.draft_step)
                else:
                    per_token = min(per_token, self.catch_up * SPIKE + 1e-4)
                    self.catch_up += learn * (per_token - self.catch_up)
        if outcome.seconds > 0:
            own = max(0.0, outcome.seconds - outcome.target_s - outcome.draft_s)
            own = min(own, (self.overhead + k * self.overhead_per_draft) * SPIKE + 1e-3)
            if k == 0:
                self.overhead += LEARN * (own - self.overhead)
            else:
                per_draft = max(0.0, own - self.overhead) / k
                self.overhead_per_draft += LEARN * (per_draft - self.overhead_per_draft)


@dataclass
class SourceState:
    acceptance: AcceptanceEstimate
    costs: RoundCosts
    paused: int = 0  # paused rounds since the last draft or probe
    probe_every: int = PROBE_EVERY  # paused rounds between two probes now
    decision: Decision | None = None  # valid until the acceptance estimate changes
    drafting: bool = False  # its last decision drafted (so KEEP_MARGIN applies)


class AutoState:
    """What auto keeps across the calls of one decoder: the measured costs and the
    acceptance estimate of each draft source."""

    def __init__(
        self,
        target_curve: CostCurve,
        draft_step_s: float = 0.0,
        *,
        priors: dict[str, float] | None = None,
        calibration: dict[str, Any] | None = None,
    ) -> None:
        priors = {"model": 0.6, "lookup": 0.6, "lookup-long": 0.9, **(priors or {})}
        self.target = target_curve
        self.k_max = max(0, min(AUTO_MAX_DRAFT, target_curve.max_n - 1))
        self.loop = LoopCosts(target_curve, draft_step_s)
        self.sources = {
            src: SourceState(
                AcceptanceEstimate(prior=priors[src], positions=max(1, self.k_max)),
                self.loop.round_costs(src == "model", self._verify()),
            )
            for src in SOURCES
        }
        self.confidence = ConfidenceAcceptance()
        self.calibration = calibration or {}

    def learn_costs(self, outcome: RoundOutcome) -> None:
        self.loop.observe(outcome)
        verify = self._verify()
        for name, src in self.sources.items():
            src.costs = self.loop.round_costs(name == "model", verify)
            src.decision = None

    def _verify(self) -> tuple[float, ...]:
        return tuple(self.loop.t(n) for n in range(1, self.k_max + 2))

    @classmethod
    def for_decoder(cls, decoder: SpeculativeDecoder, *, refresh: bool = False) -> AutoState:
        """The decoder's state, created (and its models calibrated) on first use;
        refresh=True measures the costs again instead of reading the cache."""
        state = decoder.policy_state.get("auto")
        if not isinstance(state, AutoState) or refresh:
            state = decoder.policy_state["auto"] = cls.calibrated(decoder, refresh=refresh)
        return state

    @staticmethod
    def measuring(decoder: SpeculativeDecoder, *, refresh: bool = False) -> str | None:
        """What creating the decoder's state will measure, in words for a spinner;
        None when the cached costs serve."""
        if refresh:
            return "measuring decode costs again (--recalibrate; a few seconds at most)"
        if isinstance(decoder.policy_state.get("auto"), AutoState):
            return None
        found = [cached(decoder.target, TARGET_MAX_N)]
        if decoder.draft is not None:
            found.append(cached(decoder.draft, DRAFT_MAX_N))
        if any(c is None for c in found):
            return ("measuring decode costs for these models and thread count (a few "
                    "seconds at most; kept for next time)")
        if not all(c is not None and c.quiet for c in found):
            return ("measuring decode costs again: the last measurement was disturbed by "
                    "other processes (a few seconds at most; the better one is kept)")
        return None

    @classmethod
    def calibrated(cls, decoder: SpeculativeDecoder, *, refresh: bool = False) -> AutoState:
        target = calibrate(decoder.target, TARGET_MAX_N, use_cache=not refresh)
        info = {"target": target.to_dict()}
        draft_step = 0.0
        if decoder.draft is not None:
            draft = calibrate(decoder.draft, DRAFT_MAX_N, use_cache=not refresh)
            info["draft"] = draft.to_dict()
            draft_step = draft.curve.t(1)
        return cls(target.curve, draft_step, calibration=info)

    def source(self, name: str) -> SourceState:
        return self.sources[name if name in self.sources else "model"]

    def costs(self, source: str) -> RoundCosts:
        return self.source(source).costs


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
    _chosen: dict[str, int] = field(default_factory=dict)  # per key of state.sources
    _key_of: dict[str, str] = field(default_factory=dict)  # a round's source -> its key
    _tally: dict[str, _Tally] = field(default_factory=dict)
    # What the cost model expected of the rounds as they were run (the k each used,
    # the acceptance known before it): tokens and seconds, summed.
    _expected_s: float = 0.0
    _alone_s: float = 0.0  # the target alone, for the same expected tokens
    _behind: int = 0  # committed tokens the draft model lacks (RoundOutcome.draft_behind)
    _model_asked: bool = False  # the draft model is in play in this call (hybrid drafting)
    # The model draft of this round (see extend): the tokens per second its tokens must
    # beat, and the chance that every token drafted so far is accepted.
    _rate: float = 0.0
    _reach: float = 1.0

    @classmethod
    def for_decoder(cls, decoder: SpeculativeDecoder) -> AutoDraftLength:
        state = AutoState.for_decoder(decoder)
        # A new call is a new text: probe it soon, whatever the last one taught.
        for src in state.sources.values():
            # Probe in the first round if paused (the draft model is in step with the
            # prompt then, so a probe costs the least it ever will), the next one after
            # PROBE_EVERY paused rounds as usual.
            src.paused, src.probe_every = 0, 1
            src.acceptance.forget(CARRY_OVER)
            src.decision = None
            src.drafting = False
        state.confidence.forget(CARRY_OVER)
        return cls(state)

    def _decision(self, src: SourceState) -> Decision:
        if src.decision is None:
            costs, margin = src.costs, self.margin
            if src is self.state.sources["model"]:
                if src.drafting:
                    margin = KEEP_MARGIN
                else:  # resuming: the catch-up too, spread over the rounds it enables
                    catch_up = self.state.loop.catch_up_s(self._behind)
                    costs = replace(costs, draft_wake=costs.draft_wake
                                    + catch_up / RESUME_HORIZON)
            src.decision = decide(src.acceptance.rates(), costs, self.state.k_max, margin)
        return src.decision

    @staticmethod
    def _optimistic(src: SourceState) -> float:
        estimate = src.acceptance
        return min(0.95, max(OPTIMISTIC_ALPHA, estimate.overall), estimate.upper())

    def _hopeful(self, src: SourceState) -> Decision:
        """The decision at an optimistic acceptance: could drafting pay at all?"""
        return decide(self._optimistic(src), src.costs, self.state.k_max, self.margin)

    def choose(self, source: str = "model", match: int = 0) -> int:
        if source == "lookup" and match >= LONG_MATCH:
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
            src.probe_every = PROBE_EVERY
            if (decision.speedup < MARGINAL
                    and self.state.loop.since_plain >= REFERENCE_EVERY):
                k = 0
            else:
                tally.speedup_sum += decision.speedup
        else:
            src.paused += 1
            if src.paused >= src.probe_every:
                src.paused = 0
                src.probe_every = min(PROBE_EVERY_MAX,
                                      max(PROBE_EVERY, PROBE_GROWTH * src.probe_every))
                hopeful = self._hopeful(src)
                if hopeful.speculate:
                    k = max(1, min(PROBE_K, hopeful.best_k))
                    tally.probes += 1
        if k > 0:
            tally.drafted += 1
            if source == "model":
                # The rule of `extend` ends the draft (a probe's too, at PROBE_K); the rate
                # its tokens must beat is what drafting is expected to give, at least the
                # target alone's.
                self._rate = max(1.0, decision.speedup) / src.costs.round_s(0)
                if decision.k > 0:
                    k = max(k, min(STOP_RULE_CAP, self.state.k_max))
        self._chosen[source] = k
        return k

    def _model_does_better(self, lookup: SourceState, decision: Decision) -> bool:
        """Hybrid drafting: a lookup round takes the place of a model draft, so it is
        declined where the draft model is expected to do better, counting the catch-up the
        lookup's tokens cost the draft model next time. At T = 0.8 a short match is
        accepted 0.4-0.5 of the time, a laptop's 0.5B draft (0.1 of a step) 0.7-0.8:
        that lookup pays against the target alone (1.2-1.3x) and loses against the model
        (1.5x). Only once the model has been asked in this call (not with lookup alone),
        and only by a clear margin: where the model's gain was marginal (F32 pair, Intel
        Xeon, T = 0.8, predicted 1.05-1.13x, measured 0.91-1.0x) declining on any
        advantage took hybrid on the copy prompts from 1.22x to 1.11x."""
        if not self._model_asked:
            return False
        model = self._decision(self.state.sources["model"])
        if not model.speculate:
            return False
        # decision.speedup is E/C against 1/T(1); the catch-up adds a share of a step a token
        catch_up = self.state.loop.catch_up_per_token / lookup.costs.round_s(0)
        return model.speedup > (1 + DECLINE_MARGIN) / (1 / decision.speedup + catch_up)

    def extend(self, j: int, confidence: float) -> DraftStep:
        """Draw token j if what it adds, the chance it is accepted with all before it,
        pays for verifying one more token at the rate drafting gives; read the next
        row if a token of average acceptance there would pay for the draft step too.

        The first token is always drawn: drafting was decided on its acceptance, which
        thus stays measured on every round (a round cut before it would teach nothing,
        and its draft step and wake-up are paid already)."""
        known = self.state.confidence
        accept = known.rate(confidence)
        known.read(accept)
        if j == 0:
            self._reach = 1.0
        costs = self.state.costs("model")
        t, per_draft = costs.target, costs.overhead_per_draft
        if j > 0 and self._reach * accept < self._rate * (t[j + 1] - t[j] + per_draft):
            return "stop"
        self._reach *= accept
        # Going on pays if some number of further tokens, each of average acceptance,
        # is worth its draft steps and verification at that rate.
        gain, cost, run = 0.0, 0.0, self._reach
        for n in range(j + 2, min(costs.k_max, STOP_RULE_CAP) + 1):
            run *= known.next_rate
            gain += run
            cost += costs.draft + per_draft + t[n] - t[n - 1]
            if gain >= self._rate * cost:
                return "more"
        return "last"

    def may_draft(self, source: str = "model") -> bool:
        """False only where drafting from `source` could not pay even at the
        optimistic acceptance that gates probes."""
        src = self.state.source(source)
        return self._decision(src).speculate or self._hopeful(src).speculate

    def predicted_speedup(self) -> float | None:
        """The speedup over the target alone that the cost model expected for the
        rounds of this call, or None before any round."""
        if self._expected_s <= 0:
            return None
        return self._alone_s / self._expected_s

    def observe(self, outcome: RoundOutcome) -> None:
        source = self._key_of.get(outcome.source, outcome.source)
        self._key_of.clear()
        expected = self.state.source(source)
        known = self.state.confidence
        if outcome.confidences and known.evidence >= CONFIDENCE_EVIDENCE:
            # What the draft model's confidence at each token said: the stop rule keeps
            # the sure tokens, which the acceptance per position does not know (greedy,
            # it predicted 0.97x-1.19x where 1.14x-1.38x were measured).
            tokens = expected_tokens([known.rate(c) for c in outcome.confidences], outcome.k)
        else:
            tokens = expected_tokens(expected.acceptance.rates(), outcome.k)
        costs = expected.costs
        self._expected_s += costs.round_s(outcome.k)
        if outcome.source == "model" and outcome.draft_rows > 0:
            # A row read and nothing drawn from it cost a draft step (and, the first
            # row, the round's wake-up): no round without drafts charges them.
            extra = outcome.draft_rows - outcome.k
            self._expected_s += extra * (costs.draft + costs.overhead_per_draft)
            if outcome.k == 0:
                self._expected_s += costs.draft_wake
        if outcome.source == "model" and (outcome.k > 0 or outcome.draft_rows > 0):
            self._expected_s += self.state.loop.catch_up_s(outcome.draft_caught_up)
        self._alone_s += costs.round_s(0) * tokens
        self._behind = outcome.draft_behind
        self.state.learn_costs(outcome)
        if outcome.shadow:
            model = self.state.source("model")
            model.acceptance.observe_first(outcome.shadow)
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
        if chosen == 0:
            return
        m, k = outcome.accepted, outcome.k
        self._tally.setdefault(source, _Tally()).k_sum += k
        if outcome.confidences:
            known.observe(outcome.confidences, m)
        if m < k:
            reached = m + 1  # rejected at m + 1
        else:
            # A draft cut short, by the draft model's confidence cutoff (p_min) or where
            # a lookup match ends, says nothing about the acceptance of the tokens it
            # did propose; counting the cut as a rejection made auto draft too short
            # (F32 pair, greedy: estimate 69% where drafts were accepted 77-86%).
            reached = k
        src = self.state.source(source)
        src.acceptance.observe(reached, m)
        src.decision = None

    def describe(self) -> str:
        if not self._tally:
            return "auto: nothing to draft with (target alone)"
        return "auto: " + " | ".join(self._describe(s, t) for s, t in self._tally.items())

    def explain(self) -> str:
        return ""

    def _describe(self, source: str, tally: _Tally) -> str:
        src = self.state.source(source)
        d = tally.last
        assert d is not None
        k, costs, alpha = d.best_k or 1, src.costs, src.acceptance.overall
        t1 = costs.target[0]
        verify = f"verifying {k + 1} tokens costs {costs.target[k] / t1:.1f}x one token here"
        if source == "model":
            verify += f" and a draft step {costs.draft / t1:.2f}x"
        label = {"model": "", "lookup-long": "lookup after long matches: "}.get(
            source, f"{source}: ")
        real = tally.drafted - tally.probes
        if not d.speculate:
            msg = (f"{label}drafting would not pay here: {k} draft{'s' if k > 1 else ''} a "
                   f"round would run at {d.speedup:.2f}x the target alone at {alpha:.0%} "
                   f"acceptance ({verify})")
            if tally.probes:
                return msg + f" (probed {tally.probes}x)"
            if not self._hopeful(src).speculate:
                return msg + (f"; even at {self._optimistic(src):.0%} acceptance it would "
                              "not, so no probes")
            return msg
        share = real / tally.rounds
        when = "" if share >= 0.95 else f" in {share:.0%} of rounds"
        return (f"{label}drafted{when}, k {tally.k_sum / max(1, tally.drafted):.1f} on average, "
                f"acceptance {alpha:.0%}: the cost model predicted "
                f"{tally.speedup_sum / max(1, real):.2f}x the target alone ({verify})")
