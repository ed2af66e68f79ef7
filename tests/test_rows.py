"""A verify row's p read lazily (loop/rows.py's LazyP) is the p the rule is defined on:
p(d) and the whole vector as `probabilities` gives them, at any temperature, with any
filter, on a real-sized vocabulary."""

import numpy as np
import pytest

from specllama.engine.loop.rows import LazyP
from specllama.engine.sampling import SamplingParams, probabilities

PARAMS = [SamplingParams(temperature=0.8), SamplingParams(temperature=1.7),
          SamplingParams(temperature=0.8, top_k=40), SamplingParams(temperature=1.0, top_p=0.9),
          SamplingParams(temperature=1.0, min_p=0.05), SamplingParams(temperature=0.0)]


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_lazy_p_reads_as_the_processed_distribution(params):
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, 49_152).astype(np.float32)
    p = probabilities(logits, params)
    lazy = LazyP(logits, params)
    ids = [int(np.argmax(logits)), *rng.integers(0, logits.shape[0], 50).tolist()]
    # p(d): the same float64 weight over a float64 sum of the same 49k float32 weights,
    # summed in another order at most: ~1e-15 relative, far inside 1e-12
    assert [lazy[d] for d in ids] == pytest.approx([float(p[d]) for d in ids], rel=1e-12)
    assert lazy.shape == p.shape
    np.testing.assert_allclose(lazy.vector(), p, rtol=1e-12, atol=0)
    assert lazy.vector().sum() == pytest.approx(1.0, rel=1e-12)


def test_the_test_sees_a_p_left_unnormalised():
    """The same comparison rejects weights that were never divided by their sum."""
    logits = np.random.default_rng(1).normal(0.0, 3.0, 4_096).astype(np.float32)
    params = SamplingParams(temperature=0.8)
    unnormalised = np.exp((logits - logits.max()) / np.float32(0.8)).astype(np.float64)
    assert not np.allclose(unnormalised, probabilities(logits, params), rtol=1e-12, atol=0)
    assert LazyP(logits, params)[0] != pytest.approx(float(unnormalised[0]), rel=1e-12)
