"""`serve --parallel`: each token computed on the side of WIDE it would be alone.

llama.cpp's CPU flash attention takes one path for a batch of fewer than WIDE query rows
(F16 dot products) and another from WIDE rows on (F32 tiles); on the real SmolLM2 the
two differ by up to a logit. A request's prompt or round batched beside other requests'
must stay on its own side, or greedy output parts from the request served alone
(engine/llama/batched.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from drafts import GREEDY
from noise import EXACT_FLOOR, apart, split_noise, tolerance
from test_parallel import at_once, load, order, parallel
from test_smollm2 import assert_same_but_ties

from specllama import SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.llama.batched import WIDE, Batcher, pieces

SENTENCE = "the quick brown fox jumps over the lazy dog while a bird sings"
LONG = " ".join([SENTENCE] * 14)  # ~180 SmolLM2 tokens


@pytest.mark.parametrize("alone, most", [(512, 128), (512, 256), (64, 128), (300, 128)])
def test_a_prompt_is_cut_where_alone_cuts_it_and_each_piece_keeps_its_side(alone, most):
    for n in range(1, 1500, 7):
        sizes = pieces(n, alone, most)
        assert sum(sizes) == n and all(0 < s <= max(most, alone) for s in sizes)
        chunks = [alone] * ((n - 1) // alone) + [(n - 1) % alone + 1]  # Model.decode's
        pos, i = 0, 0
        for c in chunks:  # alone's cuts kept; each piece of a chunk on the chunk's side
            end, inside = pos + c, []
            while pos < end:
                inside.append(sizes[i])
                pos, i = pos + sizes[i], i + 1
            assert pos == end, (n, sizes)
            assert all((s >= WIDE) == (c >= WIDE) for s in inside), (n, c, inside)


def alone_and_at_once(target, draft, texts: list[str],
                      tokenize: Callable[[SpeculativeDecoder, str], list[int]]
                      ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The prompts, their greedy tokens alone, and those of all at once on as many slots;
    the second text is long enough to go in pieces (draft_max 3, 40 tokens)."""
    dec = load(target, draft)
    prompts = [tokenize(dec, t) for t in texts]
    assert len(prompts[1]) > 128
    expected = [dec.generate(p, max_tokens=40, sampling=GREEDY, draft_max=3).tokens
                for p in prompts]
    dec.close()
    with parallel(target, draft, len(texts)) as slots:
        outcomes = at_once(slots, [order(i, p, max_tokens=40) for i, p in enumerate(prompts)])
    return prompts, expected, [o.result.tokens for o in outcomes]


@pytest.fixture
def fired(monkeypatch) -> list[list[int]]:
    """The sizes of the shares in every batch fired from now on."""
    out: list[list[int]] = []
    fire = Batcher._fire

    def recording(self: Batcher, shares: list) -> None:
        out.append([len(s.tokens) for s in shares])
        fire(self, shares)

    monkeypatch.setattr(Batcher, "_fire", recording)
    return out


def test_a_long_prompt_beside_rounds_goes_in_wide_batches_of_its_own(tiny_target, tiny_draft,
                                                                     fired):
    """A long prompt arriving beside two short requests: its pieces fire in batches on
    their own side, the others' rounds under WIDE together, and every request gets what
    it gets alone, token for token."""
    long = " ".join([SENTENCE] * 6)
    _, expected, got = alone_and_at_once(tiny_target, tiny_draft,
                                      ["Hello world", long, "once upon a time there"],
                                      lambda dec, text: dec.tokenize(text))
    assert got == expected
    assert any(min(b) >= WIDE for b in fired) and any(len(b) > 1 for b in fired)
    for sizes in fired:
        assert min(sizes) >= WIDE or sum(sizes) < WIDE, sizes


# ------------------------------------------------------------------ the real model


def last_row(m: Model, tokens: list[int], row: int) -> np.ndarray:
    m.clear()
    m.decode(tokens, "all")
    return m.logits_row(row).copy()


@pytest.mark.slow
def test_llama_cpp_computes_a_batch_differently_from_wide_rows_on(smollm2_path):
    """The constant is llama.cpp's: the same row in a batch of WIDE - 1 rows and of WIDE
    rows differs, and not within either side. If this fails, llama.cpp moved its tile
    size (GGML_FA_TILE_Q) and WIDE must follow."""
    m = Model(smollm2_path, n_ctx=512, n_threads=2)
    tokens = m.tokenize(LONG)[: WIDE + 1]
    rows = {n: last_row(m, tokens[:n], 9) for n in (WIDE - 2, WIDE - 1, WIDE, WIDE + 1)}
    noise = split_noise(m, tokens[:10])  # narrow batches: 0 on an AMD EPYC, bit-exact
    m.close()
    across = apart(rows[WIDE - 1], rows[WIDE])  # 0.98 on an AMD EPYC
    bound = tolerance(noise, bug=across, floor=EXACT_FLOOR)  # 1e-4 where bit-exact
    assert apart(rows[WIDE - 2], rows[WIDE - 1]) < bound
    assert apart(rows[WIDE], rows[WIDE + 1]) < bound


@pytest.mark.slow
def test_real_model_greedy_requests_at_once_equal_each_alone(smollm2_path):
    """The real SmolLM2 (as its own draft): three chat requests at once, one with a long
    prompt, give the tokens each gives alone, but where its two best logits tie. Batched
    across sides, the haiku already parted at its first token, where they are 1e-3 apart."""
    questions = ["Write a haiku about the sea.", "Summarize this: " + LONG, "What is 2+2?"]
    prompts, expected, got = alone_and_at_once(smollm2_path, smollm2_path, questions,
                                               lambda dec, text: dec.target.prompt(text))
    probe = Model(smollm2_path, n_ctx=512, n_threads=2)
    for i, prompt in enumerate(prompts):  # a CPU may still round a true tie either way
        assert_same_but_ties(probe, prompt, got[i], expected[i], questions[i][:30])
    probe.close()
