"""The costs as the round loop meets them, learnt from every round."""

from __future__ import annotations

from ..engine.loop.events import RoundVerified
from .calibration import CostCurve
from .costs import RoundCosts
from .tuning import AutoTuning


class LoopCosts:
    """Calibration times each model alone; in the loop they take turns, and both the
    target's verification and the draft step cost more there (the target's decode evicts
    the draft's weights: docs/lab/2026-12-local-generation.md, "A bandwidth-bound
    target"). So: T(n) is the running mean of the loop's decodes of n tokens (the
    calibrated curve, scaled to the loop, until one is seen); the draft step the running
    mean of the steps after a round's first (the calibrated one, scaled alike, until a
    round drafts two); the first step's extra, w_d, the catch-ups' ratio to the
    calibrated ones, and our own time per round and per drafted token running means.
    """

    def __init__(self, curve: CostCurve, draft: CostCurve | None = None,
                 tuning: AutoTuning | None = None) -> None:
        """draft: the draft model's calibrated decodes (last row only): T(1) a step,
        T(n + 1) - T(1) a catch-up on n tokens, as it is until the loop measures one."""
        self.tuning = tuning = tuning or AutoTuning()
        self.curve = curve
        self.draft_curve = draft
        self.scale = 1.0  # loop / calibration, all batch sizes together
        self.verify: dict[int, float] = {}  # n -> running mean of T(n) in the loop
        self._seen: dict[int, int] = {}  # n -> decodes of n tokens learnt from
        # the round that last measured each learnt cost: T(n) by n, the draft model's by name
        self._measured_at: dict[int | str, int] = {}
        self.calibrated_draft_step = draft.t(1) if draft is not None else 0.0
        self.loop_draft_step: float | None = None  # None until a round drafts two tokens
        self.draft_wake = 0.0
        self.catch_up_scale: float | None = None  # catch-ups in the loop / calibrated
        self.overhead = 0.0
        self.overhead_per_draft = 0.0
        self._rounds = 0
        # rounds since one without a draft: the first plain reference comes early
        self.since_plain = tuning.reference_every - 2

    @property
    def draft_step(self) -> float:
        """As measured in the loop; until then calibrated, scaled like the target's
        decodes (the machine's state now)."""
        if self.loop_draft_step is not None:
            return self.loop_draft_step
        return self.calibrated_draft_step * self.scale

    def t(self, n: int) -> float:
        return self.verify.get(n, self.scale * self.curve.t(n))

    def _calibrated_catch_up(self, behind: int) -> float:
        d = self.draft_curve
        return 0.0 if d is None else d.t(behind + 1) - d.t(1)

    def catch_up_s(self, behind: int) -> float:
        """What the draft model's next draft spends catching up on `behind` tokens it
        missed, beyond a round's usual first step (one missed token, after a fully
        accepted round, is part of `draft_wake`): one batch, whose tokens cost less
        each the more there are. As calibrated, scaled as the loop's catch-ups measure
        (until one is: as the target's decodes, the machine's state now)."""
        if behind < 2:
            return 0.0
        scale = self.scale if self.catch_up_scale is None else self.catch_up_scale
        return scale * self._calibrated_catch_up(behind)

    def round_costs(self, model: bool, verify: tuple[float, ...]) -> RoundCosts:
        """verify: T(1..k+1) for every k considered (built once for all sources)."""
        return RoundCosts(
            verify,
            self.draft_step if model else 0.0,
            self.overhead,
            self.overhead_per_draft,
            self.draft_wake if model else 0.0,
        )

    def observe(self, outcome: RoundVerified) -> None:
        tune = self.tuning
        # (a batch shared with other requests costs what all its tokens cost)
        k, n = outcome.k, outcome.forced + outcome.k + 1 + outcome.others
        self._rounds += 1
        # (a round of forced tokens alone is no measure of the target alone)
        self.since_plain = 0 if n == 1 else self.since_plain + 1
        # Quick at first (a calibration taken on a busy machine can be far off), then
        # slow, a round counting as at most `spike` times the running estimate; the
        # spikes of the first rounds (weights still paging in) fade within a few rounds.
        early = self._rounds <= tune.first_rounds
        learn, spike = (tune.learn_first, tune.spike_first) if early else (tune.learn,
                                                                            tune.spike)
        # The first decode of each size is not learnt from (llama.cpp builds a graph of
        # that shape: slower); the next average_first are averaged, then a running mean:
        # one plain reference round corrects a miscalibrated T(1), and auto drafts 4 only
        # now and then, where a running mean alone stayed low a call long.
        count = self._seen[n] = self._seen.get(n, 0) + 1
        if outcome.target_s > 0 and count > 1:
            seen = self.t(n)
            measured = min(max(outcome.target_s, seen / spike), seen * spike)
            self.scale += learn * (measured / self.curve.t(n) - self.scale)
            averaged = max(learn, 1.0 / (count - 1)) if count <= tune.average_first + 1 \
                else learn
            self.verify[n] = seen + averaged * (measured - seen)
            self._measured_at[n] = self._rounds
        self._forget_stale()
        self._observe_draft(outcome, learn, spike)
        if outcome.seconds > 0:
            own = max(0.0, outcome.seconds - outcome.target_s - outcome.draft_s)
            # (the small floor lets an estimate of 0 grow)
            own = min(own, (self.overhead + k * self.overhead_per_draft) * tune.spike + 1e-3)
            if k == 0:
                self.overhead += tune.learn * (own - self.overhead)
            else:
                per_draft = max(0.0, own - self.overhead) / k
                self.overhead_per_draft += tune.learn * (per_draft - self.overhead_per_draft)

    def _forget_stale(self) -> None:
        """A learnt cost no round has measured for as long as the longest gap between
        probes is forgotten: the calibration, scaled to the loop, stands in again, and the
        next measure of it is learnt in full. Only rounds that draft measure T(n > 1) and
        the draft model's costs; one learnt too high (a busy spell) kept drafting off,
        and itself unmeasured, for the life of a server (docs/lab/2026-12-suffix-cache.md)."""
        limit = self.tuning.probe_every_max
        for key in [k for k, at in self._measured_at.items() if self._rounds - at > limit]:
            del self._measured_at[key]
            if key == "draft step":
                self.loop_draft_step = None
            elif key == "wake":
                self.draft_wake = 0.0
            elif key == "catch-up":
                self.catch_up_scale = None
            elif isinstance(key, int):
                del self.verify[key]
                self._seen[key] = 1  # (its graph is built: the next decode is learnt from)

    def _observe_draft(self, outcome: RoundVerified, learn: float, spike: float) -> None:
        """A draft model's decodes: its first row, then one per row after (k - 1, or k
        when it read a row and drew nothing from it)."""
        tune = self.tuning
        rows = outcome.work.rows or outcome.k
        if outcome.source != "model" or rows <= 0 or outcome.work.ahead:
            return  # (a draft drawn ahead cost this round no draft step)
        if rows > 1 and outcome.work.steps_s > 0:
            step, seen = outcome.work.steps_s / (rows - 1), self.draft_step
            if self.loop_draft_step is None:
                self.loop_draft_step = min(step, seen * tune.spike_first)
            else:
                step = min(max(step, seen / spike), seen * spike)
                self.loop_draft_step = seen + learn * (step - seen)
            self._measured_at["draft step"] = self._rounds
        # A round's first draft decode: one step, its wake-up (w_d) and, after rounds
        # without a model draft, a catch-up on what they emitted, learnt apart.
        first = outcome.draft_s - outcome.work.steps_s if outcome.work.steps_s > 0 \
            else outcome.draft_s - (rows - 1) * self.draft_step
        extra = max(0.0, first - self.draft_step)
        behind = outcome.work.caught_up
        if behind < 2:
            wake = min(extra, self.draft_wake * tune.spike + self.draft_step)
            self.draft_wake += tune.learn * (wake - self.draft_wake)
            self._measured_at["wake"] = self._rounds
        elif outcome.work.shadow:
            # Its last rows were read (the shadow): each ran the output head, which the
            # calibrated catch-up, one row kept, does not. Learnt from, it priced an MTP catch-up
            # (a 248k head) far too high for every later call (docs/lab/2026-12-hybrid-mtp.md).
            pass
        elif (calibrated := self._calibrated_catch_up(behind)) > 0:
            scale = max(0.0, extra - self.draft_wake) / calibrated
            if self.catch_up_scale is None:  # at most a draft step a token
                self.catch_up_scale = min(scale, behind * self.draft_step / calibrated)
            else:  # (the small floor lets an estimate of 0 grow)
                scale = min(scale, self.catch_up_scale * tune.spike + 1e-2)
                self.catch_up_scale += learn * (scale - self.catch_up_scale)
            self._measured_at["catch-up"] = self._rounds
