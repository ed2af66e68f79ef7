"""A Gemma 4 assistant as the draft model (engine/llama/assistant.py): a second file that
keeps no cache of its own and reads the target's, exact under p/q at any temperature.

The tiny pair (tests/hybridmodels.py) is built so that the assistant agrees with its
target as `gain` goes to 0 (both tend to one bigram model): at 0.05 drafts are accepted
often; at 0.2 about a quarter of the time, so the law test sees both verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from drafts import GREEDY, cli_report
from hybridmodels import write_tiny_gemma4_pair
from noise import split_noise, tolerance
from test_cli import assert_one_line_error
from test_hybrid import RUNS, pair_law

import specllama.engine.sampling as sampling_module
from specllama import InvalidParameterError, ModelLoadError, SamplingParams, SpeculativeDecoder
from specllama.engine.llama.assistant import AssistantDraft

PROMPTS = ["the cat sat on the", "once upon a time there", "a b c d e f g"]
#: A wide top-k: the tiny pair's top three often differ after the first token,
#: and then no chain of three drafts would ever be accepted.
LAW = SamplingParams(temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def agreeing(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    return write_tiny_gemma4_pair(d / "gemma4.gguf", d / "gemma4-assistant.gguf", gain=0.05)


@pytest.fixture(scope="module")
def halfway(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    return write_tiny_gemma4_pair(d / "gemma4.gguf", d / "gemma4-assistant.gguf", gain=0.2)


@pytest.fixture(scope="module")
def dec(agreeing):
    d = SpeculativeDecoder.load(*agreeing, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


def test_an_assistant_file_is_loaded_as_a_draft_over_the_target(dec):
    assert isinstance(dec.draft, AssistantDraft)
    assert dec.default_drafters == ("lookup", "model")
    assert dec.draft.placement.startswith("Gemma 4 assistant over the target's cache")


@pytest.mark.parametrize("draft_max", [1, 3, 6, "auto"])
def test_greedy_assistant_speculation_equals_the_target_alone(dec, draft_max):
    drafted = accepted = 0
    for prompt in PROMPTS:
        alone = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0).tokens
        res = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=draft_max,
                           drafters=("model",))
        assert res.tokens == alone
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    if draft_max != "auto":
        assert drafted > accepted > 0.5 * drafted  # the built-in agreement shows


def test_its_drafts_after_rejections_read_as_a_fresh_pair_would(dec, agreeing):
    """It keeps no state: after rounds with rejected drafts (the target's cache cut back
    each time), its next draft's q is what a pair loaded afresh gives on the text."""
    res = dec.generate(PROMPTS[1], max_tokens=30, sampling=SamplingParams(temperature=1.0,
                       seed=3), draft_max=4, drafters=("model",))
    assert res.stats.drafted > res.stats.accepted > 0
    text = [*dec.tokenize(PROMPTS[1]), *res.tokens]
    fresh = SpeculativeDecoder.load(*agreeing, n_ctx=512, n_threads=1)
    try:
        rows = []
        for d in (dec, fresh):
            d.target.sync_to(text[:-1])
            d.target.decode(text[len(d.target.cached):-1], "none")
            kept = d.draft.sync_to(text[:-1])
            d.draft.decode(text[kept:], "last")  # those the target holds cost nothing
            rows.append(d.draft.logits_row(-1).copy())
            assert d.draft.pos_max() + 1 == len(d.draft.cached) == len(text)
        # it steps a token at a time: its noise is that of the target's states it reads
        bound = tolerance(split_noise(fresh.target, text[:-1]))  # short of a stale state
        np.testing.assert_allclose(rows[0], rows[1], atol=bound)
    finally:
        fresh.close()


def test_it_reads_the_target_s_cache(halfway):
    """The same token and hidden state, beside a different text in the target's cache,
    give another q: the assistant attends to the target's cells."""
    d = SpeculativeDecoder.load(*halfway, n_ctx=512, n_threads=1)
    try:
        rows = []
        for prompt in ("the cat sat on the mat", "a b c d e f g h i j"):
            d.target.clear()
            d.draft.clear()
            tokens = d.tokenize(prompt)
            d.target.decode(tokens, "none")
            d.draft.sync_to(tokens)
            d.draft.hidden.rows[len(tokens) - 1] = 0.5  # one h for both texts
            d.draft.decode([7], "last")
            rows.append(d.draft.logits_row(-1).copy())
        # 2.6 on an AMD EPYC; a head blind to the cache gives the very same row (one
        # step, the same inputs), so any difference far above float noise shows it
        assert np.abs(rows[0] - rows[1]).max() > 1e-2
    finally:
        d.close()


def test_assistant_speculation_follows_the_target_law(halfway):
    pvalue, drafted_at, accepted_at = pair_law(halfway, LAW)
    assert drafted_at[2] > 0 and 0 < accepted_at[0] < drafted_at[0] and accepted_at[2] > 0
    assert pvalue > 1e-3


def test_the_assistant_law_test_rejects_a_wrong_rule(halfway, monkeypatch):
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    assert pair_law(halfway, LAW, runs=RUNS // 8)[0] < 1e-6


def test_the_cli_drafts_with_an_assistant(agreeing):
    target, assistant = agreeing
    report = cli_report(target, assistant, PROMPTS[0])
    assert report["settings"]["draft"] == str(assistant)
    assert report["stats"]["drafted"] > report["stats"]["accepted"] > 0


def test_what_an_assistant_cannot_do_is_a_one_line_error(agreeing, tiny_target, run):
    target, assistant = agreeing
    assert_one_line_error(run("generate", "hi", "--target", assistant),
                          "gemma4-assistant.gguf is a Gemma 4 assistant")
    assert_one_line_error(run("generate", "hi", "--target", tiny_target, "--draft", assistant),
                          "is a Gemma 4 assistant; the target", "is llama")
    assert_one_line_error(run("generate", "hi", "--target", target, "--draft", assistant,
                              "--threads", 2, "--draft-threads", 1),
                          "cannot draft ahead (--draft-threads)")
    with pytest.raises(InvalidParameterError, match="not for --parallel slots"):
        SpeculativeDecoder.load(target, assistant, n_ctx=256, n_threads=1, n_seq=2)
    with pytest.raises(ModelLoadError, match="is a Gemma 4 assistant"):
        SpeculativeDecoder.load(assistant, n_ctx=256, n_threads=1)
