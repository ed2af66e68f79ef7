"""The numerics, without any model: processing, sampling, acceptance, residual."""

import numpy as np
import pytest

from specllama import InvalidParameterError, SamplingParams
from specllama.engine.sampling import (
    Verdict,
    acceptance_probability,
    check_proposal,
    confidence,
    first_draft_acceptance,
    on_target_vocab,
    probabilities,
    residual,
    sample,
    sample_logits_and_p,
    verify,
    verify_greedy,
)


def sample_logits(logits, params, rng):
    return sample_logits_and_p(logits, params, rng)[0]


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def one_round_distribution(p, q):
    """Exact distribution of the token emitted at a position where d ~ q is proposed."""
    accept = np.array([acceptance_probability(p, q, d) for d in range(len(p))])
    out = q * accept
    rejected_mass = float(np.sum(q * (1 - accept)))
    if rejected_mass > 0:
        # Residual depends on the rejected token only through p and q, not the token.
        out = out + rejected_mass * residual(p, q, int(np.argmax(q)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_accept_then_residual_reproduces_p_exactly(seed):
    rng = np.random.default_rng(seed)
    p = softmax(rng.normal(size=12) * 2)
    q = softmax(rng.normal(size=12) * 2)
    # float64 sums of 12 probabilities: off by ~1e-16, far below 1e-12
    np.testing.assert_allclose(one_round_distribution(p, q), p, atol=1e-12)


def test_accept_then_residual_with_disjoint_supports():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.3, 0.7])
    # float64 sums of 4 probabilities: off by ~1e-16, far below 1e-12
    np.testing.assert_allclose(one_round_distribution(p, q), p, atol=1e-12)


def test_deterministic_draft_q_none_reproduces_p():
    p = np.array([0.1, 0.6, 0.3])
    for d in range(3):
        accept = acceptance_probability(p, None, d)
        out = np.zeros(3)
        out[d] += accept
        out += (1 - accept) * residual(p, None, d)
        # float64 sums of 3 terms: off by ~1e-16, far below 1e-12
        np.testing.assert_allclose(out, p, atol=1e-12)


@pytest.mark.parametrize("proposed", [0, 2, 4])
def test_a_checked_proposal_follows_p_whatever_was_proposed(proposed):
    """A draft model checking a lookup's guess keeps its own law: seeded draws of
    check_proposal against the exact p, for a likely, an unlikely and an impossible guess."""
    p = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
    rng = np.random.default_rng(proposed)
    n = 40_000
    counts = np.bincount([check_proposal(p, proposed, rng) for _ in range(n)], minlength=5)
    assert counts[4] == 0
    expected = p * n
    chi2 = float(((counts[:4] - expected[:4]) ** 2 / expected[:4]).sum())
    assert chi2 < 16.3, (counts, expected)  # 3 degrees of freedom, p > 0.001
    # and the test would see a rule that keeps the guess: all mass on it
    kept = np.zeros(5)
    kept[proposed] = n
    assert float(((kept[:4] - expected[:4]) ** 2 / expected[:4]).sum()) > 16.3


def test_accept_always_would_give_q_not_p():
    """The statistical tests' wrong rule, analytically: it returns q."""
    p = np.array([0.7, 0.2, 0.1])
    q = np.array([0.2, 0.2, 0.6])
    assert not np.allclose(q, p)


def test_verify_empirical_matches_p_two_positions():
    rng = np.random.default_rng(0)
    p1, p2, p3 = softmax(np.array([1.0, 0.2, -0.5])), softmax(np.array([0.0, 1.0, 0.3])), None
    q1 = softmax(np.array([0.0, 1.0, 0.0]))
    n = 40000
    counts = np.zeros(3)
    for _ in range(n):
        d1 = sample(q1, rng)
        m, x, _ = verify(lambda i: [p1, p2, p3][i], [d1], [q1], rng)
        counts[d1 if m == 1 else x] += 1
    # chi-square against p1 (2 dof); 0.001 critical value 13.8
    chi2 = np.sum((counts - n * p1) ** 2 / (n * p1))
    assert chi2 < 13.8


def uneven_one_round_distribution(p, q):
    """Exact law of the emitted token when d ~ q over the draft's vocabulary, which may be
    longer or shorter than the target's (p)."""
    out = np.zeros(len(p))
    for d in np.flatnonzero(q):
        a = acceptance_probability(p, q, int(d))
        if d < len(p):
            out[d] += q[d] * a
        out += q[d] * (1 - a) * residual(p, q, int(d))
    return out


@pytest.mark.parametrize("n_draft", [8, 12, 15, 19])
@pytest.mark.parametrize("seed", range(5))
def test_uneven_vocabularies_reproduce_p_exactly(seed, n_draft):
    """Target 12 ids; drafts with 4 or 1 fewer (ids they lack have q = 0) or 3 or 7 more
    (ids the target lacks have p = 0, always rejected, never out of range)."""
    rng = np.random.default_rng(seed)
    p = softmax(rng.normal(size=12) * 2)
    q = softmax(rng.normal(size=n_draft) * 2)
    # float64 sums of 12 probabilities: off by ~1e-16, far below 1e-12
    np.testing.assert_allclose(uneven_one_round_distribution(p, q), p, atol=1e-12)


def test_on_target_vocab_pads_with_zero_and_cuts_without_renormalising():
    q = np.array([0.5, 0.3, 0.2])
    np.testing.assert_array_equal(on_target_vocab(q, 5), [0.5, 0.3, 0.2, 0.0, 0.0])
    np.testing.assert_array_equal(on_target_vocab(q, 2), [0.5, 0.3])
    assert on_target_vocab(q, 3) is q
    p = np.array([0.6, 0.4])
    assert acceptance_probability(p, q, 2) == 0.0  # an id the target lacks
    assert acceptance_probability(p, None, 7) == 0.0
    np.testing.assert_allclose(residual(p, None, 7), p)  # p / p.sum(): within 1e-7 rtol


def test_verify_with_a_longer_draft_vocabulary_matches_p():
    rng = np.random.default_rng(1)
    p1 = softmax(np.array([1.0, 0.2, -0.5]))
    q1 = softmax(np.array([0.0, 1.0, 0.0, 0.8, 0.5]))  # two ids the target lacks
    n = 40000
    counts = np.zeros(3)
    for _ in range(n):
        d1 = sample(q1, rng)
        m, x, _ = verify(lambda i: p1, [d1], [q1], rng)  # row 1 (the bonus) is unused
        counts[d1 if m == 1 else x] += 1
    chi2 = np.sum((counts - n * p1) ** 2 / (n * p1))
    assert chi2 < 13.8


def test_verify_bonus_when_all_accepted():
    p = np.eye(4)
    rng = np.random.default_rng(0)
    assert verify(lambda i: p[i], [0, 1, 2], [None, None, None], rng) == Verdict(3, 3, 1.0)


def test_verify_returns_p_of_the_token_it_drew():
    """Corrections, bonus tokens and plain steps come back with p at their row (the
    shadow acceptance reads it), from the residual's row or from `draw`."""
    p = np.array([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    rng = np.random.default_rng(4)
    for _ in range(50):
        m, x, p_x = verify(lambda i: p[i], [0], [np.array([1.0, 0.0, 0.0])], rng)
        assert m in (0, 1) and p_x == p[m][x]
    drawn = verify(lambda i: p[i], [], [], rng, draw=lambda i, r: (2, 0.25))
    assert drawn == Verdict(0, 2, 0.25)


def test_verify_greedy():
    rows = [5, 7, 9, 11]
    assert verify_greedy(lambda i: rows[i], [5, 7, 9]) == Verdict(3, 11, 1.0)
    assert verify_greedy(lambda i: rows[i], [5, 8, 9]) == Verdict(1, 7, 1.0)
    assert verify_greedy(lambda i: rows[i], []) == Verdict(0, 5, 1.0)


def test_probabilities_temperature():
    z = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    expected = softmax(z.astype(np.float64) / 0.5)
    actual = probabilities(z, SamplingParams(temperature=0.5))
    # z / T in float32 (6e-8 of its few units), the rest float64: ~4e-7 relative in p
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_probabilities_greedy_is_one_hot_on_first_max():
    z = np.array([0.0, 3.0, 3.0, 1.0])
    np.testing.assert_array_equal(probabilities(z, SamplingParams(temperature=0)), [0, 1, 0, 0])


def test_probabilities_top_k():
    z = np.array([0.0, 3.0, 2.0, 1.0])
    p = probabilities(z, SamplingParams(temperature=1.0, top_k=2))
    expected = np.zeros(4)
    expected[[1, 2]] = softmax(np.array([3.0, 2.0]))
    # logits in float32 (6e-8 of a few units), the rest float64: ~4e-7 relative in p
    np.testing.assert_allclose(p, expected, rtol=1e-6)


def test_probabilities_top_p_keeps_smallest_set_reaching_mass():
    base = np.array([0.5, 0.3, 0.15, 0.05])
    z = np.log(base)
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=0.8))
    # log(p) in float32 (6e-8 of |z| < 3), the rest float64: ~2e-7 relative in p
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], rtol=1e-6)
    p = probabilities(z, SamplingParams(temperature=1.0, top_p=0.81))
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95, rtol=1e-6)


def test_top_p_partial_sort_equals_full_sort_on_a_big_vocabulary():
    rng = np.random.default_rng(3)
    z = rng.normal(size=50000) * 3
    for top_p in (0.1, 0.5, 0.9, 0.99, 0.999999):
        fast = probabilities(z, SamplingParams(temperature=1.0, top_p=top_p))
        full = softmax(z.astype(np.float32).astype(np.float64))
        order = np.argsort(-full)
        n = int(np.searchsorted(np.cumsum(full[order]), top_p)) + 1
        ref = np.zeros_like(full)
        ref[order[:n]] = full[order[:n]]
        ref /= ref.sum()
        # float32 z (|z| to ~15: 1e-6 relative in p) then float64 sums of 50k terms (~1e-12)
        np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-12)


def test_probabilities_min_p():
    base = np.array([0.5, 0.3, 0.15, 0.05])
    p = probabilities(np.log(base), SamplingParams(temperature=1.0, min_p=0.25))
    # log(p) in float32 (6e-8 of |z| < 3), the rest float64: ~2e-7 relative in p
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95, rtol=1e-6)


def test_sample_empirical():
    rng = np.random.default_rng(1)
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4) / 20000
    # 20,000 draws: a binomial sd of 0.0035 at most (p = 0.6), so 0.015 is 4.3 sd
    np.testing.assert_allclose(draws, probs, atol=0.015)
    assert draws[1] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be a number >= 0, got -0.1"),
        ({"top_k": -1}, "top_k must be an integer >= 0 (0 = off), got -1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"min_p": 2.0}, "min_p must be in [0, 1], got 2.0"),
        ({"seed": -3}, "seed must be an integer >= 0, got -3"),
    ],
)
def test_out_of_range_settings_are_rejected(kwargs, message):
    with pytest.raises(InvalidParameterError) as err:
        SamplingParams(**kwargs)
    assert str(err.value) == message


def test_sample_on_a_large_vocabulary_follows_the_distribution():
    """The two-level draw used for real vocabularies is the same inverse CDF."""
    rng = np.random.default_rng(7)
    probs = np.zeros(50_001)
    support = rng.choice(50_001, size=12, replace=False)
    probs[support] = rng.dirichlet(np.ones(12))
    n = 30_000
    draws = np.bincount([sample(probs, rng) for _ in range(n)], minlength=probs.shape[0])
    assert set(np.flatnonzero(draws)) <= set(support)
    chi2 = np.sum((draws[support] - n * probs[support]) ** 2 / (n * probs[support]))
    assert chi2 < 32.9  # 11 degrees of freedom, p = 0.0005


def test_sample_never_returns_a_zero_probability_token_at_the_edges():
    rng = np.random.default_rng(0)
    probs = np.zeros(1024)
    probs[[0, 1023]] = 0.5
    assert {sample(probs, rng) for _ in range(200)} == {0, 1023}
    probs = np.zeros(3000)
    probs[256] = 1.0  # the only mass at the first index of a block
    assert {sample(probs, rng) for _ in range(50)} == {256}


def realistic_logits(rng, n=50_001):
    """An LM-like row: a few strong candidates over a broad low background; n is not a
    multiple of the block size, so the last, partial block is exercised too."""
    logits = rng.normal(0.0, 2.0, n).astype(np.float32)
    logits[rng.choice(n, 8, replace=False)] += rng.uniform(8, 14, 8).astype(np.float32)
    logits[-3] += 12.0  # a strong candidate in the partial block at the end
    return logits


def test_sample_logits_is_the_same_draw_as_sampling_the_probabilities():
    params = SamplingParams(temperature=0.8)
    logits = realistic_logits(np.random.default_rng(3))
    p = probabilities(logits, params)
    same = sum(
        sample_logits(logits, params, np.random.default_rng(seed))
        == sample(p, np.random.default_rng(seed))
        for seed in range(2000)
    )
    assert same >= 1995  # only a draw landing within float rounding of a CDF step may differ


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_sample_logits_follows_the_exact_distribution(temperature):
    params = SamplingParams(temperature=temperature)
    rng = np.random.default_rng(11)
    logits = realistic_logits(rng)
    z = logits.astype(np.float64) / temperature
    p = softmax(z)
    n = 10_000
    draws = np.bincount([sample_logits(logits, params, rng) for _ in range(n)],
                        minlength=logits.shape[0])
    # chi-square over the tokens with an expected count >= 5, the rest pooled
    big = n * p >= 5
    observed = np.append(draws[big], draws[~big].sum())
    expected = np.append(n * p[big], n * p[~big].sum())
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    dof = observed.shape[0] - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof)  # about p = 1e-5 for these dof
    assert draws[-3] > 0  # the partial block at the end is reachable


def test_sample_logits_with_filters_and_greedy():
    rng = np.random.default_rng(0)
    logits = realistic_logits(rng)
    assert sample_logits(logits, SamplingParams(temperature=0.0), rng) == int(np.argmax(logits))
    top2 = set(np.argsort(-logits)[:2].tolist())
    params = SamplingParams(temperature=1.0, top_k=2)
    assert {sample_logits(logits, params, rng) for _ in range(200)} <= top2


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.9, min_p=0.02),
    SamplingParams(temperature=0.0),
])
def test_sample_logits_and_p_gives_the_drawn_tokens_probability(params):
    """p(token) for the shadow acceptance: what `probabilities` gives that token, from
    the same draw as `sample_logits`."""
    logits = realistic_logits(np.random.default_rng(5))
    p = probabilities(logits, params)
    for seed in range(50):
        token, p_token = sample_logits_and_p(logits, params, np.random.default_rng(seed))
        assert token == sample_logits(logits, params, np.random.default_rng(seed))
        # from float32 weights and their float64 sum vs float64 probabilities: ~1e-7 relative
        assert p_token == pytest.approx(p[token], rel=1e-5)


def test_sample_takes_unnormalised_float32_weights():
    rng = np.random.default_rng(2)
    w = np.zeros(5000, dtype=np.float32)
    w[[3, 4999, 2048]] = [2.0, 1.0, 1.0]  # the last index sits in the partial block
    n = 8000
    draws = np.bincount([sample(w, rng) for _ in range(n)], minlength=5000)
    assert set(np.flatnonzero(draws)) == {3, 2048, 4999}
    # 8,000 draws: binomial sds 0.0056 (p = 0.5) and 0.0048 (0.25): 0.02 is 3.6 sd or more
    np.testing.assert_allclose(draws[[3, 2048, 4999]] / n, [0.5, 0.25, 0.25], atol=0.02)


@pytest.mark.parametrize("seed", range(6))
def test_first_draft_acceptance_estimates_the_acceptance_rate_without_drafting(seed):
    """Over tokens the target draws alone (x ~ p), the mean estimate is the acceptance
    probability of a first draft token, sum min(p, q); q(x) alone, a plausible wrong
    estimator, is rejected by the same test."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.8)
    target_logits = rng.normal(size=12).astype(np.float32) * 2
    draft_logits = (target_logits + rng.normal(size=12).astype(np.float32)).astype(np.float32)
    p, q = probabilities(target_logits, params), probabilities(draft_logits, params)
    exact = float(np.minimum(p, q).sum())
    xs = rng.choice(len(p), size=40_000, p=p)
    est = np.array([first_draft_acceptance(draft_logits, int(x), float(p[x]), params)
                    for x in xs])
    se = est.std() / np.sqrt(len(est))
    assert abs(est.mean() - exact) < 4 * se + 1e-9  # 4 sd; 1e-9: float64 sums of 40k
    wrong = q[xs]
    assert abs(wrong.mean() - exact) > 4 * wrong.std() / np.sqrt(len(wrong))


def test_first_draft_acceptance_greedy_and_edges():
    logits = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    greedy = SamplingParams(temperature=0.0)
    assert first_draft_acceptance(logits, 1, 1.0, greedy) == 1.0
    assert first_draft_acceptance(logits, 2, 1.0, greedy) == 0.0
    sampled = SamplingParams(temperature=1.0)
    assert first_draft_acceptance(logits, 7, 0.5, sampled) == 0.0  # an id the draft lacks
    q1 = float(probabilities(logits, sampled)[1])
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert first_draft_acceptance(logits, 1, 0.99, sampled) == pytest.approx(q1 / 0.99)
    assert first_draft_acceptance(logits, 1, q1 / 2, sampled) == 1.0
    # where the draft's top token is below p_min it would not have drafted: no evidence
    flat = np.zeros(8, dtype=np.float32)  # q = 1/8 everywhere
    assert first_draft_acceptance(flat, 1, 0.5, sampled, p_min=0.2) is None
    assert first_draft_acceptance(flat, 1, 0.5, sampled, p_min=0.1) == pytest.approx(0.25)
    assert first_draft_acceptance(flat, 1, 1.0, greedy, p_min=0.9) == 0.0  # greedy: never cut


def test_confidence_is_the_drafts_top_probability_greedy_or_sampled():
    """Sampled: the top of the processed q. Greedy (q one-hot): the top of the raw
    softmax, the draft model's own certainty. The logits are left as they were."""
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float32)
    kept = logits.copy()
    greedy = SamplingParams(temperature=0.0)
    # pytest.approx's 1e-6 relative: float32 exp against float64 softmax, ~1e-7
    assert confidence(logits, greedy) == pytest.approx(softmax(logits.astype(float)).max())
    np.testing.assert_array_equal(logits, kept)
    sampled = SamplingParams(temperature=0.5, top_k=2)
    q = probabilities(logits, sampled)
    assert confidence(logits, sampled) == pytest.approx(q.max())  # the same q: exact
    assert confidence(logits, sampled, q) == pytest.approx(q.max())
    assert confidence(logits, sampled) > confidence(logits, SamplingParams(temperature=1.0))
