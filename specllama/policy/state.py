"""What auto keeps across the calls of one decoder: measured costs, acceptance
estimates per draft source, and the tuning they were made under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.loop.events import RoundVerified
from .acceptance import AcceptanceEstimate, ConfidenceAcceptance
from .calibration import DRAFT_MAX_N, TARGET_MAX_N, CostCurve, cached, calibrate
from .costs import Decision, RoundCosts
from .loopcosts import LoopCosts
from .tuning import AutoTuning

if TYPE_CHECKING:
    from ..engine.loop.lengths import PolicyHost

#: Acceptance is learnt per source; lookup drafts after a long match (real copying)
#: apart from shorter ones.
SOURCES = ("model", "lookup", "lookup-long")


@dataclass
class SourceState:
    acceptance: AcceptanceEstimate
    costs: RoundCosts
    probe_every: int  # paused rounds between two probes now
    paused: int = 0  # paused rounds since the last draft or probe
    decision: Decision | None = None  # valid until the acceptance estimate changes
    drafting: bool = False  # its last decision drafted (so keep_margin applies)


class AutoState:
    """What auto keeps across the calls of one decoder: the measured costs and the
    acceptance estimate of each draft source, under one `AutoTuning`."""

    def __init__(
        self,
        target_curve: CostCurve,
        draft_curve: CostCurve | None = None,
        *,
        priors: dict[str, float] | None = None,
        calibration: dict[str, Any] | None = None,
        tuning: AutoTuning | None = None,
    ) -> None:
        """draft_curve: the draft model's calibrated decodes, last row only (see
        LoopCosts); None without a draft model."""
        self.tuning = t = tuning or AutoTuning()
        priors = {"model": t.prior_model, "lookup": t.prior_lookup,
                  "lookup-long": t.prior_lookup_long, **(priors or {})}
        self.target = target_curve
        self.k_max = max(0, min(t.max_draft, target_curve.max_n - 1))
        self.loop = LoopCosts(target_curve, draft_curve, t)
        self.sources = {
            src: SourceState(
                AcceptanceEstimate.tuned(t, priors[src], max(1, self.k_max)),
                self.loop.round_costs(src == "model", self._verify()),
                t.probe_every,
            )
            for src in SOURCES
        }
        # P(accepted | confidence): the draft model's top probability, and apart, per
        # lookup source, a lookup's share of agreeing occurrences (engine.lookup.Continuation).
        self.confidence = ConfidenceAcceptance(t)
        self.lookup_confidence = {src: ConfidenceAcceptance(t, t.lookup_prior_power)
                                  for src in SOURCES if src != "model"}
        self.calibration = calibration or {}

    def learn_costs(self, outcome: RoundVerified) -> None:
        self.loop.observe(outcome)
        verify = self._verify()
        for name, src in self.sources.items():
            src.costs = self.loop.round_costs(name == "model", verify)
            src.decision = None

    def _verify(self) -> tuple[float, ...]:
        return tuple(self.loop.t(n) for n in range(1, self.k_max + 2))

    @classmethod
    def for_decoder(cls, decoder: PolicyHost, *, refresh: bool = False) -> AutoState:
        """The decoder's state, created (and its models calibrated) on first use;
        refresh=True measures the costs again instead of reading the cache."""
        state = decoder.policy_state.get("auto")
        if not isinstance(state, AutoState) or refresh:
            state = decoder.policy_state["auto"] = cls.calibrated(decoder, refresh=refresh)
        return state

    @staticmethod
    def measuring(decoder: PolicyHost, *, refresh: bool = False) -> str | None:
        """What creating the decoder's state will measure, in words for a spinner;
        None when the cached costs serve."""
        if refresh:
            return "measuring decode costs again (--recalibrate; a few seconds at most)"
        if isinstance(decoder.policy_state.get("auto"), AutoState):
            return None
        found = [cached(decoder.target, TARGET_MAX_N)]
        if decoder.draft is not None:
            found.append(cached(decoder.draft, DRAFT_MAX_N, "last"))
        if any(c is None for c in found):
            return ("measuring decode costs for these models and thread count (a few "
                    "seconds at most; kept for next time)")
        if not all(c is not None and c.quiet for c in found):
            return ("measuring decode costs again: the last measurement was disturbed by "
                    "other processes (a few seconds at most; the better one is kept)")
        return None

    @classmethod
    def calibrated(cls, decoder: PolicyHost, *, refresh: bool = False) -> AutoState:
        tuning = AutoTuning.from_env()  # first: a bad value fails before measuring
        target = calibrate(decoder.target, TARGET_MAX_N, use_cache=not refresh)
        info = {"target": target.to_dict()}
        draft_curve = None
        if decoder.draft is not None:
            draft = calibrate(decoder.draft, DRAFT_MAX_N, use_cache=not refresh, rows="last")
            info["draft"] = draft.to_dict()
            draft_curve = draft.curve
        return cls(target.curve, draft_curve, calibration=info, tuning=tuning)

    def confidence_of(self, source: str) -> ConfidenceAcceptance:
        return self.lookup_confidence.get(source, self.confidence)

    def source(self, name: str) -> SourceState:
        return self.sources[name if name in self.sources else "model"]

    def costs(self, source: str) -> RoundCosts:
        return self.source(source).costs
