"""A reasoning budget (engine/loop/budget.py): the close marker forced once the reasoning
has run its tokens, exact under speculation: the rule on its own, greedy output equal to
the target alone under the same budget, and the joint law of the first tokens, with the
same law test rejecting a budget that forgets the drafts before a row."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from laws import exact_joint
from test_exactness import goodness_of_fit
from tinymodels import THINK_TOKENS

import specllama.engine.loop.rounds as rounds
from specllama import InvalidParameterError, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.loop.budget import ReasoningBudget
from specllama.engine.sampling import probabilities

# ------------------------------------------------------------------ the rule


def test_the_close_is_forced_once_the_reasoning_has_run_its_tokens():
    b = ReasoningBudget(close=(9,), tokens=3)  # the output starts inside the reasoning
    assert [b.forced(out) for out in ([], [1, 2], [1, 2, 3], [1, 2, 3, 9])] == \
        [None, None, 9, None]
    assert b.forced([1, 9, 5, 6, 7]) is None  # closed by the model: the answer is free
    b = ReasoningBudget(close=(8, 9), tokens=2, open=(7,))
    assert b.forced([1, 2, 3]) is None  # no reasoning opened yet
    assert [b.forced(out) for out in ([7, 1], [7, 1, 2], [7, 1, 2, 8], [7, 1, 2, 8, 9])] == \
        [None, 8, 9, None]
    # a close the model began on the budget's last token: the forced one follows whole
    assert b.forced([7, 1, 8]) == 8 and b.forced([7, 1, 8, 8]) == 9
    assert ReasoningBudget(close=(9,), tokens=0).forced([]) == 9
    with pytest.raises(ValueError):
        ReasoningBudget(close=(), tokens=3)


# ------------------------------------------------------------------ through the engine
PROMPT = f"<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n{THINK_TOKENS[0]}\n"
BUDGET = 2


@pytest.fixture(scope="module")
def thinking(tiny_model_factory):
    """A tiny reasoning pair whose close is drawn now and then, not at once."""
    target = tiny_model_factory(seed=0, think=0.6)
    draft = tiny_model_factory(seed=0, think=0.6, noise=0.05, noise_seed=1)
    dec = SpeculativeDecoder.load(target, draft, n_ctx=256, n_threads=1, p_min=0.0,
                                  drafters="model")
    probe = Model(target, n_ctx=256, n_threads=1)
    close = tuple(dec.target.tokenize(THINK_TOKENS[1], add_bos=False, special=True))
    assert len(close) == 1
    yield dec, probe, ReasoningBudget(close=close, tokens=BUDGET)
    probe.close()
    dec.close()


def test_greedy_with_a_budget_equals_the_target_alone_under_it(thinking):
    dec, _, budget = thinking
    greedy = SamplingParams(temperature=0.0)
    prompt = dec.tokenize(PROMPT)
    free = dec.generate(prompt, max_tokens=12, sampling=greedy, draft_max=0).tokens
    alone = dec.generate(prompt, max_tokens=12, sampling=greedy, draft_max=0,
                         reasoning_budget=budget).tokens
    assert budget.close[0] not in free[:BUDGET + 1]  # so the budget acts here
    assert alone[BUDGET] == budget.close[0] and alone[:BUDGET] == free[:BUDGET]
    for k in (1, 3, 6):
        drafted = dec.generate(prompt, max_tokens=12, sampling=greedy, draft_max=k,
                               reasoning_budget=budget)
        assert drafted.tokens == alone, k
        assert drafted.stats.drafted > 0


LAW = SamplingParams(temperature=1.0, top_k=4)
LAW_TOKENS = 4
LAW_RUNS = 2500


def exact_budget_joint(model: Model, prompt: list[int], budget: ReasoningBudget,
                       n: int) -> dict:
    """P(x1..xn) for the target alone under the budget: each row forced where the path
    before it says so, else the target's own."""
    def p_after(path: tuple, row: np.ndarray) -> np.ndarray:
        forced = budget.forced(list(path))
        if forced is not None:
            row = np.where(np.arange(row.shape[0]) == forced, row, -np.inf)
        return probabilities(row, LAW)

    return exact_joint(model, prompt, n, p_after)


def first_tokens(dec: SpeculativeDecoder, prompt: list[int], budget: ReasoningBudget,
                 runs: int) -> tuple[Counter, int]:
    counts: Counter = Counter()
    accepted = 0
    for seed in range(runs):
        s = SamplingParams(LAW.temperature, LAW.top_k, seed=seed)
        res = dec.generate(prompt, max_tokens=LAW_TOKENS, sampling=s, keep_cache=True,
                           draft_max=3, reasoning_budget=budget)
        counts[tuple(res.tokens[:LAW_TOKENS])] += 1
        accepted += res.stats.accepted
    return counts, accepted


def test_speculation_under_a_budget_follows_the_target_law(thinking):
    dec, probe, budget = thinking
    prompt = dec.tokenize(PROMPT)
    exact = exact_budget_joint(probe, prompt, budget, LAW_TOKENS)
    counts, accepted = first_tokens(dec, prompt, budget, LAW_RUNS)
    assert accepted > LAW_RUNS // 2  # drafts were accepted (rejected ones: the test's
    assert goodness_of_fit(counts, exact) > 1e-3  # forced rows meet them)


def test_the_law_test_rejects_a_budget_that_forgets_the_drafts(thinking, monkeypatch):
    """The wrong rule: row i forced for the committed text alone, as if d_1..d_{i-1}
    were not before it."""
    dec, probe, budget = thinking
    monkeypatch.setattr(rounds.Generation, "_budget_text",
                        lambda self, i: self.generated)
    prompt = dec.tokenize(PROMPT)
    exact = exact_budget_joint(probe, prompt, budget, LAW_TOKENS)
    counts, _ = first_tokens(dec, prompt, budget, LAW_RUNS // 4)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


def test_a_budget_that_is_not_one_is_refused(thinking):
    dec, _, _ = thinking
    with pytest.raises(InvalidParameterError):
        dec.generate("hi", max_tokens=2, reasoning_budget=3)  # type: ignore[arg-type]
