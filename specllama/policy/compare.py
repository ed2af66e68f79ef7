"""How a run compares with the target alone on this machine: the line every stats
panel leads with, so a figure like "2.47 tokens per step" cannot pass for a win when
the run was slower than the target would have been on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..engine.loop.stats import Stats
from .auto import AutoState
from .calibration import TARGET_MAX_N, CostCurve, cached, calibrate

if TYPE_CHECKING:
    from ..engine.decoder import SpeculativeDecoder

#: Within this (relative) of the target alone, speculation made no difference.
EVEN = 0.05

Verdict = Literal["helped", "hurt", "even", "off"]


@dataclass(frozen=True)
class Comparison:
    verdict: Verdict
    speedup: float | None = None  # this run's speed / the target alone's (estimated)
    alone_tok_s: float | None = None  # the target alone's estimated speed in this run
    predicted: float | None = None  # the speedup auto's cost model expected (Stats)

    def line(self, reason: str = "") -> str:
        """One line for the stats panel; `reason` says why speculation was off."""
        if self.verdict == "off" or self.speedup is None or self.alone_tok_s is None:
            return "off: the target decoded every token alone" + (f" ({reason})" if reason
                                                                   else "")
        head = {"helped": "helped", "hurt": "hurt", "even": "made no difference"}[self.verdict]
        predicted = "" if self.predicted is None else f"auto predicted {self.predicted:.2f}x; "
        return (f"{head}: {self.speedup:.2f}x the target alone ({predicted}estimate: the "
                f"target alone would run at about {self.alone_tok_s:.1f} tok/s here, from its "
                "measured step cost)")


def versus_target(stats: Stats, curve: CostCurve) -> Comparison:
    """Estimate what the target alone would have done in this run's conditions.

    The calibration gives T(1), one target step, and T(k+1), one verification; the
    run's own target time against what the calibration predicts for its rounds is how
    much slower the machine was than when it was measured (a busy spell), and the
    estimate is scaled by that, so a busy run is not blamed on speculation. The target
    alone would also pay, per token, what this run's plain rounds paid outside
    llama.cpp (sampling, bookkeeping) and the time spent outside the rounds (printing):
    speculation is credited or blamed only for what it changed."""
    if stats.drafted == 0 or stats.tokens == 0 or stats.generate_s <= 0:
        return Comparison("off")
    predicted = sum(rounds * curve.t(k + 1) for k, rounds in stats.draft_lengths.items())
    slowdown = stats.target_s / predicted if predicted > 0 and stats.target_s > 0 else 1.0
    own = stats.plain_own_s / stats.plain_rounds if stats.plain_rounds else 0.0
    outside = max(0.0, stats.generate_s - stats.rounds_s) if stats.rounds_s > 0 else 0.0
    alone_s = stats.tokens * (curve.t(1) * slowdown + own) + outside
    speedup = alone_s / stats.generate_s
    verdict: Verdict = "helped" if speedup >= 1 + EVEN else ("hurt" if speedup <= 1 - EVEN
                                                            else "even")
    return Comparison(verdict, speedup, stats.tokens / alone_s, stats.predicted_speedup)


def compare_with_target(decoder: SpeculativeDecoder, stats: Stats) -> Comparison:
    """versus_target with the decoder's measured target costs: auto's, or measured now
    (once per model and thread count; cached) for a run with a fixed draft length."""
    if stats.drafted == 0:
        return Comparison("off")
    state = decoder.policy_state.get("auto")
    if isinstance(state, AutoState):
        curve = state.target
    else:
        curve = calibrate(decoder.target, TARGET_MAX_N).curve
    return versus_target(stats, curve)


def needs_measuring(decoder: SpeculativeDecoder) -> bool:
    """Whether compare_with_target would measure first (for a spinner)."""
    if isinstance(decoder.policy_state.get("auto"), AutoState):
        return False
    found = cached(decoder.target, TARGET_MAX_N)
    return found is None or not found.quiet
