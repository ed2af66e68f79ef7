"""bench/ceiling.py's pricing without models: which tokens a lookup could copy, the
oracle's cheapest schedule, and that no replayed drafter beats the oracle."""

import random

import pytest

from bench import ceiling
from specllama.engine.drafting.ngram import NgramIndex


def flat(n: int) -> float:
    """A verification that costs the same for any batch: drafts are free to check."""
    return 1.0


def linear(n: int) -> float:
    """Each token verified costs a step: no draft can pay."""
    return float(n)


def test_a_token_is_copyable_where_its_predecessors_were_followed_by_it_before():
    seen = [1, 2, 3]
    text = [9, 1, 2, 4, 1, 2]  # the prompt [9, 1, 2], then the output [4, 1, 2]
    assert ceiling.copyable(seen, text, 3, 1) == [False, False, True]
    assert ceiling.copyable(seen, text, 3, 2) == [False, False, False]  # (4, 1) -> 2: new
    assert ceiling.copyable([4, 1, 2], text, 3, 2) == [False, False, True]
    assert ceiling.copyable([], [5, 6, 5, 6, 5], 2, 2) == [False, False, True]


def test_a_context_lookup_proposes_what_followed_the_longest_earlier_match():
    index = NgramIndex(2)
    index.extend([1, 2, 3, 4, 9, 1, 2, 3])
    assert ceiling.propose(index, 2) == [4, 9]
    assert ceiling.propose(index, 0) == []
    index.extend([7])  # (3, 7) never occurred
    assert ceiling.propose(index, 3) == []
    repeating = NgramIndex(2)
    repeating.extend([5, 6, 5, 6])
    assert ceiling.propose(repeating, 5) == [5, 6, 5, 6, 5]  # the period goes on


def test_the_oracle_drafts_known_runs_whole_and_plain_steps_the_rest():
    costs = ceiling.Costs(flat, 0.0, flat)
    # 20 known tokens at a flat cost: a round of 15 drafts and the target's 16th, then 3 + 1
    assert ceiling.cheapest([True] * 20, [True] * 20, costs) == 2.0
    assert ceiling.cheapest([False] * 20, [False] * 20, costs) == 20.0
    # a known run broken by an unknown token: the target's own token ends each round
    assert ceiling.cheapest([True, True, False, True], [True] * 4, costs) == 2.0
    # at linear cost drafting never pays, known or not
    steps = ceiling.Costs(linear, 0.5, flat)
    assert ceiling.cheapest([True] * 10, [False] * 10, steps) == 10.0


def test_the_oracle_pays_the_draft_models_step_and_its_reading_of_the_prompt():
    request = ceiling.Request(prompt=[1, 2, 3], output=[7, 8, 9, 10], fresh=3,
                              by_model=[True] * 4, confidence=[0.9] * 4)
    drafting = ceiling.Costs(flat, 0.25, lambda n: 0.1 * n)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    # one round: 3 model drafts (0.75) and a target decode (1), the prompt read (0.3)
    assert ceiling.oracle([request], 0, None, False, True, drafting) == pytest.approx(2.05)
    # where reading the prompt costs more than drafting saves, plain steps
    slow_read = ceiling.Costs(flat, 0.25, lambda n: 10.0)
    assert ceiling.oracle([request], 0, None, False, True, slow_read) == 4.0


def test_a_replayed_request_seen_before_is_copied_from_history():
    first = ceiling.Request([1, 2], [3, 4, 5, 6, 7, 8], 2, [False] * 6, [0.1] * 6)
    again = ceiling.Request([1, 2], [3, 4, 5, 6, 7, 8], 0, [False] * 6, [0.1] * 6)
    costs = ceiling.Costs(flat, 0.0, flat)
    with_history = ceiling.replay([first, again], 1, True, 2, None, 15, 1, costs)
    without = ceiling.replay([first, again], 1, False, 2, None, 15, 1, costs)
    assert with_history == 1.0  # the whole answer in one round
    assert without == 6.0


def test_a_replayed_draft_model_pays_for_the_row_that_stops_it_and_its_catch_up():
    unsure = ceiling.Request([1, 2], [5, 6], 0, [True, True], [0.1, 0.1])
    costs = ceiling.Costs(flat, 0.25, lambda n: 0.25 * n)
    # each round reads a row, finds the draft unsure and steps plainly: 1 + 0.25 twice
    assert ceiling.replay([unsure], 0, False, None, 0.5, 1, 4, costs) == 2.5
    sure = ceiling.Request([1, 2], [5, 6, 7, 8], 3, [True] * 4, [0.9] * 4)
    # one round: the 3 new prompt tokens and `last` in one batch (1.0), 2 more rows
    # (0.5), the target's decode (1): drafts 3 and gets the 4th
    assert ceiling.replay([sure], 0, False, None, 0.5, 1, 3, costs) == 2.5
    # the model drafts 8 (and the target adds 1), a lookup copies 2 (and the target adds
    # 4), then the model catches up on those 2 with `last` in one batch and drafts 5
    mixed = ceiling.Request([7, 1, 2], [8, 1, 2, 4, 5], 0, [True] * 5, [0.9] * 5)
    assert ceiling.replay([mixed], 0, False, 1, 0.5, 4, 1, costs) == \
        (1 + 0.25) + 1 + (1 + 0.25 * 3)


@pytest.mark.parametrize("seed", range(20))
def test_no_replayed_drafter_beats_the_oracle(seed):
    rng = random.Random(seed)
    vocab = rng.randint(3, 8)  # few tokens: many matches, right and wrong
    requests = []
    for _ in range(4):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(3, 12))]
        n = rng.randint(1, 30)
        requests.append(ceiling.Request(
            prompt, [rng.randrange(vocab) for _ in range(n)], rng.randint(0, len(prompt)),
            [rng.random() < 0.6 for _ in range(n)], [rng.random() for _ in range(n)]))
    costs = ceiling.Costs(lambda n: 1.0 + 0.1 * (n - 1) ** 1.3, 0.3, lambda n: 0.05 * n,
                          round=0.02, wake=0.1)
    for history in (False, True):
        for m in (None, 1, 2, 3):
            for theta in (None, 0.0, 0.5):
                if m is None and theta is None:
                    continue
                best = ceiling.oracle(requests, 1, m, history, theta is not None, costs)
                for k_copy, k_model in ((1, 1), (4, 2), (15, 8)):
                    replayed = ceiling.replay(requests, 1, history, m, theta, k_copy,
                                              k_model, costs)
                    assert best <= replayed + 1e-9, (history, m, theta, k_copy, k_model)
