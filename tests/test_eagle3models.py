"""The tiny EAGLE3 pair of eagle3models loads in real llama.cpp, has llama.cpp's eagle3
layout, and its draft agrees with the target at the rate ``gain`` sets."""

from __future__ import annotations

import numpy as np
import pytest
from eagle3models import (
    DRAFT_VOCAB,
    TARGET_LAYERS,
    draft_ids,
    greedy_agreement,
    write_tiny_eagle3_pair,
)
from tinymodels import vocab_pieces

gguf = pytest.importorskip("gguf")


def _field(reader, key):
    f = reader.fields[key]
    return [f.parts[i].tolist() for i in f.data]


def test_layout_and_head(tmp_path):
    t, d = write_tiny_eagle3_pair(tmp_path / "t.gguf", tmp_path / "d.gguf")
    rt, rd = gguf.GGUFReader(t), gguf.GGUFReader(d)
    assert bytes(_field(rd, "general.architecture")[0]).decode() == "eagle3"
    assert [x[0] for x in _field(rd, "eagle3.target_layers")] == list(TARGET_LAYERS)
    assert _field(rd, "eagle3.target_hidden_size") == [[64]]
    assert _field(rd, "eagle3.block_count") == [[1]]
    assert _field(rd, "tokenizer.ggml.tokens") == _field(rt, "tokenizer.ggml.tokens")
    tensors = {x.name: x for x in rd.tensors}
    assert "token_embd.weight" not in tensors  # llama.cpp takes the target's
    d2t = np.asarray(tensors["d2t"].data)
    assert tensors["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert d2t.tolist() == draft_ids(DRAFT_VOCAB).tolist()
    assert len(d2t) == DRAFT_VOCAB and np.all(np.diff(d2t) > 0)
    types = np.array([e[2] for e in vocab_pieces("a")])
    assert {1, 2, 4} <= set(d2t.tolist()) and set(types[d2t].tolist()) <= {1, 3}
    head_t = np.asarray({x.name: x for x in rt.tensors}["output.weight"].data)
    head_d = np.asarray(tensors["output.weight"].data)
    assert head_d.shape == (DRAFT_VOCAB, 64)
    np.testing.assert_array_equal(head_d, head_t[d2t])  # absolute target ids
    _, full = write_tiny_eagle3_pair(tmp_path / "t.gguf", tmp_path / "f.gguf",
                                     draft_vocab=None)
    assert "d2t" not in {x.name for x in gguf.GGUFReader(full).tensors}


# ---------------------------------------------------------------- in llama.cpp


def test_the_draft_names_only_its_vocabulary(tmp_path):
    """llama.cpp gives every target id outside d2t a logit of -inf."""
    from llama_cpp import llama_cpp as C

    t, d = write_tiny_eagle3_pair(tmp_path / "t.gguf", tmp_path / "d.gguf")
    mp = C.llama_model_default_params()
    tm = C.llama_model_load_from_file(str(t).encode(), mp)
    dm = C.llama_model_load_from_file(str(d).encode(), mp)
    try:
        assert C.llama_model_has_encoder(dm) and not C.llama_model_has_encoder(tm)
        assert C.llama_vocab_n_tokens(C.llama_model_get_vocab(dm)) == 489
    finally:
        C.llama_model_free(dm)
        C.llama_model_free(tm)


@pytest.mark.parametrize(("gain", "low", "high"), [(0.05, 0.7, 1.0), (0.3, 0.25, 0.6)])
def test_draft_agrees_as_gain_says(tmp_path, gain, low, high):
    t, d = write_tiny_eagle3_pair(tmp_path / "t.gguf", tmp_path / "d.gguf", gain=gain)
    rng = np.random.default_rng(0)
    texts = [[1] + rng.integers(5, 489, size=60).tolist() for _ in range(3)]
    assert low <= greedy_agreement(t, d, texts) <= high
