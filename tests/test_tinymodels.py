"""The tiny GGUF fixtures load in real llama.cpp and have the properties other tests rely on."""

from __future__ import annotations

import time

import llama_cpp
import numpy as np
import pytest
from tinymodels import write_tiny_model

TEXTS = [
    "Hello world, the cat 🐱 日本",
    "the dog was in the world",
    "  two  spaces\nand\ttabs ",
    "Ünïcödé ✓ 😀👍🏽 中文字符 한국어",
]
PROMPTS = [
    "Hello world, the cat",
    "the dog was in",
    "I like",
    "what is this",
    "you and she",
    "Lorem ipsum 42!",
    "a",
    "The time",
    "一二三",
    "hello hello hello",
]


def _load(path, logits_all=False):
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_threads=1, verbose=False, logits_all=logits_all
    )


def _vocab(llm):
    return llama_cpp.llama_model_get_vocab(llm.model)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _all_logits(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def _greedy(llm, prompt, n):
    toks = llm.tokenize(prompt.encode())
    llm.reset()
    llm.eval(toks)
    out = []
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    return toks, out


def test_loads_fast_and_has_expected_vocab(tiny_target):
    t0 = time.perf_counter()
    llm = _load(tiny_target)
    assert time.perf_counter() - t0 < 2.0  # typically ~10 ms
    v = _vocab(llm)
    assert llama_cpp.llama_vocab_type(v) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
    assert 300 < llm.n_vocab() < 600
    assert llama_cpp.llama_vocab_bos(v) == 1
    assert llama_cpp.llama_vocab_eos(v) == 2
    assert llama_cpp.llama_vocab_get_add_bos(v)
    assert not llama_cpp.llama_vocab_get_add_eos(v)
    assert "<|im_start|>" in llm.metadata["tokenizer.chat_template"]


def test_end_of_generation_tokens(tiny_target):
    llm = _load(tiny_target)
    v = _vocab(llm)
    ids = llm.tokenize(b"<|im_start|><|im_end|></s><s>", add_bos=False, special=True)
    assert ids == [3, 4, 2, 1]
    assert llama_cpp.llama_vocab_is_eog(v, 2)  # </s>
    assert llama_cpp.llama_vocab_is_eog(v, 4)  # <|im_end|>
    assert not llama_cpp.llama_vocab_is_eog(v, 3)
    assert not llama_cpp.llama_vocab_is_eog(v, 1)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny_target, tiny_other_vocab, text):
    for path in (tiny_target, tiny_other_vocab):
        llm = _load(path)
        ids = llm.tokenize(text.encode())
        assert ids[0] == 1
        assert llm.detokenize(ids).decode() == text


def test_words_are_single_tokens(tiny_target):
    llm = _load(tiny_target)
    ids = llm.tokenize(b"hello world the cat", add_bos=False)
    assert [llm.detokenize([i]) for i in ids] == [b" hello", b" world", b" the", b" cat"]


def test_same_seed_same_bytes_different_seed_differs(tmp_path):
    a = write_tiny_model(tmp_path / "a.gguf", seed=3)
    b = write_tiny_model(tmp_path / "b.gguf", seed=3)
    c = write_tiny_model(tmp_path / "c.gguf", seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_identical_weights_identical_logits(tiny_target, tiny_draft_same):
    assert tiny_target.read_bytes() == tiny_draft_same.read_bytes()
    t, d = _load(tiny_target, logits_all=True), _load(tiny_draft_same, logits_all=True)
    for p in PROMPTS[:3]:
        toks = t.tokenize(p.encode())
        assert np.array_equal(_all_logits(t, toks), _all_logits(d, toks))


def test_distribution_is_neither_one_hot_nor_uniform(tiny_target):
    llm = _load(tiny_target, logits_all=True)
    top1, wide = [], []
    for p in PROMPTS:
        probs = _softmax(_all_logits(llm, llm.tokenize(p.encode())))
        top1.extend(probs.max(axis=-1))
        wide.extend((probs > 0.01).sum(axis=-1))
    assert 0.15 < np.median(top1) < 0.6
    assert np.median(wide) >= 5


def test_greedy_output_is_varied(tiny_target):
    llm = _load(tiny_target, logits_all=True)
    for p in PROMPTS[:4]:
        _, out = _greedy(llm, p, 12)
        assert len(set(out)) >= 6


def _agreement(target_path, draft_path):
    t, d = _load(target_path, logits_all=True), _load(draft_path, logits_all=True)
    hits = []
    for p in PROMPTS:
        toks, out = _greedy(t, p, 20)
        seq = toks + out
        tl, dl = _all_logits(t, seq), _all_logits(d, seq)
        sl = slice(len(toks) - 1, len(seq) - 1)
        hits.extend(tl[sl].argmax(-1) == dl[sl].argmax(-1))
    return float(np.mean(hits))


def test_noisy_drafts_agree_partially(tiny_target, tiny_draft, tiny_draft_far):
    near = _agreement(tiny_target, tiny_draft)
    far = _agreement(tiny_target, tiny_draft_far)
    assert 0.55 <= near <= 0.9, near  # measured ~0.72
    assert far <= 0.3, far  # measured ~0.13


def test_other_vocab_differs(tiny_target, tiny_other_vocab):
    a, b = _load(tiny_target), _load(tiny_other_vocab)
    assert abs(a.n_vocab() - b.n_vocab()) > 128
    va, vb = _vocab(a), _vocab(b)
    for i in range(5):
        assert llama_cpp.llama_vocab_get_text(va, i) == llama_cpp.llama_vocab_get_text(vb, i)
    assert llama_cpp.llama_vocab_get_text(va, 5) != llama_cpp.llama_vocab_get_text(vb, 5)
    assert a.tokenize(TEXTS[0].encode()) != b.tokenize(TEXTS[0].encode())
    assert llama_cpp.llama_vocab_is_eog(vb, 4)
