"""bench/laptop.py without models: the measured curves filled in between measured batch
sizes and thread counts, a round's cost when the draft model draws ahead, and auto near
the best fixed draft length on two laptop workloads.

`pytest.approx` at its default (relative 1e-6) compares float64 arithmetic done two ways
(a formula against the code's), whose rounding is ~1e-15: far inside it."""

import pytest

from bench import laptop
from harness.simulated import Machine, fixed_speedups, simulate, texts_for
from specllama.policy import FixedDraftLength


def test_a_curve_is_linear_between_measured_batch_sizes_and_keeps_what_was_measured():
    t = laptop.interpolate({1: 10.0, 2: 15.0, 3: 14.0, 4: 18.0, 8: 26.0, 16: 42.0})
    assert len(t) == 16
    assert t[:4] == pytest.approx((10, 15, 14, 18))  # T(3) < T(2) stays: it was measured
    assert t[4:8] == pytest.approx((20, 22, 24, 26))  # T(5..7) between T(4) and T(8)
    assert t[8:] == pytest.approx(tuple(26 + 2 * i for i in range(1, 9)))


def test_between_two_thread_counts_time_is_linear_in_one_over_threads():
    # 12 threads sit a third of the way from 16 to 8 in 1 / threads
    assert laptop.between_threads([30.0, 60.0], [12.0, 24.0], 8, 16, 12) == \
        pytest.approx((18.0, 36.0))
    assert laptop.between_threads([30.0], [12.0], 8, 16, 8) == pytest.approx((30.0,))
    assert laptop.between_threads([30.0], [12.0], 8, 16, 16) == pytest.approx((12.0,))
    eight, sixteen = laptop.curve("llama8b-q4_k_m", 8), laptop.curve("llama8b-q4_k_m", 16)
    assert sixteen[:4] == pytest.approx((84.52, 121.98, 116.7, 122.1))  # as measured
    assert laptop.curve("llama8b-q4_k_m", 14)[0] == pytest.approx(
        84.52 + (135.95 - 84.52) * (1 / 14 - 1 / 16) * 16)
    assert all(lo <= x <= hi for x, lo, hi in zip(laptop.curve("llama8b-q4_k_m", 12),
                                                 sixteen, eight, strict=True))


def test_draft_steps_on_fewer_threads_are_the_eight_thread_step_scaled():
    assert laptop.draft_step("llama1b-q4_k_m", 16) == pytest.approx((16.25, 22.04 - 16.25))
    assert laptop.draft_step("qwen05-q8_0", 16) == pytest.approx((9.18, 13.27 - 9.18))
    step4, _ = laptop.draft_step("qwen05-q8_0", 4)
    assert step4 == pytest.approx(9.18 * 41.36 / 22.82)  # the 1B draft's 4/8-thread ratio
    m = laptop.parallel_machine("llama8b-q4_0", "qwen05-q8_0", 4)
    assert m.ahead_step_ms == pytest.approx(9.18 * 8 / 4)
    assert m.loop_ms == laptop.curve("llama8b-q4_0", 12)
    assert m.alone_ms == pytest.approx(77.6)  # the target alone on all 16 threads


def test_the_tokens_drawn_ahead_are_the_steps_that_fit_in_the_verification_after_the_first():
    m = Machine(ahead_step_ms=40.0)
    assert m.drawn_ahead(0.130) == (2, 0.0)  # 3 steps fit: the guess of the target's, then 2
    assert m.drawn_ahead(0.030) == (0, 0.0)
    waiting = Machine(ahead_step_ms=40.0, ahead_wait=True)  # the step in flight finishes
    assert waiting.drawn_ahead(0.130) == pytest.approx((3, 0.030))
    assert Machine(ahead_step_ms=1.0).drawn_ahead(0.130) == (15, 0.0)  # AHEAD_MAX in all


class Recorded:
    """A fixed draft length, and the rounds it was shown."""

    def __init__(self, k: int) -> None:
        self.policy, self.rounds = FixedDraftLength(k), []

    def choose(self, source="model"):
        return self.policy.choose(source)

    def extend(self, j, confidence):
        return self.policy.extend(j, confidence)

    def observe(self, outcome):
        self.rounds.append(outcome)


def test_a_round_drafted_ahead_costs_no_draft_step_and_only_follows_a_full_acceptance():
    fast = Machine(loop_ms=(100.0,) * 16, step_ms=10.0, ahead_step_ms=5.0)
    text = [(True, 0.9)] * 3 + [(False, 0.9)] + [(True, 0.9)] * 12
    p = Recorded(3)
    simulate(p, text, fast)
    first, second, third = p.rounds[:3]
    assert first.k == 3 and first.accepted == 3 and first.work.ahead == 0
    assert first.draft_s > 0  # drawn in turn: steps, a wake-up
    # the target's own token at position 3 was not the draft's guess there: dropped
    assert second.work.ahead == 0 and second.draft_s > 0
    assert third.work.ahead == 3 and third.draft_s == 0.0 and third.work.rows == 0
    assert third.seconds == pytest.approx(third.target_s + (0.4 + 0.5 * 3) * 1e-3)
    slow = Machine(loop_ms=(100.0,) * 16, step_ms=10.0, ahead_step_ms=60.0)
    p = Recorded(3)
    simulate(p, [(True, 0.9)] * 16, slow)  # one step fits: nothing beyond the guess
    assert all(r.work.ahead == 0 and r.draft_s > 0 for r in p.rounds)


@pytest.mark.parametrize("machine", [
    laptop.serial_machine("llama8b-q4_k_m", 16, "qwen05-q8_0"),
    laptop.parallel_machine("llama8b-q4_k_m", "llama1b-q4_k_m", 2),
], ids=["in turn", "ahead"])
def test_auto_comes_within_5_percent_of_the_best_fixed_draft_length_on_laptop_costs(machine):
    texts = texts_for(0.8, True, count=8)
    auto, _ = laptop.auto_run(texts, machine)
    fixed = fixed_speedups(texts, laptop.FIXED, machine=machine)
    assert auto >= laptop.NEAR * max(fixed.values()), (auto, fixed)
