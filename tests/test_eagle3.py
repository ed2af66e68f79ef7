"""An EAGLE3 head as the draft model (engine/llama/eagle3.py), through the one door of draft
kinds (engine/drafting/kinds.py): exact under p/q at any temperature, though its q lives in
a smaller vocabulary (`d2t`) and is zero outside it.

The tiny pair (tests/eagle3models.py) is built so that the head agrees with its target as
`gain` goes to 0; at 0.3 it is rejected often enough that the law test sees both
verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from drafts import GREEDY, cli_report
from eagle3models import DRAFT_VOCAB, draft_ids, write_tiny_eagle3_pair
from noise import split_noise, tolerance
from test_cli import assert_one_line_error
from test_hybrid import RUNS, pair_law
from tinymodels import write_tiny_model

import specllama.engine.sampling as sampling_module
from specllama import InvalidParameterError, ModelLoadError, SamplingParams, SpeculativeDecoder

PROMPTS = ["the cat sat on the", "once upon a time there", "a b c d e f g"]
LAW = SamplingParams(temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle3")
    return write_tiny_eagle3_pair(d / "target.gguf", d / "eagle3.gguf", gain=0.02)


@pytest.fixture(scope="module")
def halfway(tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle3")
    return write_tiny_eagle3_pair(d / "target.gguf", d / "eagle3.gguf", gain=0.3)


@pytest.fixture(scope="module")
def dec(agreeing):
    d = SpeculativeDecoder.load(*agreeing, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


def test_an_eagle3_file_is_loaded_as_a_head_over_the_target(dec):
    traits = dec.draft_model.traits
    assert (traits.kind, traits.drafts_as, traits.vocabulary) == ("eagle3", "model", "subset")
    assert dec.default_drafters == ("lookup", "model")
    assert dec.draft.placement.startswith("EAGLE3 head over the target's states")


@pytest.mark.parametrize("draft_max", [1, 3, 6, "auto"])
def test_greedy_eagle3_speculation_equals_the_target_alone(dec, draft_max):
    drafted = accepted = 0
    for prompt in PROMPTS:
        alone = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0).tokens
        res = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=draft_max,
                           drafters=("model",))
        assert res.tokens == alone
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    if draft_max != "auto":
        assert drafted > accepted > 0.5 * drafted  # the built-in agreement shows


def test_its_q_is_zero_outside_its_vocabulary(dec):
    """llama.cpp writes the head's logits into the target's ids through d2t, -inf
    elsewhere: what it can propose is exactly its own vocabulary."""
    text = dec.tokenize(PROMPTS[0])
    dec.reset()
    dec.target.decode(text[:-1], "none")
    dec.draft.decode(text, "last")
    row = dec.draft.logits_row(-1)
    finite = np.flatnonzero(np.isfinite(row))
    assert finite.tolist() == sorted(draft_ids(DRAFT_VOCAB).tolist())
    assert len(finite) < dec.target.n_vocab


def test_its_drafts_after_rejections_read_as_a_fresh_pair_would(halfway):
    """Rollback: after rounds with rejected drafts (its cache cut back each time, its own
    states decoded again from the target's), its next q is what a pair loaded afresh
    gives on the text."""
    d = SpeculativeDecoder.load(*halfway, n_ctx=512, n_threads=1, p_min=0.0)
    fresh = SpeculativeDecoder.load(*halfway, n_ctx=512, n_threads=1)
    try:
        res = d.generate(PROMPTS[1], max_tokens=30, sampling=SamplingParams(
            temperature=1.0, seed=3), draft_max=4, drafters=("model",))
        assert res.stats.drafted > res.stats.accepted > 0
        text = [*d.tokenize(PROMPTS[1]), *res.tokens]
        rows = []
        for x in (d, fresh):
            x.target.sync_to(text[:-1])
            x.target.decode(text[len(x.target.cached):-1], "none")
            kept = x.draft.sync_to(text)
            x.draft.decode(text[kept:], "last")
            rows.append(x.draft.logits_row(-1).copy())
            assert x.draft.pos_max() + 1 == len(x.draft.cached) == len(text)
        # the pairs decoded the text in other batches: the head's and the target's noise
        noise = max(split_noise(fresh.draft, text), split_noise(fresh.target, text[:-1]))
        bound = tolerance(noise)  # short of a stale state or a wrong input
        np.testing.assert_allclose(rows[0], rows[1], atol=bound)
    finally:
        d.close()
        fresh.close()


def test_a_copy_of_its_state_restores_what_it_drafts_from(dec):
    """The prompt cache (server/promptcache.py) copies both caches; a restored head
    has its fused states back and drafts as before."""
    text = dec.tokenize(PROMPTS[2])
    dec.reset()
    dec.target.decode(text[:-1], "none")
    noise = split_noise(dec.draft, text, len(text) - 1)  # the last token alone, as below
    dec.draft.decode(text, "last")
    before = dec.draft.logits_row(-1).copy()
    saved = dec.target.save_state(), dec.draft.save_state()
    dec.generate(PROMPTS[0], max_tokens=10, sampling=GREEDY, draft_max=3)  # other text
    dec.target.restore(saved[0])
    dec.draft.restore(saved[1])
    dec.draft.truncate(len(text) - 1)
    dec.draft.decode(text[-1:], "last")
    bound = tolerance(noise)  # short of a lost fused state
    np.testing.assert_allclose(dec.draft.logits_row(-1), before, atol=bound)


def test_eagle3_speculation_follows_the_target_law(halfway):
    pvalue, drafted_at, accepted_at = pair_law(halfway, LAW)
    assert drafted_at[2] > 0 and 0 < accepted_at[0] < drafted_at[0] and accepted_at[2] > 0
    assert pvalue > 1e-3


def test_the_eagle3_law_test_rejects_a_wrong_rule(halfway, monkeypatch):
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    assert pair_law(halfway, LAW, runs=RUNS // 8)[0] < 1e-6


def test_the_cli_drafts_with_an_eagle3_head(agreeing):
    target, head = agreeing
    report = cli_report(target, head, PROMPTS[0])
    assert report["settings"]["draft"] == str(head)
    assert report["stats"]["drafted"] > report["stats"]["accepted"] > 0


def test_what_an_eagle3_head_cannot_do_is_a_one_line_error(agreeing, run, tmp_path):
    target, head = agreeing
    assert_one_line_error(run("generate", "hi", "--target", head),
                          "eagle3.gguf is an EAGLE3 head: it drafts for a target")
    assert_one_line_error(run("generate", "hi", "--target", target, "--draft", head,
                              "--threads", 2, "--draft-threads", 1),
                          "fuses the states of one target context",
                          "cannot draft ahead (--draft-threads)")
    with pytest.raises(InvalidParameterError, match="not for --parallel slots"):
        SpeculativeDecoder.load(target, head, n_ctx=256, n_threads=1, n_seq=2)
    wider = write_tiny_model(tmp_path / "wide.gguf", n_embd=96)
    with pytest.raises(ModelLoadError, match="drafts for a model of hidden size 64"):
        SpeculativeDecoder.load(wider, head, n_ctx=256, n_threads=1)
