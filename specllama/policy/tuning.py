"""Every tuned number of the auto policy, in one place.

Each field keeps its reason in a line or two; the measurements behind the values
are in docs/lab/2026-12-auto-tuning.md, "auto's tuned numbers", with the ablation that switches
each mechanism off in turn (`bench/ablation.py`). The environment variable
SPECLLAMA_AUTO_TUNING="name=value,..." overrides fields for a run (`from_env`, read
when a decoder's auto state is created): that is how the real-model ablation is run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

from ..errors import InvalidParameterError
from .costs import DEFAULT_MARGIN

ENV = "SPECLLAMA_AUTO_TUNING"


@dataclass(frozen=True)
class AutoTuning:
    """The auto policy's tuned numbers (defaults: what the measurements in
    docs/lab/2026-12-auto-tuning.md, "auto's tuned numbers", chose). A value of `inf` or 0 where
    noted switches a mechanism off, for the ablation."""

    # --- the decision
    #: Start drafting only where the best k is expected this much faster than the target.
    margin: float = DEFAULT_MARGIN
    #: Once drafting, keep at it while the best k is expected within this of the target
    #: alone: near the boundary one rejection otherwise flipped drafting off and on,
    #: each flip a catch-up (= margin: no hysteresis).
    keep_margin: float = -0.02
    #: Resuming after a pause must pay for the draft model's catch-up too, spread over
    #: this many rounds (inf: the catch-up is not priced).
    resume_horizon: float = 16.0
    #: Auto verifies at most max_draft + 1 tokens at once (the calibrated range).
    max_draft: int = 15

    # --- probes while paused
    #: The first probe after this many paused rounds of a call, each next one
    #: probe_growth times later, at most probe_every_max: a probe makes the draft model
    #: catch up on every paused token, so its cost grows with the spacing.
    probe_every: int = 8
    probe_growth: int = 4
    probe_every_max: int = 256
    #: A probe's draft length (0: no probes).
    probe_k: int = 2
    #: After a probe whose every draft was accepted, probe again next round (off: at the
    #: spacing above; the synthetic Qwen3.5's MTP layer then waited 8 of 48 rounds).
    probe_again: bool = True
    #: Probe only where drafting would pay at this acceptance (or the estimate, if
    #: higher), capped at the estimate's upper bound.
    optimistic_alpha: float = 0.9
    #: The upper bound is this many standard deviations above the estimate: probes that
    #: cannot pay still cost a catch-up each (inf: no upper bound).
    upper_z: float = 0.5
    #: The variance floor of that bound, so an estimate of 0 or 1 is not certain.
    upper_variance_floor: float = 0.05
    #: No bound below this much evidence of first drafts (decayed counts): one rejected
    #: probe of a near-copy MTP layer otherwise capped it at 0.73 for the whole call.
    upper_min_evidence: float = 1.5
    #: A new call keeps this share of the acceptance evidence: a new text may differ.
    carry_over: float = 0.5
    #: Learn first-draft acceptance from the draft model's catch-up on paused tokens
    #: (ModelWork.shadow), not from the probe's own drafts alone.
    shadow: bool = True

    # --- the target alone as reference
    #: While drafting pays by less than `marginal`, one round in reference_every decodes
    #: plainly: T(1) is only seen in such rounds, and a stale one misjudged every round.
    reference_every: int = 32
    marginal: float = 1.3

    # --- acceptance estimates
    #: Per-source priors of first-draft acceptance; lookups after long matches copy.
    prior_model: float = 0.6
    prior_lookup: float = 0.6
    prior_lookup_long: float = 0.9
    #: A lookup match of this many tokens or more (the n-gram window repeated) is copying.
    long_match: int = 8
    #: The prior's weight in counts, and each position's pull towards the overall rate
    #: (strong: position 2's acceptance given position 1 is close to position 1's).
    prior_weight: float = 4.0
    position_weight: float = 8.0
    #: Per-round decay of the acceptance counts.
    decay: float = 0.97

    # --- the stop rule and the draft model's confidence
    #: A model draft may run to this many tokens and ends where the next is not worth
    #: its cost (0: no stop rule; drafts run to the k decided).
    stop_rule_cap: int = 8
    confidence_bins: int = 10
    #: Counts per bin are shrunk towards confidence ** confidence_prior_power.
    confidence_prior_power: float = 0.5
    confidence_prior_weight: float = 2.0
    #: Fit the curve's power to every bin's counts at once (off: the prior's power, each
    #: bin learnt alone; a near-copy MTP layer then drafted one token where three paid).
    confidence_fit: bool = True
    confidence_decay: float = 0.98
    #: A lookup's share of agreeing copies (engine.lookup.Continuation) is a frequency: its
    #: prior is share ** this (1: taken at its word until the counts say otherwise).
    lookup_prior_power: float = 1.0
    #: What the next row is worth before any is read.
    next_rate_prior: float = 0.7
    #: Predict a round's tokens from each drafted token's confidence once this many
    #: verified drafts (decayed) were seen (inf: from the acceptance per position only).
    confidence_evidence: float = 30.0

    # --- hybrid drafting
    #: A lookup gives way to the draft model only where the model is expected this much
    #: faster (inf: never declined).
    decline_margin: float = 0.1

    # --- the loop's costs
    #: Weight of the latest round in the running cost estimates, and the cap on a
    #: round's time relative to the estimate (why this cap: docs/lab/2026-12-auto-tuning.md).
    learn: float = 0.1
    spike: float = 1.5
    #: A decoder's first rounds weigh more: a calibration on a busy machine can be ten
    #: times off, and the first decodes after loading page weights in.
    learn_first: float = 0.5
    spike_first: float = 4.0
    first_rounds: int = 8
    #: A batch size's first decodes after its graph-building first are averaged.
    average_first: int = 4

    @classmethod
    def parse(cls, text: str, base: AutoTuning | None = None) -> AutoTuning:
        """"name=value,name=value" over `base` (the defaults): bad input is one line."""
        base = base or cls()
        kinds = {f.name: f.type for f in fields(cls)}
        changes: dict[str, float | int | bool] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = (s.strip() for s in item.partition("="))
            if not sep or name not in kinds:
                raise InvalidParameterError(
                    f"{ENV}: {item!r} is not name=value with a name of AutoTuning "
                    f"({', '.join(kinds)})")
            changes[name] = _value(name, kinds[name], value)
        return replace(base, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls) -> AutoTuning:
        """The defaults, with SPECLLAMA_AUTO_TUNING applied (the one place it is read)."""
        return cls.parse(os.environ.get(ENV, ""))

    def changed(self) -> str:
        """The fields that differ from the defaults, as parse reads them ("" if none)."""
        default = AutoTuning()
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if getattr(self, f.name) != getattr(default, f.name))


def _value(name: str, kind: object, text: str) -> float | int | bool:
    try:
        if kind in ("bool", bool):
            if text.lower() in ("1", "true", "on", "yes"):
                return True
            if text.lower() in ("0", "false", "off", "no"):
                return False
            raise ValueError(text)
        if kind in ("int", int):
            return int(text)
        value = float(text)
        if math.isnan(value):
            raise ValueError(text)
        return value
    except ValueError:
        raise InvalidParameterError(
            f"{ENV}: {name}={text!r} is not a valid {kind}") from None
