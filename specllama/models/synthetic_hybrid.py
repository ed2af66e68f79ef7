"""Synthetic hybrid models: random weights in the layouts of Qwen3.5 (gated delta-net
layers with gated attention every fourth layer, and an MTP layer) and LFM2 (short
convolutions with a few attention layers), for synthetic.py. Costs are real (llama.cpp
runs the same kernels and keeps the same recurrent states); the text is meaningless.

The MTP layer is built to agree with its target rather than at random: its input
projection passes the token's embedding through (`eh_proj = [I | 0]`) and its own layer
is scaled like the trunk's later ones, so with those small the target and its MTP layer
both compute nearly the same map from the current token to the next. How near is set by
the source's `late` (and `early`): at `early = 0` the trunk is all scaled layers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .synthetic import Shape

#: Gated delta-net kernel length, and LFM2's short-convolution length.
CONV = 4
L_CACHE = 3


def matrix(rng: np.random.Generator, rows: int, cols: int, scale: float,
           dtype: type) -> np.ndarray:
    """rows x cols of N(0, 1) * scale / sqrt(cols), filled in slices (an 8B's embedding
    would take 2 GB at once in float32)."""
    out: np.ndarray = np.empty((rows, cols), dtype=dtype)
    step = max(1, (1 << 24) // cols)
    for i in range(0, rows, step):
        n = min(step, rows - i)
        out[i:i + n] = rng.standard_normal((n, cols), dtype=np.float32) * (scale / math.sqrt(cols))
    return out


def _attention(s: Shape, gated: bool) -> dict[str, tuple[int, int]]:
    q = s.head_dim * s.heads
    kv = s.head_dim * s.kv_heads
    return {"attn_q": ((2 if gated else 1) * q, s.d), "attn_k": (kv, s.d),
            "attn_v": (kv, s.d), "attn_output": (s.d, q)}


def _ffn(s: Shape) -> dict[str, tuple[int, int]]:
    return {"ffn_gate": (s.ff, s.d), "ffn_up": (s.ff, s.d), "ffn_down": (s.d, s.ff)}


def _delta_net(s: Shape) -> dict[str, tuple[int, int]]:
    state, k_heads, v_heads = s.ssm
    key, value = state * k_heads, state * v_heads
    return {"attn_qkv": (2 * key + value, s.d), "attn_gate": (value, s.d),
            "ssm_beta": (v_heads, s.d), "ssm_alpha": (v_heads, s.d),
            "ssm_out": (s.d, value)}


def _short_conv(s: Shape) -> dict[str, tuple[int, int]]:
    return {"shortconv.in_proj": (3 * s.d, s.d), "shortconv.out_proj": (s.d, s.d)}


def _is_attention(s: Shape, i: int) -> bool:
    if s.arch == "qwen35":
        return (i + 1) % s.attn_every == 0
    return i in s.attn_layers


def _kind_weights(s: Shape, attention: bool) -> dict[str, tuple[int, int]]:
    mixer = _attention(s, s.arch == "qwen35") if attention else \
        _delta_net(s) if s.arch == "qwen35" else _short_conv(s)
    return {**mixer, **_ffn(s)}


def _small(s: Shape, attention: bool) -> dict[str, np.ndarray]:
    """The vectors of one layer (norms, the recurrent dynamics' constants)."""
    ones = np.ones(s.d, dtype=np.float32)
    if attention:
        head = np.ones(s.head_dim, dtype=np.float32)
        out = {"attn_q_norm": head, "attn_k_norm": head}
    elif s.arch == "qwen35":
        state, k_heads, v_heads = s.ssm
        width = 2 * state * k_heads + state * v_heads
        rng = np.random.default_rng(7)
        out = {"ssm_conv1d": (rng.standard_normal((width, CONV)) * 0.5).astype(np.float32),
               "ssm_dt.bias": np.zeros(v_heads, dtype=np.float32),
               "ssm_a": -np.linspace(0.15, 1.5, v_heads, dtype=np.float32),
               "ssm_norm": np.ones(state, dtype=np.float32)}
    else:
        rng = np.random.default_rng(7)
        out = {"shortconv.conv": (rng.standard_normal((s.d, L_CACHE)) * 0.6).astype(np.float32)}
    norms = {"attn_norm": ones, "post_attention_norm" if s.arch == "qwen35" else "ffn_norm": ones}
    return {**out, **norms}


def tensors(s: Shape, early: int, late: float, seed: int, early_scale: float,
            head_scale: float, dtype: type) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor of the file; each kind's later layers share one set of matrices."""
    rng = np.random.default_rng(seed)
    yield "token_embd.weight", matrix(rng, s.vocab, s.d, math.sqrt(s.d), dtype)
    yield "output.weight", matrix(rng, s.vocab, s.d, head_scale, dtype)
    yield ("output_norm.weight" if s.arch == "qwen35" else "token_embd_norm.weight",
           np.ones(s.d, dtype=np.float32))
    shared: dict[bool, dict[str, np.ndarray]] = {}
    for i in range(s.layers):
        attention = _is_attention(s, i)
        if i < early:
            mats = {k: matrix(rng, r, c, early_scale, dtype)
                    for k, (r, c) in _kind_weights(s, attention).items()}
        else:
            if attention not in shared:
                shared[attention] = {k: matrix(rng, r, c, late, dtype)
                                     for k, (r, c) in _kind_weights(s, attention).items()}
            mats = shared[attention]
        for name, w in {**mats, **_small(s, attention)}.items():
            suffix = "" if name.endswith((".bias", "ssm_a")) else ".weight"
            yield f"blk.{i}.{name}{suffix}", w
    for j in range(s.mtp):  # after the trunk: blk.{layers + j}
        p = f"blk.{s.layers + j}."
        mats = shared.get(True) or {k: matrix(rng, r, c, late, dtype)
                                    for k, (r, c) in _kind_weights(s, True).items()}
        for name, w in {**mats, **_small(s, True)}.items():
            yield f"{p}{name}.weight", w
        eh: np.ndarray = np.zeros((s.d, 2 * s.d), dtype=dtype)
        eh[:, : s.d] = np.eye(s.d, dtype=dtype)  # the token's embedding, passed through
        yield f"{p}nextn.eh_proj.weight", eh
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            yield f"{p}nextn.{norm}.weight", np.ones(s.d, dtype=np.float32)


def hparams(writer: Any, s: Shape) -> None:
    """The architecture's own keys (the common ones are synthetic.py's)."""
    arch = s.arch
    if arch == "qwen35":
        state, k_heads, v_heads = s.ssm
        rot = s.head_dim // 4  # Qwen3.5 rotates a quarter of each head (IMRoPE)
        half = rot // 2
        writer.add_uint32(f"{arch}.block_count", s.layers + s.mtp)
        writer.add_uint32(f"{arch}.nextn_predict_layers", s.mtp)
        writer.add_uint32(f"{arch}.full_attention_interval", s.attn_every)
        writer.add_uint32(f"{arch}.attention.key_length", s.head_dim)
        writer.add_uint32(f"{arch}.attention.value_length", s.head_dim)
        writer.add_uint32(f"{arch}.rope.dimension_count", rot)
        third = half // 3
        writer.add_array(f"{arch}.rope.dimension_sections",
                         [half - 2 * third, third, third, 0])
        writer.add_uint32(f"{arch}.ssm.conv_kernel", CONV)
        writer.add_uint32(f"{arch}.ssm.state_size", state)
        writer.add_uint32(f"{arch}.ssm.group_count", k_heads)
        writer.add_uint32(f"{arch}.ssm.time_step_rank", v_heads)
        writer.add_uint32(f"{arch}.ssm.inner_size", state * v_heads)
        writer.add_uint32(f"{arch}.attention.head_count_kv", s.kv_heads)
    else:  # lfm2: 0 kv heads marks a short-convolution layer
        writer.add_uint32(f"{arch}.block_count", s.layers)
        writer.add_array(f"{arch}.attention.head_count_kv",
                         [s.kv_heads if _is_attention(s, i) else 0 for i in range(s.layers)])
        writer.add_uint32(f"{arch}.shortconv.l_cache", L_CACHE)
