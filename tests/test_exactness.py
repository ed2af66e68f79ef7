"""Statistical proof that speculative sampling keeps the target's distribution.

For a fixed prompt, the exact joint distribution of the first two generated tokens
is computed from the target's own logits; thousands of seeded speculative runs
must match it (chi-square), and the same test must reject a deliberately wrong
acceptance rule, which shows it has the power to catch a bug.
"""

import math

import numpy as np
import pytest

import specllama.engine.sampling as sampling_module
from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities

RUNS = 3000
PROMPT_TEXT = "the cat sat on the"


def chi2_pvalue(chi2: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson–Hilferty approximation)."""
    if dof <= 0:
        return 1.0
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def exact_first_two(model: Model, prompt: list[int], params: SamplingParams) -> dict:
    """P(x1, x2) for the target alone, from its logits."""
    model.clear()
    model.decode(prompt, "last")
    p1 = probabilities(model.logits_row(-1), params)
    joint = {}
    for x1 in np.flatnonzero(p1 > 1e-7):
        x1 = int(x1)
        if model.is_eog(x1):
            joint[(x1, None)] = p1[x1]
            continue
        model.truncate(len(prompt))
        model.decode([x1], "last")
        p2 = probabilities(model.logits_row(-1), params)
        for x2 in np.flatnonzero(p2 > 1e-9):
            joint[(x1, int(x2))] = p1[x1] * p2[x2]
    model.clear()
    return joint


def empirical_first_two(dec, prompt, params: SamplingParams, draft_max: int) -> dict:
    counts: dict = {}
    for seed in range(RUNS):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        toks = dec.generate(prompt, max_tokens=2, sampling=s, draft_max=draft_max).tokens
        key = (toks[0], toks[1] if len(toks) > 1 else None)
        counts[key] = counts.get(key, 0) + 1
    return counts


def goodness_of_fit(counts: dict, exact: dict) -> float:
    """Chi-square p-value; cells with expected count < 5 are pooled into one."""
    n = sum(counts.values())
    unseen = set(counts) - set(exact)
    assert not unseen, f"sampled pairs with zero target probability: {sorted(unseen)[:5]}"
    chi2, dof = 0.0, -1
    pooled_obs, pooled_exp = 0, 0.0
    for key, prob in exact.items():
        e, o = n * prob, counts.get(key, 0)
        if e >= 5:
            chi2 += (o - e) ** 2 / e
            dof += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
    if pooled_exp > 0:
        chi2 += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        dof += 1
    return chi2_pvalue(chi2, dof)


SETTINGS = {
    "temperature 0.7": SamplingParams(temperature=0.7),
    "temperature 1.3, top-k 8": SamplingParams(temperature=1.3, top_k=8),
    "top-p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "min-p 0.05": SamplingParams(temperature=1.0, min_p=0.05),
}


@pytest.fixture(scope="module")
def setup(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    prompt = dec.tokenize(PROMPT_TEXT)
    yield dec, probe, prompt
    probe.close()
    dec.close()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_first_two_tokens_follow_the_target_distribution(setup, name):
    dec, probe, prompt = setup
    params = SETTINGS[name]
    exact = exact_first_two(probe, prompt, params)
    counts = empirical_first_two(dec, prompt, params, draft_max=3)
    last = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, RUNS - 1)
    assert dec.generate(prompt, max_tokens=2, sampling=last, draft_max=3).stats.drafted > 0
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


def test_the_test_rejects_a_wrong_rule(setup, monkeypatch):
    """Accepting every draft token yields the draft's distribution, not the target's."""
    dec, probe, prompt = setup
    params = SETTINGS["temperature 0.7"]
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    exact = exact_first_two(probe, prompt, params)
    counts = empirical_first_two(dec, prompt, params, draft_max=3)
    exact_with_unseen = dict(exact)
    for key in counts:
        exact_with_unseen.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact_with_unseen) < 1e-6


def test_target_alone_follows_the_target_distribution(setup):
    """The baseline (draft_max=0) passes the same test: the sampler itself is right."""
    dec, probe, prompt = setup
    params = SETTINGS["top-p 0.8"]
    exact = exact_first_two(probe, prompt, params)
    counts = empirical_first_two(dec, prompt, params, draft_max=0)
    assert goodness_of_fit(counts, exact) > 1e-3
