"""Drafting ahead or in turn (policy/split.py): the choice on measured curves, and the
measurement itself on tiny models."""

import pytest

from specllama import SpeculativeDecoder
from specllama.policy.costs import RoundCosts
from specllama.policy.split import Concurrent, ahead_round_s, candidates, choose, measure

SIZES = (1, 2, 3, 4, 5, 6, 8)


def in_turn(t1, ratios, step):
    """Costs taking turns: T(n) = t1 * ratios[n - 1] for n = 1..8, a draft step."""
    return RoundCosts(tuple(t1 * r for r in ratios), step)


def ahead(threads, draft_threads, t1, ratios, step):
    return Concurrent(threads, draft_threads, SIZES,
                      tuple(t1 * ratios[n - 1] for n in SIZES), step)


# A Llama 3.1 8B-shaped Q4_0 target on 16 threads (Intel Xeon, llama-bench; bound by
# memory bandwidth: as fast on 8 threads as on 16), a 0.5B-shaped draft step of 9.2 ms.
Q4_0_8B = [1, 1.49, 1.51, 1.53, 1.58, 1.62, 1.64, 1.66]
# The F32 stand-in on this kind of 2-core VM (AMD EPYC): 1 thread runs at 0.65x of 2.
F32_2_CORES = [1, 1.27, 1.4, 1.48, 1.6, 1.75, 1.85, 1.97]


def test_two_cores_draft_in_turn_at_any_acceptance():
    serial = in_turn(33e-3, F32_2_CORES, 12e-3)
    split = ahead(2, 1, 33e-3 / 0.65, F32_2_CORES, 12e-3 / 0.65)
    for alpha in (0.5, 0.7, 0.8, 0.9, 0.95):
        chosen = choose(serial, [split], alpha)
        assert chosen.draft_threads == 0
        assert chosen.ahead < chosen.in_turn or alpha > 0.9  # (0.95: 1.03x, under the margin)
        assert "drafting in turn" in chosen.describe()


def test_a_bandwidth_bound_target_drafts_ahead_where_acceptance_is_high():
    serial = in_turn(77.6e-3, Q4_0_8B, 9.2e-3)
    # the target on 12 threads as fast as on 16; the draft on 4 at twice its step
    split = ahead(16, 4, 77.6e-3, Q4_0_8B, 18.4e-3)
    assert choose(serial, [split], 0.9).draft_threads == 4
    assert choose(serial, [split], 0.5).draft_threads == 0  # hiding little, not worth it
    # a target slowed by the cores it gives up does not pay at 0.8
    slower = ahead(16, 4, 77.6e-3 * 1.1, Q4_0_8B, 18.4e-3)
    assert choose(serial, [slower], 0.8).draft_threads == 0


def test_a_round_drawn_ahead_costs_its_verification_and_drafting_only_when_missed():
    serial = in_turn(0.1, [1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8], 0.01)
    c = ahead(8, 2, 0.1, [1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8], 0.01)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    # k = 2 at acceptance 1: every round finds its draft drawn (3 steps fit in T(3)); the
    # verdict waits for half the draft step in flight
    assert ahead_round_s(c, 2, 1.0, serial) == pytest.approx(0.13 + 0.005)
    # at acceptance 0, every draft is drawn in turn, on every thread
    assert ahead_round_s(c, 2, 0.0, serial) == pytest.approx(0.13 + 0.005 + 2 * 0.01)
    # a draft too slow to keep up is reused only as far as it got
    slow = ahead(8, 2, 0.1, [1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8], 0.13 / 1.5)
    assert ahead_round_s(slow, 2, 1.0, serial) == pytest.approx(
        0.13 + 0.13 / 3 + 0.5 * 2 * 0.01)
    # a draft that draws all it may (16 tokens) before the verdict is not waited for
    quick = ahead(8, 2, 0.1, [1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8], 0.005)
    assert ahead_round_s(quick, 2, 1.0, serial) == pytest.approx(0.13)


def test_candidates_leave_the_target_most_threads():
    assert candidates(2) == [1] and candidates(4) == [1]
    assert candidates(16) == [2, 4] and candidates(8) == [1, 2]
    assert candidates(1) == []


def test_measuring_both_at_once_leaves_the_models_as_they_were(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=2)
    try:
        prompt = dec.tokenize("the cat sat")
        dec.target.decode(prompt, "none")
        c = measure(dec.target, dec.draft, 2, 1, reps=2)
        assert c.draft_threads == 1 and len(c.target) == len(SIZES)
        assert all(t > 0 for t in c.target) and c.draft > 0
        assert dec.target.cached == prompt and dec.draft.cached == []
        assert dec.target.n_threads == 2 and dec.draft.n_threads == 2
    finally:
        dec.close()
