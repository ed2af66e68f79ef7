"""Synthetic EAGLE3 pairs: a random-weight llama target of a real shape (:mod:`.synthetic`)
and an EAGLE3 draft head for it in llama.cpp's ``eagle3`` layout (for Llama 3.1 8B: one
decoder layer of width 4096, 32 heads / 8 KV heads, FFN 14336, fusing target layers
[2, 16, 29], its own output head over a 32,000-token draft vocabulary with ``d2t``, no
``token_embd``: llama.cpp takes the target's), built so that the head agrees with the
target. Costs are real (the same shapes, the same kernels); the text is meaningless.

How it agrees. The target is :mod:`.synthetic`'s, drawn by the same seeded generator,
with ``early = 0`` (every layer scaled by ``late``): nearly a bigram model,
logits(P) ~ head(norm(emb(x_P))). Given the token x_{P+1} at KV position P, the head
computes head(norm(emb(x_{P+1}))), what the target says at P + 1:

* attention passes the token's normed embedding through: ``wk = ALPHA * [I | 0]`` and
  ``wv = [I | 0]`` take the first ``kv_heads * head_dim`` dimensions of the
  token-embedding half of the decoder's input (the other half is the fused target
  features g), each query head reads the same dimensions as its KV head, and
  ``wo`` averages the query heads of each KV group back into those dimensions. A query
  and its own key are the same vector (RoPE turns both alike at distance 0), so a
  position attends to itself and to positions holding the same token, whose values are
  the same: on an 8B a query scores ~11 standard deviations higher on its own key than
  on a random one, which ALPHA turns into a gap of over 100 in the softmax.
* ``eagle3.norm_before_residual``: the residual is norm(g) times ``attn_norm_2`` =
  G_WEIGHT (small), so neither the fused features nor, in a chain of drafts, the
  previous step's output (llama.cpp feeds it back as g) pile up in the residual stream.
  ``fc`` and the FFN are random, the FFN's output scaled to FFN_DOWN.
* the head's rows are the target's at ``d2t`` (absolute target ids).

Two things a random target of the real shape would not allow, so the target differs from
``{ synthetic = ..., early = 0 }``'s in two tensors (``eagle3 = true`` in models.toml;
its own file name):

* with 8 KV heads of 128, the attention carries 1,024 of the embedding's 4,096
  dimensions: the target's embedding rows are zero beyond the first
  ``kv_heads * head_dim`` dimensions (those scaled up by sqrt(d / kept), so the rows keep
  their RMS), so that those dimensions are all there is to know about a token;
* a draft vocabulary of 32,000 of the 128,256 tokens would hold the target's choice only
  a quarter of the time: the target's head rows outside it are scaled by OUT_OF_DRAFT
  (0.5), so it writes them ~1% of the time, as a real model seldom writes the rare
  tokens an EAGLE3 head leaves out.

Neither changes what anything costs. The draft's weights depend only on the shape and
the seed (the embedding and head are drawn before the layers), and it is made once per
target file, as a derived draft is, in F16 (``quant`` on the draft's table requantizes
it, as for any draft file; llama.cpp quantizes the eagle3 layout and keeps ``d2t``).

Measured (teacher-forced greedy agreement in llama.cpp, the head's argmax at P against
the target's at P + 1, on random token texts; tests/eagle3models.py's
``greedy_agreement``):

* the "tiny" shape (8 layers, d 128; F32), 360 positions: ``late`` 0 / 0.05 / 0.1 / 0.2
  / 0.3 / 0.5 -> 0.99 / 0.99 / 0.98 / 0.86 / 0.69 / 0.21 (disagreement grows as late^2);
* Llama 3.1 8B (32 layers: more to add up), 200 positions: late 0.1, Q4_K_M target, F16
  head -> 0.785 (late 0.15, F16 target: 0.63 over 150); chained drafts at 0.1 (each
  step's output fed back as g; 8 chains): the first 1 / 2 / 3 / 4 all right 0.88 / 0.75
  / 0.50 / 0.38 of the time.

Making the 8B pair on 2 cores: the target in 801 s (its 16 GB F16 written in ~75 s, then
quantized; ~21 GB free needed meanwhile), 4,916,139,168 bytes; the head in 31 s,
852,892,768 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from . import synthetic as syn
from .derive import derived_path
from .makeonce import CacheKind, make_once
from .synthetic_hybrid import matrix

Progress = Callable[[str], None]

#: Part of every file name: a change to what is written makes new files.
VERSION = 1
#: The draft vocabulary's size (Llama 3.1 8B's EAGLE3 head: 32,000), at most a quarter
#: of the target's.
DRAFT_VOCAB = 32000
#: Query/key gain of the draft's attention.
ALPHA = 2.0
#: The draft's attn_norm_2 weights: the size of norm(g) in its residual stream.
G_WEIGHT = 0.01
#: The scale of the draft's FFN output.
FFN_DOWN = 0.01
#: The scale of the target's head rows outside the draft vocabulary.
OUT_OF_DRAFT = 0.5
#: The tag of the draft's file in the derived-draft cache.
DRAFT_TAG = f"eagle3-head-v{VERSION}"
_SALT = 0xE3E3
_CACHE = CacheKind("model cache", ModelLoadError, "making")


def shape(key: str) -> syn.Shape:
    """The shape ``key``, which must be a llama one."""
    s = syn.SHAPES[key]
    if s.arch != "llama":
        raise ValueError(f"an EAGLE3 pair needs a llama shape, {key!r} is {s.arch}")
    return s


def kept_dims(s: syn.Shape) -> int:
    """The embedding dimensions the draft's attention carries: kv_heads * head_dim."""
    return min(s.d, s.kv_heads * s.head_dim)


def draft_vocab_size(s: syn.Shape) -> int:
    return min(DRAFT_VOCAB, s.vocab // 4)


def target_layers(s: syn.Shape) -> tuple[int, int, int]:
    """The target layers whose inputs are fused (low, middle, high): llama.cpp's
    converter's default, [2, n // 2, n - 3] ([2, 16, 29] for 32 layers)."""
    ids = (2, s.layers // 2, s.layers - 3)
    return tuple(min(max(i, 0), s.layers - 1) for i in ids)  # type: ignore[return-value]


def draft_ids(s: syn.Shape, seed: int) -> np.ndarray:
    """``d2t``: the draft vocabulary's target ids, ascending: BOS, EOS and a seeded
    random choice of the ordinary pieces (no <unk>, no byte tokens)."""
    rng = np.random.default_rng(seed + _SALT)
    first = 3 + 256  # <unk> <s> </s>, the bytes
    chosen = rng.choice(np.arange(first, s.vocab), size=draft_vocab_size(s) - 2, replace=False)
    return np.concatenate([[1, 2], np.sort(chosen)]).astype(np.int64)


def target_path(key: str, quant: str, early: int, late: float, seed: int) -> Path:
    """Where the EAGLE3-ready synthetic target of these parameters lives (made or not)."""
    plain = syn.synthetic_path(key, quant, early, late, seed)
    return plain.with_name(plain.name.removesuffix(".gguf") + f".eagle3-v{VERSION}.gguf")


# --------------------------------------------------------------------------- writing


def _target_tensors(s: syn.Shape, early: int, late: float, seed: int,
                    dtype: type) -> Iterator[tuple[str, np.ndarray]]:
    kept = kept_dims(s)
    for name, weights in syn._tensors(s, early, late, seed, dtype):
        if name == "token_embd.weight" and kept < s.d:
            weights[:, kept:] = 0
            weights[:, :kept] *= dtype(math.sqrt(s.d / kept))
        elif name == "output.weight":
            outside = np.ones(s.vocab, dtype=bool)
            outside[draft_ids(s, seed)] = False
            step = max(1, (1 << 24) // s.d)
            for i in range(0, s.vocab, step):  # in slices: an 8B's head is 1 GB
                rows = weights[i:i + step]
                rows[outside[i:i + step]] *= dtype(OUT_OF_DRAFT)
        yield name, weights


def _header(writer: Any, s: syn.Shape, ftype: str) -> None:
    import gguf

    writer.add_context_length(s.context)
    writer.add_embedding_length(s.d)
    writer.add_feed_forward_length(s.ff)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_rope_dimension_count(s.head_dim)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "F32"
                         else gguf.LlamaFileType.MOSTLY_F16)


def write_target(path: Path, key: str, *, early: int = 0, late: float = syn.DEFAULT_LATE,
                 seed: int = syn.DEFAULT_SEED, ftype: str = "F16") -> None:
    """Write the EAGLE3-ready synthetic target of shape ``key`` at ``path``, as F16 or
    F32: :func:`.synthetic.write_synthetic`'s model but for its embedding and head."""
    import gguf

    s = shape(key)
    dtype = np.float32 if ftype == "F32" else np.float16
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"synthetic {s.title}")
    writer.add_description(
        f"random weights; layers after the first {early} scaled by {late:g}; seed {seed}; "
        f"embeddings in the first {kept_dims(s)} dimensions and head rows outside an "
        f"EAGLE3 head's {draft_vocab_size(s)}-token vocabulary scaled by {OUT_OF_DRAFT:g}")
    writer.add_string(syn.SYNTHETIC_KEY, syn.sentence(s))
    writer.add_block_count(s.layers)
    _header(writer, s, ftype)
    syn._vocabulary(writer, s.vocab)
    syn.write_tensors(writer, _target_tensors(s, early, late, seed, dtype))


def _draft_tensors(s: syn.Shape, seed: int,
                   dtype: type) -> Iterator[tuple[str, np.ndarray]]:
    ids = draft_ids(s, seed)
    stream = syn._tensors(s, s.layers, 0.0, seed, dtype)  # embedding, head, then layers
    name, _ = next(stream)
    assert name == "token_embd.weight"
    name, head = next(stream)
    assert name == "output.weight"
    del stream  # (a generator: the layers are never drawn)
    head = head[ids]  # rows inside the draft vocabulary: never scaled in the target
    d, hd, kept = s.d, s.head_dim, kept_dims(s)
    group = s.heads // s.kv_heads
    q: np.ndarray = np.zeros((s.heads * hd, 2 * d), dtype=dtype)
    o: np.ndarray = np.zeros((d, s.heads * hd), dtype=dtype)
    for h in range(s.heads):
        kv = h // group
        q[h * hd:(h + 1) * hd, kv * hd:(kv + 1) * hd] = ALPHA * np.eye(hd)
        o[kv * hd:(kv + 1) * hd, h * hd:(h + 1) * hd] = np.eye(hd) / group
    k: np.ndarray = np.zeros((s.kv_heads * hd, 2 * d), dtype=dtype)
    k[:kept, :kept] = ALPHA * np.eye(kept)
    v: np.ndarray = np.zeros((s.kv_heads * hd, 2 * d), dtype=dtype)
    v[:kept, :kept] = np.eye(kept)
    rng = np.random.default_rng(seed + _SALT + 1)
    ones = np.ones(d, dtype=np.float32)
    yield "fc.weight", matrix(rng, d, 3 * d, 1.0, dtype)
    yield "blk.0.attn_norm.weight", ones
    yield "blk.0.attn_norm_2.weight", np.full(d, G_WEIGHT, dtype=np.float32)
    yield "blk.0.attn_q.weight", q
    yield "blk.0.attn_k.weight", k
    yield "blk.0.attn_v.weight", v
    yield "blk.0.attn_output.weight", o
    yield "blk.0.ffn_norm.weight", ones
    yield "blk.0.ffn_gate.weight", matrix(rng, s.ff, d, 1.0, dtype)
    yield "blk.0.ffn_up.weight", matrix(rng, s.ff, d, 1.0, dtype)
    yield "blk.0.ffn_down.weight", matrix(rng, d, s.ff, FFN_DOWN, dtype)
    yield "output_norm.weight", ones
    yield "output.weight", head
    yield "d2t", ids


def write_draft(path: Path, key: str, *, seed: int = syn.DEFAULT_SEED,
                ftype: str = "F16") -> None:
    """Write the EAGLE3 head for the EAGLE3-ready synthetic target of shape ``key`` and
    ``seed`` (whatever its ``early``, ``late`` and quant) at ``path``, as F16 or F32."""
    import gguf

    s = shape(key)
    dtype = np.float32 if ftype == "F32" else np.float16
    writer = gguf.GGUFWriter(path, "eagle3")
    writer.add_name(f"synthetic EAGLE3 head for {s.title}")
    writer.add_description(f"built to agree with the synthetic {s.title} of seed {seed} "
                           "made for it (specllama.models.synthetic_eagle3)")
    writer.add_string(syn.SYNTHETIC_KEY, "an EAGLE3 head for " + syn.sentence(s))
    writer.add_block_count(1)
    _header(writer, s, ftype)
    writer.add_array("eagle3.target_layers", list(target_layers(s)))  # INT32, as it must
    writer.add_uint32("eagle3.target_hidden_size", s.d)
    writer.add_bool("eagle3.norm_before_residual", True)
    syn._vocabulary(writer, s.vocab)
    syn.write_tensors(writer, _draft_tensors(s, seed, dtype))


# --------------------------------------------------------------------------- made once


def make_target(key: str, quant: str, early: int, late: float, seed: int, *,
                n_threads: int | None = None, progress: Progress | None = None) -> Path:
    """The EAGLE3-ready synthetic target of these parameters: written once into
    :func:`target_path` (as F16, then quantized to ``quant``), then reused."""
    shape(key)  # (a shape that is not llama's is refused here)
    return syn.make_synthetic(key, quant, early, late, seed, n_threads=n_threads,
                              progress=progress, write=write_target,
                              dst=target_path(key, quant, early, late, seed),
                              made_for=" for an EAGLE3 head")


def make_draft(target: Path, key: str, seed: int, *,
               progress: Progress | None = None) -> Path:
    """The EAGLE3 head for ``target`` (the file :func:`make_target` made of shape ``key``
    and ``seed``): written once (F16) into the derived-draft cache, then reused."""
    s = shape(key)
    dst = derived_path(target, DRAFT_TAG)
    return make_once(
        dst, lambda tmp: write_draft(tmp, key, seed=seed),
        announce=f"making the EAGLE3 head for {target.name} (F16; once; cached in "
                 f"{dst.parent})",
        invalid=f"making the EAGLE3 head for the synthetic {s.title} produced no valid "
                "GGUF file",
        progress=progress,
    )


__all__ = [
    "DRAFT_TAG", "DRAFT_VOCAB", "draft_ids", "draft_vocab_size", "kept_dims", "make_draft",
    "make_target", "target_layers", "target_path", "write_draft", "write_target",
]
