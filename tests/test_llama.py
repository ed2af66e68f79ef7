"""The model wrapper on a real tiny model: what a failed llama_decode leaves behind."""

import pytest

from specllama.engine.llama import Model
from specllama.errors import DecodeError


def test_a_decode_llama_cpp_refuses_is_a_decode_error_and_the_cache_stays(tiny_target):
    model = Model(tiny_target, n_ctx=64, n_threads=1)
    prompt = model.tokenize("hello world")
    model.decode(prompt)

    with pytest.raises(DecodeError, match="llama_decode failed with code -1 on 2 tokens") as err:
        model.decode([prompt[-1], -1])  # no such token: llama_decode returns -1

    assert "\n" not in str(err.value)  # the CLI shows it as one line
    assert model.cached == prompt and model.pos_max() + 1 == len(prompt)
    model.decode([prompt[-1]])  # and it decodes on
    assert model.logits_row(0).shape == (model.n_vocab,)
