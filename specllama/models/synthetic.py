"""Synthetic models: random-weight llama GGUF files in the shapes of real laptop models,
so that speculative decoding can be timed at the cost of a real 2-8B target on any
machine, without downloading one. Costs are real; the text is meaningless.

The first ``early`` layers have weights at full scale and the later ones are scaled by
``late``: a draft made of the model's own embeddings, output head and first layers
(``draft = { derive = "target", layers = 2 }``) then agrees with it at a rate ``late``
sets (on a 32-layer random model, a 2-layer draft agreed greedily 89% of the time at
0.07, 81% at 0.1, 61% at 0.15). Every later layer shares one block of weights: what a
layer costs does not depend on its values, and the file is written in seconds.

The file is written once into ``<cache>/synthetic/`` (F16, then quantized by llama.cpp,
the F16 file removed), carrying ``general.name`` and the key :data:`SYNTHETIC_KEY`,
whose sentence every output that uses it repeats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DraftDerivationError, ModelLoadError
from ..paths import cache_dir
from . import synthetic_hybrid as hybrid
from .makeonce import CacheKind, make_once

#: The metadata key holding the sentence that says a model is synthetic.
SYNTHETIC_KEY = "specllama.synthetic"
#: Part of every file name: a change to what is written makes new files.
GENERATOR_VERSION = 1
DEFAULT_QUANT = "Q4_K_M"
DEFAULT_EARLY = 2
DEFAULT_LATE = 0.1
DEFAULT_SEED = 0
#: The weight scale of the first ``early`` layers (the later ones get ``late``).
EARLY_SCALE = 0.5
#: The output head's scale: logits of a few units, so sampling at T = 1 is not greedy.
HEAD_SCALE = 4.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Shape:
    """The dimensions of a real model (llama architecture unless `arch` says otherwise;
    an untied output head)."""

    title: str  # the model it has the shape of, in words
    d: int  # embedding length
    layers: int
    ff: int  # feed-forward length
    heads: int
    kv_heads: int
    vocab: int
    context: int = 4096
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    # hybrid layouts (synthetic_hybrid.py): "qwen35" or "lfm2"
    arch: str = "llama"
    head_dim_: int = 0  # 0: d / heads
    attn_every: int = 0  # qwen35: gated attention every this many layers
    attn_layers: tuple[int, ...] = ()  # lfm2: the attention layers (the rest convolve)
    ssm: tuple[int, int, int] = (0, 0, 0)  # qwen35 delta-net: head size, k heads, v heads
    mtp: int = 0  # MTP ("nextn") layers after the trunk

    @property
    def head_dim(self) -> int:
        return self.head_dim_ or self.d // self.heads

    @property
    def params(self) -> int:
        """Weights in the file: embeddings, output head and every layer's matrices."""
        kv = self.kv_heads * (self.d // self.heads)
        block = 2 * self.d * self.d + 2 * kv * self.d + 3 * self.d * self.ff
        return 2 * self.vocab * self.d + self.layers * block


SHAPES: dict[str, Shape] = {
    "llama3.1-8b": Shape("Llama 3.1 8B", 4096, 32, 14336, 32, 8, 128256,
                         context=131072, rope_base=500000.0),
    "qwen2.5-7b": Shape("Qwen2.5 7B", 3584, 28, 18944, 28, 4, 152064,
                        context=32768, rope_base=1000000.0, rms_eps=1e-6),
    "smollm2-1.7b": Shape("SmolLM2 1.7B", 2048, 24, 8192, 32, 32, 49152,
                          context=8192, rope_base=130000.0),
    # Qwen3.5's layout (3 gated delta-net layers to 1 gated attention layer, head size
    # 256, a quarter rotated, 248k vocabulary, one MTP layer) at a size 2 cores run: not
    # a released model's exact dimensions.
    "qwen3.5-2b": Shape("Qwen3.5-layout 2B", 2048, 24, 6144, 8, 2, 248320,
                        context=262144, rope_base=1e7, rms_eps=1e-6, arch="qwen35",
                        head_dim_=256, attn_every=4, ssm=(128, 16, 16), mtp=1),
    # Qwen3.5 9B's dimensions, to price its MTP layer against its trunk.
    "qwen3.5-9b": Shape("Qwen3.5-layout 9B", 4096, 32, 12288, 16, 4, 248320,
                        context=262144, rope_base=1e7, rms_eps=1e-6, arch="qwen35",
                        head_dim_=256, attn_every=4, ssm=(128, 16, 32), mtp=1),
    "lfm2-1.2b": Shape("LFM2 1.2B", 2048, 16, 8192, 32, 8, 65536, context=128000,
                       rope_base=1e6, arch="lfm2", attn_layers=(2, 5, 8, 10, 12, 14)),
    "lfm2-350m": Shape("LFM2 350M", 1024, 16, 4608, 16, 8, 65536, context=128000,
                       rope_base=1e6, arch="lfm2", attn_layers=(2, 5, 8, 10, 12, 14)),
    # For tests: written in milliseconds.
    "tiny": Shape("Tiny (test)", 128, 8, 384, 4, 2, 1024, context=2048),
    "tiny-qwen3.5": Shape("Tiny Qwen3.5 layout (test)", 128, 4, 384, 4, 2, 1024,
                          context=2048, rope_base=1e7, rms_eps=1e-6, arch="qwen35",
                          head_dim_=32, attn_every=4, ssm=(16, 2, 4), mtp=1),
    "tiny-lfm2": Shape("Tiny LFM2 layout (test)", 128, 4, 384, 4, 2, 1024, context=2048,
                       arch="lfm2", attn_layers=(2,)),
}

# Bits per weight of each quantization, roughly (for the size a message announces).
_BITS = {"F32": 32.0, "F16": 16.0, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_1": 6.0, "Q5_0": 5.5,
         "Q4_1": 5.0, "Q4_K_M": 4.9, "Q4_0": 4.5, "IQ4_NL": 4.5}
_CACHE = CacheKind("model cache", ModelLoadError, "making")


def sentence(shape: Shape) -> str:
    """What the file says of itself (:data:`SYNTHETIC_KEY`), and every output repeats."""
    return f"random weights in the shape of {shape.title}: costs are real, the text is meaningless"


def approx_size(shape: Shape, quant: str) -> str:
    """The file's size, roughly, in words: "~1.1 GB", "~2 MB"."""
    size = shape.params * _BITS.get(quant, 16.0) / 8
    return f"~{size / 1e9:.1f} GB" if size >= 1e9 else f"~{size / 1e6:.0f} MB"


def synthetic_path(key: str, quant: str, early: int, late: float, seed: int) -> Path:
    """Where the synthetic model of these parameters lives (made or not)."""
    name = f"{key}.{quant}.early{early}.late{late:g}.seed{seed}.v{GENERATOR_VERSION}.gguf"
    return cache_dir() / "synthetic" / name


# --------------------------------------------------------------------------- writing


def _block(rng: np.random.Generator, s: Shape, scale: float, dtype: type) -> dict[str, Any]:
    kv = s.kv_heads * (s.d // s.heads)
    rows = {"attn_q": (s.d, s.d), "attn_k": (kv, s.d), "attn_v": (kv, s.d),
            "attn_output": (s.d, s.d), "ffn_gate": (s.ff, s.d), "ffn_up": (s.ff, s.d),
            "ffn_down": (s.d, s.ff)}
    return {k: hybrid.matrix(rng, r, c, scale, dtype) for k, (r, c) in rows.items()}


def _tensors(s: Shape, early: int, late: float, seed: int,
             dtype: type) -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ones = np.ones(s.d, dtype=np.float32)
    yield "token_embd.weight", hybrid.matrix(rng, s.vocab, s.d, math.sqrt(s.d), dtype)
    yield "output.weight", hybrid.matrix(rng, s.vocab, s.d, HEAD_SCALE, dtype)
    yield "output_norm.weight", ones
    blocks = [_block(rng, s, EARLY_SCALE, dtype) for _ in range(min(early, s.layers))]
    if early < s.layers:
        blocks.append(_block(rng, s, late, dtype))  # shared by every later layer
    for i in range(s.layers):
        yield f"blk.{i}.attn_norm.weight", ones
        yield f"blk.{i}.ffn_norm.weight", ones
        for name, weights in blocks[min(i, early)].items():
            yield f"blk.{i}.{name}.weight", weights


def _vocabulary(writer: Any, vocab: int) -> None:
    """A SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then "▁t{i}"."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def write_synthetic(path: Path, key: str, *, early: int = DEFAULT_EARLY,
                    late: float = DEFAULT_LATE, seed: int = DEFAULT_SEED,
                    ftype: str = "F16") -> None:
    """Write the synthetic model of shape ``key`` at ``path``, as F16 or F32 (``ftype``),
    the same bytes for the same arguments."""
    import gguf

    s = SHAPES[key]
    dtype = np.float32 if ftype == "F32" else np.float16
    writer = gguf.GGUFWriter(path, s.arch)
    writer.add_name(f"synthetic {s.title}")
    writer.add_description(f"random weights; layers after the first {early} scaled by {late:g}; "
                           f"seed {seed}")
    writer.add_string(SYNTHETIC_KEY, sentence(s))
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.d)
    writer.add_feed_forward_length(s.ff)
    writer.add_head_count(s.heads)
    if s.arch == "llama":
        writer.add_block_count(s.layers)
        writer.add_head_count_kv(s.kv_heads)
        writer.add_rope_dimension_count(s.d // s.heads)
    else:
        hybrid.hparams(writer, s)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "F32"
                         else gguf.LlamaFileType.MOSTLY_F16)
    _vocabulary(writer, s.vocab)
    made = _tensors(s, early, late, seed, dtype) if s.arch == "llama" else \
        hybrid.tensors(s, early, late, seed, EARLY_SCALE, HEAD_SCALE, dtype)
    write_tensors(writer, made)


def write_tensors(writer: Any, made: Iterator[tuple[str, np.ndarray]]) -> None:
    """The tensors, then the whole file (a gguf.GGUFWriter's header written last)."""
    for name, weights in made:
        writer.add_tensor(name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --------------------------------------------------------------------------- made once


def _quantize(src: Path, dst: Path, quant: str, n_threads: int | None) -> None:
    from ..engine.llama import quantize  # only making one loads llama.cpp

    quantize(src, dst, quant, n_threads)


def make_synthetic(key: str, quant: str, early: int, late: float, seed: int, *,
                   n_threads: int | None = None, progress: Progress | None = None,
                   write: Callable[..., None] | None = None, dst: Path | None = None,
                   made_for: str = "") -> Path:
    """The synthetic model of these parameters: written once into
    :func:`synthetic_path` (as F16, then quantized to ``quant``), then reused. ``write``
    and ``dst``: another writer of the same arguments and its file (synthetic_eagle3's
    target, ``made_for`` an EAGLE3 head)."""
    s = SHAPES[key]
    dst = dst or synthetic_path(key, quant, early, late, seed)
    write = write or write_synthetic

    def make(tmp: Path) -> None:
        if quant in ("F16", "F32"):
            write(tmp, key, early=early, late=late, seed=seed, ftype=quant)
            return
        raw = tmp.with_suffix(".f16.part")  # beside it: a killed run's is cleaned up too
        try:
            write(raw, key, early=early, late=late, seed=seed)
            _quantize(raw, tmp, quant, n_threads)
        except DraftDerivationError as exc:
            raise ModelLoadError(f"making the synthetic {s.title} model failed: {exc}") from exc
        finally:
            raw.unlink(missing_ok=True)

    return make_once(
        dst, make,
        announce=f"making a synthetic {s.title} model{made_for} (random weights, {quant}, "
                 f"{approx_size(s, quant)}; once, cached in {dst.parent})",
        invalid=f"making the synthetic {s.title} model produced no valid GGUF file",
        progress=progress, kind=_CACHE,
    )
