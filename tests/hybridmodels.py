"""Tiny random-weight GGUF models of llama.cpp's hybrid and sliding-window architectures.

Companions to ``tinymodels.write_tiny_model`` for the memory kinds a plain ``llama`` model
does not have, each a few hundred KiB of F32 tensors that real llama.cpp loads in
milliseconds, all with vocabulary "a" of tinymodels (SPM "llama" tokenizer, BOS 1, EOS 2,
EOT 4 ``<|im_end|>``, ChatML template):

* ``write_tiny_qwen35``: ``qwen35`` (Qwen3.5), gated delta-net (recurrent) layers with a
  full-attention layer every ``full_attention_interval``; ``mtp=True`` appends one MTP
  ("nextn") block, which llama.cpp loads only with ``load_mtp`` set in the model params
  (without it the file still loads, but a ``LLAMA_CONTEXT_TYPE_MTP`` context aborts).
* ``write_tiny_lfm2``: ``lfm2``, short-convolution (recurrent) layers mixed with attention
  layers; the per-layer ``attention.head_count_kv`` array says which is which (0 = conv).
* ``write_tiny_gemma3``: ``gemma3``, sliding-window attention layers (window
  ``sliding_window``) alternating with global ones.
* ``write_tiny_gemma4_pair``: a ``gemma4`` target (sliding and global layers alternating,
  the last global) and a ``gemma4-assistant`` drafter for it, two layers of half its
  width that read the target's last two layers' KV cache.

As in tinymodels, the weights are a deterministic function of ``seed``; ``noise`` perturbs
every tensor ``W`` into ``W + noise * rms(W) * N(0, 1)`` (draws from ``noise_seed``), so a
noisy copy of a target is a draft that mostly agrees with it, and ``noise=0`` reproduces
the target's weights byte for byte. These models are deeper and their recurrent paths more
sensitive than the 2-layer llama: measured on random token sequences (410 positions), noise
0.02 / 0.03 / 0.05 gives argmax agreement ~0.73-0.81 / ~0.63-0.75 / ~0.45-0.63 (0.3: ~0.06),
where tinymodels' llama needs 0.05 for ~0.72.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tinymodels import DEFAULT_LOGIT_SCALE, finish_with_vocab_a, vocab_pieces

__all__ = ["write_tiny_gemma3", "write_tiny_gemma4_pair", "write_tiny_lfm2",
           "write_tiny_qwen35"]

_N_EMBD, _N_HEAD, _N_HEAD_KV, _HEAD_DIM, _N_FF = 64, 4, 2, 16, 128
# Gain of the q/k norm weights: q and k are RMS-normalised per head in all three
# architectures, so this (squared) sets how peaked attention is => real context dependence.
_QK_GAIN = 1.5
# gguf TokenType values (gguf.TokenType) of the tokens whose logits are flattened.
_UNKNOWN, _CONTROL, _BYTE = 2, 3, 6


def _mat(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    """A (n_out, n_in) numpy matrix = ggml {n_in, n_out}, keeping activations ~unit RMS."""
    return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))


def _embedding(rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    n_vocab = len(vocab_pieces("a"))
    return {"token_embd.weight": rng.standard_normal((n_vocab, _N_EMBD)) * scale}


def _head(rng: np.random.Generator, norm_name: str = "output_norm.weight") -> dict:
    """Final norm + output head scaled like tinymodels (top token p ~0.1-0.6 at T=1), with
    byte and control tokens flattened so sampled text is mostly ordinary pieces."""
    types = np.array([e[2] for e in vocab_pieces("a")])
    out = _mat(rng, len(types), _N_EMBD, DEFAULT_LOGIT_SCALE)
    out[np.isin(types, (_BYTE, _CONTROL, _UNKNOWN))] *= 0.5
    return {norm_name: np.ones(_N_EMBD), "output.weight": out}


def _attention(rng: np.random.Generator, p: str, n_q: int, n_head_kv: int) -> dict:
    """q/k/v/o projections and per-head q/k norms of one attention layer (prefix ``p``);
    ``n_q`` is the width of attn_q (Qwen3.5 packs a gate next to each query head)."""
    kv = _HEAD_DIM * n_head_kv
    return {
        p + "attn_q.weight": _mat(rng, n_q, _N_EMBD),
        p + "attn_k.weight": _mat(rng, kv, _N_EMBD),
        p + "attn_v.weight": _mat(rng, kv, _N_EMBD),
        p + "attn_output.weight": _mat(rng, _N_EMBD, _HEAD_DIM * _N_HEAD),
        p + "attn_q_norm.weight": np.full(_HEAD_DIM, _QK_GAIN),
        p + "attn_k_norm.weight": np.full(_HEAD_DIM, _QK_GAIN),
    }


def _ffn(rng: np.random.Generator, p: str) -> dict:
    return {
        p + "ffn_gate.weight": _mat(rng, _N_FF, _N_EMBD),
        p + "ffn_up.weight": _mat(rng, _N_FF, _N_EMBD),
        p + "ffn_down.weight": _mat(rng, _N_EMBD, _N_FF),
    }


def _write(path: str | Path, arch: str, name: str, hparams: dict, weights: dict,
           *, noise: float, noise_seed: int) -> Path:
    """Perturb ``weights`` by ``noise``, then write them with ``hparams`` (keys without the
    ``{arch}.`` prefix; int -> uint32, float -> float32, list -> array) and vocabulary "a"."""
    import gguf  # test-only dependency

    if noise > 0:
        nrng = np.random.default_rng(noise_seed)
        for k, v in weights.items():
            rms = float(np.sqrt(np.mean(v * v)))
            weights[k] = v + noise * rms * nrng.standard_normal(v.shape)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = vocab_pieces("a")
    g = gguf.GGUFWriter(str(path), arch)
    g.add_string("general.name", f"{name}-n{noise:g}")
    g.add_uint32("general.file_type", 0)  # ALL_F32
    base = {"vocab_size": len(entries), "context_length": 4096, "embedding_length": _N_EMBD,
            "attention.layer_norm_rms_epsilon": 1e-6}
    for key, value in {**base, **hparams}.items():
        if isinstance(value, list):
            g.add_array(f"{arch}.{key}", value)  # ints go in as INT32: the loader takes that
        elif isinstance(value, float):
            g.add_float32(f"{arch}.{key}", value)
        else:
            g.add_uint32(f"{arch}.{key}", value)
    finish_with_vocab_a(g, weights)
    return path


def write_tiny_qwen35(path: str | Path, *, seed: int = 0, noise: float = 0.0,
                      noise_seed: int = 1, n_layer: int = 4, mtp: bool = False,
                      mtp_agrees: float | None = None, recurrent_gain: float = 1.0) -> Path:
    """A tiny ``qwen35`` (Qwen3.5) model: with the default 4 layers, three gated delta-net
    layers then one full-attention layer (gated queries, q/k norms, IMRoPE). ``mtp=True``
    adds the MTP block ``blk.{n_layer}`` (``nextn_predict_layers = 1``); it shares the main
    embedding and output head (no ``nextn.embed_tokens`` / ``shared_head_head``).

    A random MTP block never agrees with its target. ``mtp_agrees`` (a noise level, 0 for
    none) builds one that does: a copy of the last attention layer, fed the token's
    embedding alone (``eh_proj = [I | 0]``), plus that relative noise; with the recurrent
    layers' outputs scaled by ``recurrent_gain`` (0.05, say) the trunk is nearly that one
    layer, so the block predicts the next token much as the target does."""
    interval = min(4, n_layer)  # Qwen3.5's 3:1 ratio, but never without an attention layer
    d_conv, d_state, n_k_heads, n_v_heads = 4, 16, 2, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    rng = np.random.default_rng(seed)
    w = _embedding(rng)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(_N_EMBD)
        w[p + "post_attention_norm.weight"] = np.ones(_N_EMBD)  # the FFN's input norm
        if (i + 1) % interval:  # linear attention (gated delta net)
            w[p + "attn_qkv.weight"] = _mat(rng, 2 * key_dim + value_dim, _N_EMBD)
            w[p + "attn_gate.weight"] = _mat(rng, value_dim, _N_EMBD)  # z, output gate
            w[p + "ssm_conv1d.weight"] = rng.standard_normal((2 * key_dim + value_dim,
                                                              d_conv)) * 0.5
            # Decay per token is exp(softplus(alpha + dt) * a): heads remembering from ~1
            # to ~10 tokens, so the state carries real context without washing it out.
            w[p + "ssm_dt.bias"] = np.zeros(n_v_heads)
            w[p + "ssm_a"] = -np.linspace(0.15, 1.5, n_v_heads)
            w[p + "ssm_beta.weight"] = _mat(rng, n_v_heads, _N_EMBD)
            w[p + "ssm_alpha.weight"] = _mat(rng, n_v_heads, _N_EMBD)
            w[p + "ssm_norm.weight"] = np.ones(d_state)
            w[p + "ssm_out.weight"] = _mat(rng, _N_EMBD, value_dim) * recurrent_gain
            w.update(_ffn(rng, p))
            w[p + "ffn_down.weight"] *= recurrent_gain
        else:
            w.update(_attention(rng, p, 2 * _HEAD_DIM * _N_HEAD, _N_HEAD_KV))
            w.update(_ffn(rng, p))
    w.update(_head(rng))
    if mtp:  # drawn last, so the trunk and head are those of the same seed without MTP
        p = f"blk.{n_layer}."  # a full-attention block fed by eh_proj(enorm(e), hnorm(h))
        w[p + "attn_norm.weight"] = np.ones(_N_EMBD)
        w[p + "post_attention_norm.weight"] = np.ones(_N_EMBD)
        w.update(_attention(rng, p, 2 * _HEAD_DIM * _N_HEAD, _N_HEAD_KV))
        w.update(_ffn(rng, p))
        w[p + "nextn.eh_proj.weight"] = _mat(rng, _N_EMBD, 2 * _N_EMBD)
        w[p + "nextn.enorm.weight"] = np.ones(_N_EMBD)
        w[p + "nextn.hnorm.weight"] = np.ones(_N_EMBD)
        w[p + "nextn.shared_head_norm.weight"] = np.ones(_N_EMBD)
        if mtp_agrees is not None:
            last = f"blk.{n_layer - 1}."
            mrng = np.random.default_rng(seed + 7919)
            for name in [k for k in w if k.startswith(last)]:
                v = w[name]
                w[p + name[len(last):]] = v + mtp_agrees * np.sqrt(np.mean(v * v)) \
                    * mrng.standard_normal(v.shape)
            w[p + "nextn.eh_proj.weight"] = np.hstack([np.eye(_N_EMBD),
                                                       np.zeros((_N_EMBD, _N_EMBD))])
    hparams = {
        "block_count": n_layer + int(mtp), "feed_forward_length": _N_FF,
        "attention.head_count": _N_HEAD, "attention.head_count_kv": _N_HEAD_KV,
        "attention.key_length": _HEAD_DIM, "attention.value_length": _HEAD_DIM,
        # partial rotary (half the head; Qwen3.5 rotates a quarter) split into IMRoPE
        # sections, which the loader requires even for text-only use
        "rope.dimension_count": _HEAD_DIM // 2, "rope.dimension_sections": [2, 1, 1, 0],
        "rope.freq_base": 1e7, "full_attention_interval": interval,
        "ssm.conv_kernel": d_conv, "ssm.state_size": d_state, "ssm.group_count": n_k_heads,
        "ssm.time_step_rank": n_v_heads, "ssm.inner_size": value_dim,
    }
    if mtp:
        hparams["nextn_predict_layers"] = 1
    return _write(path, "qwen35", f"tiny-qwen35-s{seed}{'-mtp' if mtp else ''}", hparams, w,
                  noise=noise, noise_seed=noise_seed)


def write_tiny_lfm2(path: str | Path, *, seed: int = 0, noise: float = 0.0,
                    noise_seed: int = 1, n_layer: int = 4) -> Path:
    """A tiny ``lfm2`` model: gated short-convolution layers (kernel 3) with an attention
    layer every third (conv, conv, attn, conv for 4 layers; the last one when fewer)."""
    l_cache = 3
    attn = [i % 3 == 2 or (n_layer < 3 and i == n_layer - 1) for i in range(n_layer)]
    rng = np.random.default_rng(seed)
    w = _embedding(rng)
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(_N_EMBD)  # "operator norm", for both kinds
        if attn[i]:
            w.update(_attention(rng, p, _HEAD_DIM * _N_HEAD, _N_HEAD_KV))
        else:  # y = C * conv(B * x), with B, C, x from in_proj
            w[p + "shortconv.in_proj.weight"] = _mat(rng, 3 * _N_EMBD, _N_EMBD)
            w[p + "shortconv.conv.weight"] = rng.standard_normal((_N_EMBD, l_cache)) * 0.6
            w[p + "shortconv.out_proj.weight"] = _mat(rng, _N_EMBD, _N_EMBD)
        w[p + "ffn_norm.weight"] = np.ones(_N_EMBD)
        w.update(_ffn(rng, p))
    w.update(_head(rng, norm_name="token_embd_norm.weight"))  # LFM2's name for output_norm
    hparams = {
        "block_count": n_layer, "feed_forward_length": _N_FF,
        "attention.head_count": _N_HEAD,
        # must be an array: 0 marks a short-conv layer (the loader's only layer-kind signal)
        "attention.head_count_kv": [_N_HEAD_KV if a else 0 for a in attn],
        "rope.freq_base": 1e6, "shortconv.l_cache": l_cache,
    }
    return _write(path, "lfm2", f"tiny-lfm2-s{seed}", hparams, w,
                  noise=noise, noise_seed=noise_seed)


def write_tiny_gemma3(path: str | Path, *, seed: int = 0, noise: float = 0.0,
                      noise_seed: int = 1, sliding_window: int = 8, n_layer: int = 4) -> Path:
    """A tiny ``gemma3`` model whose even layers attend only to the last ``sliding_window``
    positions (own rope base) and odd layers to everything (Gemma 3 has 5 local : 1
    global; 1 : 1 keeps both kinds in a 2-layer model)."""
    rng = np.random.default_rng(seed)
    # Gemma scales the embeddings by sqrt(n_embd): keep the residual stream ~unit RMS so
    # the (post-normed, unit RMS) attention outputs are not drowned by the token itself.
    w = _embedding(rng, scale=1.0 / np.sqrt(_N_EMBD))
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(_N_EMBD)
        w.update(_attention(rng, p, _HEAD_DIM * _N_HEAD, _N_HEAD_KV))
        w[p + "post_attention_norm.weight"] = np.ones(_N_EMBD)
        w[p + "ffn_norm.weight"] = np.ones(_N_EMBD)
        w.update(_ffn(rng, p))
        w[p + "post_ffw_norm.weight"] = np.ones(_N_EMBD)
    w.update(_head(rng))
    hparams = {
        "block_count": n_layer, "feed_forward_length": _N_FF,
        "attention.head_count": _N_HEAD, "attention.head_count_kv": _N_HEAD_KV,
        "attention.key_length": _HEAD_DIM, "attention.value_length": _HEAD_DIM,
        "attention.sliding_window": sliding_window,
        # scalar n: layer il is sliding iff il % n < n - 1 (the loader's default is 6)
        "attention.sliding_window_pattern": 2,
        "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
    }
    return _write(path, "gemma3", f"tiny-gemma3-s{seed}-w{sliding_window}", hparams, w,
                  noise=noise, noise_seed=noise_seed)



def _gemma4_shapes(n_layer: int, sliding_window: int) -> dict:
    """The attention shapes a Gemma 4 assistant must share with its target: layer il
    slides iff il is even, so with an even n_layer the last layer is global and the one
    before it sliding (the two whose cache the assistant reads)."""
    return {
        "block_count": n_layer,
        "attention.head_count": _N_HEAD, "attention.head_count_kv": _N_HEAD_KV,
        "attention.key_length": _HEAD_DIM, "attention.value_length": _HEAD_DIM,
        "attention.key_length_swa": _HEAD_DIM, "attention.value_length_swa": _HEAD_DIM,
        "attention.sliding_window": sliding_window,
        "attention.sliding_window_pattern": [i % 2 == 0 for i in range(n_layer)],
        "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
    }


def _gemma4_layer(rng: np.random.Generator, p: str, n_embd: int, gain: float,
                  kv: bool) -> dict:
    """One Gemma 4 layer; `gain` (the post-norm weights) sets how much attention and
    the FFN add to the residual stream; an assistant's layers (kv False) only query."""
    w = {p + "attn_norm.weight": np.ones(n_embd),
         p + "attn_q.weight": _mat(rng, _HEAD_DIM * _N_HEAD, n_embd),
         p + "attn_output.weight": _mat(rng, n_embd, _HEAD_DIM * _N_HEAD),
         p + "attn_q_norm.weight": np.full(_HEAD_DIM, _QK_GAIN),
         p + "post_attention_norm.weight": np.full(n_embd, gain),
         p + "layer_output_scale.weight": np.ones(1),
         p + "ffn_norm.weight": np.ones(n_embd),
         p + "ffn_gate.weight": _mat(rng, 2 * n_embd, n_embd),
         p + "ffn_up.weight": _mat(rng, 2 * n_embd, n_embd),
         p + "ffn_down.weight": _mat(rng, n_embd, 2 * n_embd),
         p + "post_ffw_norm.weight": np.full(n_embd, gain)}
    if kv:
        kv_width = _HEAD_DIM * _N_HEAD_KV
        w.update({p + "attn_k.weight": _mat(rng, kv_width, n_embd),
                  p + "attn_v.weight": _mat(rng, kv_width, n_embd),
                  p + "attn_k_norm.weight": np.full(_HEAD_DIM, _QK_GAIN)})
    return w


def write_tiny_gemma4_pair(target: str | Path, assistant: str | Path, *, seed: int = 0,
                           gain: float = 1.0, sliding_window: int = 8) -> tuple[Path, Path]:
    """A tiny ``gemma4`` target (4 layers, no per-layer inputs, no experts) and a
    ``gemma4-assistant`` for it (2 layers of half its width, reading the target's last
    two layers' cache).

    The assistant reads the target's (scaled) embedding of each token through the half
    of its input projection that takes it, and its tied output head is the target's
    through that projection: the target's head is the assistant's times the projection
    (rank 32). So as `gain` (how much each layer's attention and FFN add) goes to 0,
    both tend to the same bigram model and the drafts are accepted; at 1 they disagree."""
    rng = np.random.default_rng(seed)
    n_vocab, half = len(vocab_pieces("a")), _N_EMBD // 2
    w = _embedding(rng, scale=1.0 / np.sqrt(_N_EMBD))
    for i in range(4):
        w.update(_gemma4_layer(rng, f"blk.{i}.", _N_EMBD, gain, kv=True))
    w["rope_freqs.weight"] = np.ones(_HEAD_DIM // 2)  # the global layers' rope factors
    w["output_norm.weight"] = np.ones(_N_EMBD)
    # the projection: orthonormal rows keep rms(P x) ~ rms(x), so the logits match
    proj = np.linalg.qr(rng.standard_normal((_N_EMBD, half)))[0].T * np.sqrt(2.0)
    head = _head(rng)["output.weight"][:, :half] * np.sqrt(2.0)  # (n_vocab, half)
    w["output.weight"] = head @ proj / np.sqrt(2.0)
    a = {"token_embd.weight": head, "output_norm.weight": np.ones(half),
         "nextn.pre_projection.weight": np.hstack([proj, np.zeros((half, _N_EMBD))]),
         "nextn.post_projection.weight": _mat(rng, _N_EMBD, half),
         "rope_freqs.weight": np.ones(_HEAD_DIM // 2)}
    for i in range(2):
        a.update(_gemma4_layer(rng, f"blk.{i}.", half, gain, kv=False))
    assert a["token_embd.weight"].shape == (n_vocab, half)
    t_path = _write(target, "gemma4", f"tiny-gemma4-s{seed}-g{gain:g}",
                    {**_gemma4_shapes(4, sliding_window), "feed_forward_length": 2 * _N_EMBD,
                     "embedding_length_per_layer_input": 0}, w, noise=0.0, noise_seed=1)
    a_path = _write(assistant, "gemma4-assistant", f"tiny-gemma4-assistant-s{seed}-g{gain:g}",
                    {**_gemma4_shapes(2, sliding_window), "embedding_length": half,
                     "embedding_length_out": _N_EMBD, "nextn_predict_layers": 2,
                     "feed_forward_length": 2 * half}, a, noise=0.0, noise_seed=1)
    return t_path, a_path
