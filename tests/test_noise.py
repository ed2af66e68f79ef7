"""The float-noise helper the comparisons of two decodes use (tests/noise.py): it measures
what this CPU does, and its checks refuse what a bug does."""

from __future__ import annotations

import numpy as np
import pytest
from noise import BREAK, FLOOR, MARGIN, TIMES, apart, assert_a_tie, rounds, split_noise, tolerance

from specllama.engine.llama import Model

TEXT = "the cat sat on the mat and the dog ran to the big red house on the hill by the sea "


@pytest.fixture
def model(tiny_target):
    m = Model(tiny_target, n_ctx=256, n_threads=1)
    yield m
    m.close()


def test_the_noise_of_a_split_is_float_noise_and_leaves_the_model_cleared(model):
    t = model.tokenize(TEXT)
    noise = split_noise(model, t[:21], 10)  # measured 2.4e-4 on an AMD EPYC
    assert 0 <= noise and MARGIN * tolerance(noise) <= BREAK
    assert model.cached == []


def test_a_tolerance_is_ten_times_the_noise_and_refuses_one_near_the_bug():
    assert tolerance(0.0) == TIMES * FLOOR  # a bit-exact split still allows the floor
    assert tolerance(0.002) == pytest.approx(0.02)  # rel 1e-6 of pytest: one product
    with pytest.raises(AssertionError, match="too close to the bug"):
        tolerance(BREAK / 20)


def test_rows_apart_compare_finite_entries_and_tell_where_inf_moved():
    a = np.array([1.0, -np.inf, 3.0])
    assert apart(a, np.array([1.5, -np.inf, 3.0])) == 0.5
    assert apart(a, np.array([1.0, 2.0, 3.0])) == np.inf


def test_rounds_cut_after_the_kept_tokens():
    assert rounds(5, 12, 3) == [5, 8, 11]
    assert rounds(0, 4, 1) == [0, 1, 2, 3]  # (a cut at 0 decodes nothing)


def test_the_tie_check_passes_a_tie_and_rejects_a_clear_winner(model, monkeypatch):
    t = model.tokenize(TEXT)
    with pytest.raises(AssertionError, match="two best logits are"):
        assert_a_tie(model, t[:8], t[8:12], "a clear winner")  # its gap: 0.18
    monkeypatch.setattr(model, "logits_row", lambda i: np.array([2.0, 2.0 + 1e-6, -1.0]))
    assert_a_tie(model, t[:8], t[8:12], "a tie")
