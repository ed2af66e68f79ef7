"""Where a draft ends under `draft_max="auto"`: the stop rule.

`AutoDraftLength.choose` sets the rate a draft's tokens must beat (what drafting is
expected to give); then, row by row, `StopRule.extend` draws the next token while what
it is expected to add pays for verifying it (and, in a model draft, for its draft step)
at that rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.drafting.base import DraftStep
from .state import AutoState


@dataclass
class StopRule:
    """The stop rule of one generation call's drafts (see the module docstring)."""

    state: AutoState
    # The model draft of this round (see extend): the tokens per second its tokens must
    # beat, and the chance that every token drafted so far is accepted.
    _rate: float = 0.0
    _reach: float = 1.0
    _extending: str = "model"  # the source (key) of the draft `extend` is asked about
    _gain: float = 1.0  # a lookup draft's expected tokens so far (see _extend_lookup)
    _cost: float = 0.0  # and the seconds of verifying them

    def begin(self, source: str, rate: float) -> None:
        """A draft from `source` (its key in `AutoState.sources`) begins: its tokens
        must beat `rate` tokens per second."""
        self._extending, self._rate = source, rate

    def extend(self, j: int, confidence: float) -> DraftStep:
        """Draw token j if what it adds, the chance it is accepted with all before it,
        pays for verifying one more token at the rate drafting gives (alone, or with
        some further tokens of average acceptance); read the next row if some further
        tokens of average acceptance would pay for their draft steps too.
        `confidence`: the draft model's top probability, or for a lookup draft its
        share of agreeing occurrences (learnt apart: `AutoState.confidence_of`; see
        `_extend_lookup`).

        A model draft's first token is always drawn: drafting was decided on its
        acceptance, which thus stays measured on every round (a round cut before it
        would teach nothing, and its draft step and wake-up are paid already)."""
        if self._extending != "model":
            return self._extend_lookup(j, confidence)
        known, cap = self.state.confidence, self.state.tuning.stop_rule_cap
        accept = known.rate(confidence)
        known.read(accept)
        if cap <= 0:
            return "more"  # no stop rule: the draft runs to the k chosen
        if j == 0:
            self._reach = 1.0
        costs = self.state.costs("model")
        add = self._reach * accept
        verify = costs.target[j + 1] - costs.target[j] + costs.overhead_per_draft
        # On its own or with further tokens: a batch size may cost more than larger ones
        # (measured curves are not smooth, and a learnt T(n) may be a noisy high one that
        # a draft stopping before it never measures again).
        if j > 0 and add < self._rate * verify and not self._pays(j, add, add, verify):
            return "stop"
        self._reach = add
        return "more" if self._pays(j, add) else "last"

    def _pays(self, j: int, run: float, gain: float = 0.0, cost: float = 0.0) -> bool:
        """Whether some number of tokens after token j, each of the mean acceptance of the
        rows read lately (`run`: the chance that every token up to j is accepted), pays
        for its draft steps and verification at the rate drafting gives, on top of `gain`
        expected tokens that cost `cost` seconds."""
        known, cap = self.state.confidence, self.state.tuning.stop_rule_cap
        costs = self.state.costs("model")
        t, step = costs.target, costs.draft + costs.overhead_per_draft
        for n in range(j + 2, min(costs.k_max, cap) + 1):
            run *= known.next_rate
            gain += run
            cost += step + t[n] - t[n - 1]
            if gain >= self._rate * cost:
                return True
        return False

    def _extend_lookup(self, j: int, share: float) -> DraftStep:
        """A lookup's token j costs no draft step, only one more verified token, and
        its chance is known before anything is paid: it is drawn while the tokens it is
        expected to add (with every token before it accepted) raise the round's
        expected tokens per second, E/C, the first token against the target alone
        (where it says no, hybrid drafting asks the draft model instead)."""
        accept = self.state.confidence_of(self._extending).rate(share)
        costs = self.state.costs(self._extending)
        t = costs.target
        if j == 0:
            self._reach, self._gain, self._cost = 1.0, 1.0, t[0] + costs.overhead
        if self.state.tuning.stop_rule_cap <= 0:
            return "more"
        add, more = self._reach * accept, t[j + 1] - t[j] + costs.overhead_per_draft
        if add * self._cost < self._gain * more and not self._raises(j, add, more, accept):
            return "stop"
        self._reach, self._gain, self._cost = add, self._gain + add, self._cost + more
        return "more"

    def _raises(self, j: int, add: float, more: float, accept: float) -> bool:
        """Whether token j with some further tokens of its acceptance raise E/C: a
        measured curve is not smooth, and stopping before a dear batch size stopped
        copies at 3 tokens where 8 paid (#54)."""
        costs = self.state.costs(self._extending)
        t, run = costs.target, add
        gain, cost = self._gain + add, self._cost + more
        for n in range(j + 2, costs.k_max + 1):
            run *= accept
            gain += run
            cost += t[n] - t[n - 1] + costs.overhead_per_draft
            if gain * self._cost > self._gain * cost:
                return True
        return False
