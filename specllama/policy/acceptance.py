"""Estimates of acceptance: per draft position, and per draft-model confidence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tuning import AutoTuning

DEFAULT = AutoTuning()
#: The powers gamma of the curve confidence ** gamma that ConfidenceAcceptance fits.
GAMMAS = 0.02 * 1.15 ** np.arange(40)  # 0.02 .. 4.7


class AcceptanceEstimate:
    """Acceptance per draft position, from decayed counts.

    Position i is "reached" in a round when positions 1..i-1 were accepted and
    the round meant to draft at least i tokens; it then counts as accepted or
    not (a rejection; a draft cut short is not counted past its end). The
    overall rate is shrunk towards `prior`, and each position towards the
    overall rate, so rarely reached positions borrow from the rest, strongly
    (`position_weight`): position 2's acceptance given position 1 is close to
    position 1's, and a weak pull let two early rejections there hold auto at one
    draft for a call.
    """

    def __init__(
        self,
        prior: float = DEFAULT.prior_model,
        prior_weight: float = DEFAULT.prior_weight,
        position_weight: float = DEFAULT.position_weight,
        decay: float = DEFAULT.decay,
        positions: int = DEFAULT.max_draft,
        upper_z: float = DEFAULT.upper_z,
        upper_variance_floor: float = DEFAULT.upper_variance_floor,
        upper_min_evidence: float = DEFAULT.upper_min_evidence,
    ) -> None:
        self.prior, self.prior_weight = prior, prior_weight
        self.position_weight, self.decay = position_weight, decay
        self.upper_z, self.upper_variance_floor = upper_z, upper_variance_floor
        self.upper_min_evidence = upper_min_evidence
        self.reached = [0.0] * positions
        self.accepted = [0.0] * positions

    @classmethod
    def tuned(cls, tuning: AutoTuning, prior: float, positions: int) -> AcceptanceEstimate:
        return cls(prior, tuning.prior_weight, tuning.position_weight, tuning.decay,
                   positions, tuning.upper_z, tuning.upper_variance_floor,
                   tuning.upper_min_evidence)

    def observe(self, reached: int, accepted: int) -> None:
        """Positions 1..reached were reached; 1..accepted of them accepted."""
        if reached <= 0:
            return
        d = self.decay
        for i in range(len(self.reached)):
            hit = i < reached
            self.reached[i] = self.reached[i] * d + hit
            self.accepted[i] = self.accepted[i] * d + (hit and i < accepted)

    def observe_first(self, chances: Sequence[float]) -> None:
        """Position 1 reached once per value, accepted with that probability (first-draft
        acceptance measured without drafting: ModelWork.shadow)."""
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
        """An upper confidence bound on first-draft acceptance (1 without enough evidence:
        a single draft says little of a rate)."""
        a, n = self.overall, self.reached[0]
        if n <= 0 or n < self.upper_min_evidence:
            return 1.0
        spread = (max(a * (1 - a), self.upper_variance_floor) / n) ** 0.5
        return min(1.0, a + self.upper_z * spread)

    @property
    def overall(self) -> float:
        return (sum(self.accepted) + self.prior_weight * self.prior) / (
            sum(self.reached) + self.prior_weight
        )

    def rates(self) -> list[float]:
        a, w = self.overall, self.position_weight
        return [(acc + w * a) / (r + w) for acc, r in zip(self.accepted, self.reached)]


class ConfidenceAcceptance:
    """P(a drafted token is accepted | the draft model's confidence at it), per bin of
    confidence, from decayed counts shrunk towards the curve confidence ** gamma.
    `next_rate` is the mean acceptance of the rows the draft model read, what the next
    row is worth before it is read.

    gamma is fit to every bin's counts at once (the most likely on a grid, with a prior's
    pseudo-counts at confidence ** prior_power): the F32 pair's drafts, greedy, were
    accepted close to confidence ** 0.5, but an MTP layer near a copy of its target has
    almost every draft accepted at any confidence, and per bin alone that took most of a
    48-token call to learn (a draft of one token a round where three paid)."""

    def __init__(self, tuning: AutoTuning = DEFAULT, prior_power: float | None = None) -> None:
        """prior_power: the prior is confidence ** this (None: the tuning's, for a draft
        model's confidence)."""
        self.tuning = tuning
        self.prior_power = tuning.confidence_prior_power if prior_power is None else prior_power
        self.bins = tuning.confidence_bins
        self.seen = [0.0] * self.bins
        self.accepted = [0.0] * self.bins
        self.next_rate = tuning.next_rate_prior
        self.centres = (np.arange(self.bins) + 0.5) / self.bins
        self.gamma = self.prior_power
        self._curve = self.centres ** self.gamma

    def _bin(self, confidence: float) -> int:
        return min(self.bins - 1, max(0, int(confidence * self.bins)))

    def rate(self, confidence: float) -> float:
        b, w = self._bin(confidence), self.tuning.confidence_prior_weight
        return (self.accepted[b] + w * float(self._curve[b])) / (self.seen[b] + w)

    def read(self, rate: float) -> None:
        """A row was read whose token would be accepted at `rate`."""
        self.next_rate += self.tuning.learn * (rate - self.next_rate)

    def observe(self, confidences: Sequence[float], accepted: int) -> None:
        """The first `accepted` drafts were accepted, the next (if any) rejected."""
        decay = self.tuning.confidence_decay
        for i, c in enumerate(confidences[: accepted + 1]):
            b = self._bin(c)
            self.seen[b] = self.seen[b] * decay + 1.0
            self.accepted[b] = self.accepted[b] * decay + (i < accepted)
        if self.tuning.confidence_fit:
            self._fit()

    def _fit(self) -> None:
        """gamma: the most likely curve given the counts and the prior's pseudo-counts
        (confidence_prior_weight of them in all, spread over the bins)."""
        pseudo = self.tuning.confidence_prior_weight / self.bins
        seen = np.asarray(self.seen) + pseudo
        accepted = np.asarray(self.accepted) + pseudo * self.centres ** self.prior_power
        curves = self.centres[None, :] ** GAMMAS[:, None]
        likelihood = (accepted * np.log(curves)
                      + (seen - accepted) * np.log1p(-np.minimum(curves, 1 - 1e-9))).sum(1)
        self.gamma = float(GAMMAS[int(np.argmax(likelihood))])
        self._curve = self.centres ** self.gamma

    def forget(self, keep: float) -> None:
        self.seen = [n * keep for n in self.seen]
        self.accepted = [a * keep for a in self.accepted]

    @property
    def evidence(self) -> float:
        return sum(self.seen)
