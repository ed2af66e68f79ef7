"""Which drafts may draft for a target: llama.cpp's rule (common_speculative_are_compatible),
on real tiny pairs that differ only in their special tokens."""

import pytest

from specllama import IncompatiblePairError, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model


def load(target, draft):
    return SpeculativeDecoder.load(target, draft, n_ctx=128, n_threads=1)


def test_eos_ids_no_prompt_carries_do_not_matter(tiny_model_factory):
    """Neither tokenizer adds EOS, so their EOS ids (</s> vs <|im_end|>) never meet."""
    target = tiny_model_factory(seed=0, eos="</s>")
    draft = tiny_model_factory(seed=0, eos="<|im_end|>")
    dec = load(target, draft)
    try:
        result = dec.generate("hello world", max_tokens=8,
                              sampling=SamplingParams(temperature=0.0), draft_max=3)
        assert result.stats.drafted > 0
    finally:
        dec.close()


def test_bos_ids_no_prompt_carries_do_not_matter(tiny_model_factory):
    target = tiny_model_factory(seed=0, bos="<s>", add_bos=False)
    draft = tiny_model_factory(seed=0, bos="<|im_start|>", add_bos=False)
    load(target, draft).close()


def test_eos_ids_that_both_add_must_agree(tiny_model_factory):
    target = tiny_model_factory(seed=0, eos="</s>", add_eos=True)
    draft = tiny_model_factory(seed=0, eos="<|im_end|>", add_eos=True)
    with pytest.raises(IncompatiblePairError, match=r"EOS tokens differ \(2 vs 4\)") as err:
        load(target, draft)
    assert f"draft {draft.name} cannot draft for target {target.name}" in str(err.value)


def test_bos_ids_that_both_add_must_agree(tiny_model_factory):
    target = tiny_model_factory(seed=0, bos="<s>")
    draft = tiny_model_factory(seed=0, bos="<|im_start|>")
    with pytest.raises(IncompatiblePairError, match=r"BOS tokens differ \(1 vs 3\)"):
        load(target, draft)


def test_a_draft_that_adds_eos_where_the_target_does_not_is_refused(tiny_model_factory):
    """The same EOS id, but one tokenizer appends it to every prompt and the other not:
    llama.cpp refuses such a pair."""
    target = tiny_model_factory(seed=0)
    draft = tiny_model_factory(seed=0, add_eos=True)
    with pytest.raises(IncompatiblePairError,
                       match="the draft adds EOS to every prompt and the target does not"):
        load(target, draft)


def test_a_cross_vocabulary_draft_sharing_too_little_is_refused(tiny_target, tiny_draft):
    import numpy as np

    from specllama.engine.drafting.vocabmap import VocabMap, check_intersection

    target, draft = Model(tiny_target, n_ctx=32), Model(tiny_draft, n_ctx=32)
    few = VocabMap(np.arange(5, 9), np.arange(5, 9), draft.n_vocab, target.n_vocab)
    with pytest.raises(IncompatiblePairError) as err:
        check_intersection(few, target, draft)
    assert str(err.value) == (
        f"draft {tiny_draft.name} shares too few tokens with target {tiny_target.name} to "
        f"draft for it: 4 of its {draft.n_vocab} tokens (1%; at least 10% needed) spell a "
        "target token")
    check_intersection(VocabMap.build(target, draft), target, draft)  # a family: all of it
