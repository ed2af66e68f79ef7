"""Models whose memory llama.cpp cannot cut back by itself (Mamba: no per-token
snapshots). specllama keeps checkpoints or decodes again (engine/llama/rewind.py), so such
a model drafts, is drafted for, and serves a chat whose turns diverge; tests/test_hybrid.py
checks every kind of cut against a fresh decode. A cut that llama.cpp refuses where it
should not is an error, never silently ignored."""

import pytest
from tinymodels import write_tiny_mamba

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.errors import KVCacheError

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def test_llama_cpp_reports_the_memory_kind(mamba, tiny_target):
    m, t = Model(mamba, n_ctx=128, n_threads=1), Model(tiny_target, n_ctx=128, n_threads=1)
    try:
        assert (m.memory_kind, m.rewinder.best) == ("recurrent", "copy")
        assert (t.memory_kind, t.rewinder.best) == ("transformer", "trim")
    finally:
        m.close()
        t.close()


def test_a_recurrent_target_drafts_by_lookup_and_pairs_with_a_recurrent_draft(mamba, tmp_path):
    draft = write_tiny_mamba(tmp_path / "draft.gguf", noise=0.05)
    dec = SpeculativeDecoder.load(mamba, draft, n_ctx=256, n_threads=1, p_min=0.0)
    try:
        prompt = "the cat sat on the mat the cat sat on the"
        alone = dec.generate(prompt, max_tokens=24, sampling=GREEDY, draft_max=0)
        for drafters in (("lookup",), ("model",)):
            res = dec.generate(prompt, max_tokens=24, sampling=GREEDY, draft_max=3,
                               drafters=drafters)
            assert res.tokens == alone.tokens
    finally:
        dec.close()


def test_a_recurrent_cache_is_rebuilt_when_a_suffix_must_go(mamba):
    """A chat whose next prompt diverges from what the cache holds (or a stop string cut
    back): the state is rebuilt from the kept tokens and the output is the cold one."""
    dec = SpeculativeDecoder.load(mamba, n_ctx=128, n_threads=1, p_min=0.0)
    try:
        first = dec.generate("the cat sat on the", max_tokens=10, sampling=GREEDY, draft_max=0)
        kept = dec.tokenize("the cat sat on the") + first.tokens[:3]
        prompt = kept + dec.tokenize(" dog")[1:]
        warm = dec.generate(prompt, max_tokens=10, sampling=GREEDY, draft_max=0, keep_cache=True)
        # what survived the cut: the state at a checkpoint, or nothing (decoded again)
        assert warm.stats.prompt_reused <= len(kept)
        assert dec.target.cached == (prompt + warm.tokens)[:-1]
        cold = dec.generate(prompt, max_tokens=10, sampling=GREEDY, draft_max=0)
        assert warm.tokens == cold.tokens
    finally:
        dec.close()


def test_a_refused_cut_raises_instead_of_continuing(mamba):
    """Pretend the model could rewind: llama.cpp refuses the partial removal, and that is
    an error, not a cache that silently holds the wrong tokens."""
    m = Model(mamba, n_ctx=128, n_threads=1)
    try:
        m.rewinder.best = "trim"  # as if a plain seq_rm were enough
        m.decode(m.tokenize("the cat sat on the mat and the dog"), "last")
        with pytest.raises(KVCacheError) as info:
            m.truncate(3)
        assert str(info.value) == (
            "tiny-mamba.gguf: llama.cpp could not drop cached tokens from position 3; "
            "stopping rather than continuing with a cache that holds what it should not"
        )
    finally:
        m.close()


def test_an_error_during_generation_is_reported_as_such(tiny_target, tiny_draft, monkeypatch):
    """finish_reason says "error" (not "interrupted") when an exception ended the run, and
    the caches are still a prefix of the history."""
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    real, calls = dec.target.truncate, []

    def refused_on_the_third_round(n: int) -> None:
        calls.append(n)
        if len(calls) == 3:
            raise KVCacheError("refused")
        real(n)

    monkeypatch.setattr(dec.target, "truncate", refused_on_the_third_round)
    try:
        stream = dec.stream("Once upon a time", max_tokens=40, sampling=GREEDY, draft_max=3)
        with pytest.raises(KVCacheError):
            for _ in stream:
                pass
        res = stream.result
        assert res.finish_reason == "error"
        history = dec.tokenize("Once upon a time") + res.tokens
        assert dec.target.cached == history[: len(dec.target.cached)]
        assert dec.draft.cached == history[: len(dec.draft.cached)]
    finally:
        dec.close()
