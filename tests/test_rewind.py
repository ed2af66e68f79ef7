"""Models whose memory cannot drop a suffix (recurrent and hybrid architectures: Mamba,
RWKV, ...). Speculation cuts rejected drafts out of both caches every round, so such a
model is refused as a draft, or as a target with drafting on, in one line; as a target
alone it works, its state rebuilt from the kept tokens when a suffix must go. A cut that
llama.cpp refuses anywhere else is an error, never silently ignored."""

import pytest
from click.testing import CliRunner
from tinymodels import write_tiny_mamba

from specllama import (
    IncompatiblePairError,
    SamplingParams,
    SpeculativeDecoder,
)
from specllama.cli import cli
from specllama.engine.llama import Model
from specllama.errors import KVCacheError

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def test_llama_cpp_reports_the_memory_kind(mamba, tiny_target):
    m, t = Model(mamba, n_ctx=128, n_threads=1), Model(tiny_target, n_ctx=128, n_threads=1)
    try:
        assert (m.memory_kind, m.can_rewind) == ("recurrent", False)
        assert (t.memory_kind, t.can_rewind) == ("transformer", True)
    finally:
        m.close()
        t.close()


@pytest.mark.parametrize("role", ["draft", "target"])
def test_a_recurrent_model_in_a_pair_is_refused_in_one_line(mamba, tiny_target, role):
    target, draft = (tiny_target, mamba) if role == "draft" else (mamba, tiny_target)
    with pytest.raises(IncompatiblePairError) as info:
        SpeculativeDecoder.load(target, draft, n_ctx=128, n_threads=1, p_min=0.0)
    assert str(info.value) == (
        f"{role} tiny-mamba.gguf is a recurrent model: its memory cannot drop rejected draft "
        "tokens, so it cannot take part in speculative decoding; run it as a target alone "
        "(--draft-max 0)"
    )
    result = CliRunner().invoke(
        cli, ["generate", "hi", "--raw", "--target", str(target), "--draft", str(draft)]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"specllama: error: {info.value}\n"


def test_a_recurrent_target_alone_works_and_refuses_lookup_drafting(mamba):
    dec = SpeculativeDecoder.load(mamba, n_ctx=128, n_threads=1, p_min=0.0)
    try:
        res = dec.generate("the cat", max_tokens=12, sampling=GREEDY, draft_max=0)
        assert res.tokens and res.stats.target_steps == len(res.tokens)
        with pytest.raises(IncompatiblePairError, match="target tiny-mamba.gguf is a recurrent"):
            dec.generate("the cat", max_tokens=4, sampling=GREEDY, draft_max=3,
                         drafters=("lookup",))
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
        assert warm.stats.prompt_reused == len(kept)
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
        m.memory_kind = "transformer"
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
