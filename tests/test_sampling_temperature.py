"""Temperatures near 0, without any model: the law stays exact where logits / T would
overflow float32 (issue #52: T = 1e-38 made p NaN, so every draft was accepted)."""

import numpy as np
import pytest

from specllama import SamplingParams
from specllama.engine.sampling import (
    check_proposal,
    confidence,
    first_draft_acceptance,
    probabilities,
    sample_logits_and_p,
    verify,
)

TINY = [1e-5, 1e-10, 1e-30, 1e-38, 1e-45, 5e-324]
FILTERS = [{}, {"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.05}]


def logits_with_gap(n: int, seed: int) -> np.ndarray:
    """Logits of the size real models give, the top one at least 1 above the rest (at
    T <= 1e-5 its weight is then e^-100000 times any other's: exactly one-hot)."""
    z = np.random.default_rng(seed).normal(size=n).astype(np.float32) * 8
    z[seed % n] = z.max() + 1
    return z


def reference(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) in float64, shifted first, with no filter."""
    z = (logits.astype(np.float64) - logits.max()) / temperature
    w = np.exp(z)
    return w / w.sum()


@pytest.mark.parametrize("temperature", TINY)
@pytest.mark.parametrize("filters", FILTERS)
@pytest.mark.parametrize("n", [300, 5000])
def test_tiny_temperatures_give_the_argmax_one_hot(temperature, filters, n):
    logits = logits_with_gap(n, seed=n + 7)
    params = SamplingParams(temperature=temperature, **filters)
    p = probabilities(logits, params)
    # a float64 sum of up to 5,000 entries (one-hot here): off by ~1e-13 at most
    assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0, abs=1e-12)
    expected = np.zeros(n)
    expected[int(np.argmax(logits))] = 1.0
    np.testing.assert_array_equal(p, expected)
    token, p_token = sample_logits_and_p(logits, params, np.random.default_rng(0))
    assert (token, p_token) == (int(np.argmax(logits)), 1.0)
    assert confidence(logits, params) == 1.0


@pytest.mark.parametrize("temperature", TINY)
def test_tied_maxima_share_the_mass_evenly(temperature):
    logits = logits_with_gap(1000, seed=3)
    top = int(np.argmax(logits))
    twin = (top + 500) % 1000
    logits[twin] = logits[top]
    p = probabilities(logits, SamplingParams(temperature=temperature))
    assert p[top] == p[twin] == 0.5 and p.sum() == 1.0
    # and the draws split them: 2,000 draws, 0.5 each; 5 sigma is +-112
    rng = np.random.default_rng(1)
    draws = [sample_logits_and_p(logits, SamplingParams(temperature=temperature), rng)
             for _ in range(2000)]
    assert {t for t, _ in draws} == {top, twin}
    assert all(pt == pytest.approx(0.5) for _, pt in draws)  # 1 / 2 of two equal weights
    assert abs(sum(t == top for t, _ in draws) - 1000) < 112


@pytest.mark.parametrize("temperature, logits", [
    # gaps of a few float32 ulps of 0 (subnormals), at temperatures of their size
    (1e-45, [0.0, 1e-45, 3e-45, -2e-45]),
    (1e-44, [0.0, 1e-45, 3e-45, -2e-45]),
    # gaps around 1e-38, near float32's smallest normal number
    (1e-38, [0.0, 1e-38, 2e-38, -3e-38]),
    (3e-39, [1e-38, 0.0, 5e-39, 2e-38]),
])
def test_the_law_is_softmax_of_the_gaps_over_t_at_every_scale(temperature, logits):
    """Where the gaps are as small as T, p is neither one-hot nor uniform: it must be
    softmax((l - max) / T), computed without overflow or underflow of 1/T."""
    z = np.array(logits, dtype=np.float32)
    expected = reference(z, temperature)
    assert 0.01 < expected.max() < 0.99  # the case is a real distribution
    p = probabilities(z, SamplingParams(temperature=temperature))
    # z / T rounded to float32 (6e-8 of its few units): p off by ~3e-7 relative
    np.testing.assert_allclose(p, expected, rtol=1e-5, atol=1e-9)
    # and the fast path draws from the same law (20,000 draws, 5 sigma per token)
    rng = np.random.default_rng(5)
    counts = np.bincount([sample_logits_and_p(z, SamplingParams(temperature=temperature),
                                              rng)[0] for _ in range(20000)], minlength=len(z))
    sigma = np.sqrt(20000 * expected * (1 - expected))
    assert np.all(np.abs(counts - 20000 * expected) <= 5 * sigma + 1), (counts, expected)


@pytest.mark.parametrize("temperature", TINY)
def test_verify_rejects_a_draft_that_is_not_the_argmax(temperature):
    """p and q of tiny temperatures are one-hot: a lookup (q = None) or a draft model's
    token other than the target's argmax is always rejected and corrected to the argmax;
    the argmax itself is always accepted."""
    params = SamplingParams(temperature=temperature)
    target = [logits_with_gap(400, seed=s) for s in (10, 11, 12)]
    draft = logits_with_gap(400, seed=20)
    best = [int(np.argmax(z)) for z in target]
    wrong = (best[0] + 1) % 400
    q = probabilities(draft, params)
    assert int(np.argmax(draft)) != best[0] and q.max() == 1.0

    def rows(i: int) -> np.ndarray:
        return probabilities(target[i], params)

    for seed in range(50):
        rng = np.random.default_rng(seed)
        assert verify(rows, [wrong], [None], rng) == (0, best[0], 1.0)
        assert verify(rows, [int(np.argmax(draft))], [q], rng) == (0, best[0], 1.0)
        assert verify(rows, [best[0], best[1]], [None, None], rng) == (2, best[2], 1.0)
        assert check_proposal(rows(0), wrong, rng) == best[0]
    assert first_draft_acceptance(draft, best[0], 1.0, params) == 0.0
    assert first_draft_acceptance(target[0], best[0], 1.0, params) == 1.0
