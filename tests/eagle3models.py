"""A tiny llama target and an EAGLE3 draft head for it (llama.cpp's ``eagle3``
architecture), written with the ``gguf`` package, that real llama.cpp loads in
milliseconds and whose drafts agree with the target at a rate ``gain`` sets.

The target is a 4-layer ``llama`` (n_embd 64, 4 heads, 2 KV heads, vocabulary "a" of
tinymodels) whose layers add to the residual stream only ``gain`` times what a
full-scale layer would (their ``attn_output`` and ``ffn_down`` are scaled by ``gain``):
as ``gain`` goes to 0 it is a bigram model, logits(P) ~ head(norm(emb(x_P))). Its
embedding rows have the same length in every 16-wide slice (RMS 1 in each), so in every
slice a token's embedding is more like itself than like any other token's (below).

The draft (``eagle3``: ``fc``, one decoder layer, its own output head over a subset of
the target's vocabulary with ``d2t``, and no ``token_embd``: llama.cpp takes the
target's through ``ctx_other``) is built so that at KV position P, given the token
x_{P+1} and the fused target features g_P, it computes ~ head(norm(emb(x_{P+1}))),
which is what the target says at position P + 1 when ``gain`` is small:

* attention (4 heads of 16, 4 KV heads): ``wq = wk = ALPHA * [I | 0]``, ``wv = [I | 0]``
  pick the normed token-embedding half of the concatenated input, ``wo = I``. Query and
  key of a position are the same vector (RoPE turns both alike at distance 0), and
  every embedding slice has the same length, so a query scores highest on the positions
  that hold its own token (Cauchy-Schwarz), all of whose values are that token's normed
  embedding; ALPHA makes the softmax pick them. So attention returns norm(emb(x_{P+1})).
* ``eagle3.norm_before_residual = true``: the residual added to the attention output is
  norm(g) * ``attn_norm_2`` (weights G_WEIGHT, small), not raw g. Without it, each
  autoregressive draft step would add the previous step's whole output (llama.cpp feeds
  the pre-norm output back as the next g), and drafts after the first would drift;
  with it, g adds a bounded G_WEIGHT-sized perturbation at every step.
* ``fc`` is random (3 x 64 -> 64; its output only enters through that small residual);
  the FFN is random with ``ffn_down`` scaled to FFN_DOWN (small). With G_WEIGHT 0.05 the
  residual alone cost ~10% of the agreement at gain 0 (logits of std 3 moved by ~0.15):
  at 0.01 the draft matches a bigram target 99% of the time.
* ``output_norm`` = the target's (ones), ``output.weight`` = the target's head rows at
  ``d2t``, which holds ABSOLUTE target token ids (llama.cpp writes draft logit i into
  target id ``d2t[i]`` and -inf everywhere else).

The draft's vocabulary (``draft_vocab`` entries, None: the whole target vocabulary and
no ``d2t``) is BOS, EOS, ``<|im_start|>``, EOT ``<|im_end|>`` and ordinary pieces, a
seeded few of those dropped; ``<unk>`` and the 256 byte tokens are left out (the target
gives them little mass: their head rows are halved, as in tinymodels). So where the
target picks a token the draft cannot name, the draft is rejected, as with a real EAGLE3
head (Llama 3.1 8B's covers 32k of 128k tokens).

Greedy agreement measured with real llama.cpp (the target decoded with its layer inputs
extracted, the draft's encoder then its decoder run as common/speculative.cpp runs them;
the draft's argmax at P against the target's at P + 1), seed 0, over 6 texts x 60
positions of random tokens / of text the target samples itself at T = 1:

    gain                            0      0.03   0.05   0.1    0.2    0.3    0.5
    draft_vocab 220, random tokens  0.94   0.87   0.84   0.71   0.55   0.44   0.25
    draft_vocab 220, own text       0.97   0.88   0.80   0.73   0.60   0.43   0.23
    draft_vocab None, random tokens 0.99   -      -      0.76   0.58   0.45   -

(at gain 0 what is left is the draft vocabulary: 6% of the target's argmaxes fall
outside it). Chained drafts (each step's pre-norm output fed back as g, as llama.cpp
does), 18 chains at gain 0.05: the first 1 / 2 / 3 / 4 drafts all equal the target's
greedy tokens 0.78 / 0.72 / 0.67 / 0.56 of the time (gain 0.3: 0.44 / 0.17 / 0.06 / 0.06).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
from tinymodels import DEFAULT_LOGIT_SCALE, finish_with_vocab_a, vocab_pieces

__all__ = ["DRAFT_VOCAB", "TARGET_LAYERS", "draft_ids", "greedy_agreement",
           "write_tiny_eagle3_pair"]

_N_EMBD, _N_LAYER, _N_FF = 64, 4, 128
_T_HEAD, _T_HEAD_KV = 4, 2  # the target's attention
_D_HEAD, _D_HEAD_KV = 4, 4  # the draft's: every head has its own values
_HEAD_DIM = _N_EMBD // _D_HEAD
#: The target layers whose inputs the draft fuses (low, middle, high).
TARGET_LAYERS = (0, 2, 3)
#: The default size of the draft vocabulary.
DRAFT_VOCAB = 220
#: Query/key gain: a query scores ALPHA^2 * 16 / 4 = 64 on its own token, at most
#: 64 * cos(angle) on another.
ALPHA = 4.0
#: attn_norm_2 weights: the size of norm(g) in the residual (the token part has RMS 1).
G_WEIGHT = 0.01
#: Scale of the draft's FFN output.
FFN_DOWN = 0.01
_BOS, _EOS, _IM_START, _EOT = 1, 2, 3, 4
# gguf TokenType values
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def _mat(rng: np.random.Generator, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
    """A (n_out, n_in) numpy matrix = ggml {n_in, n_out}, keeping activations ~unit RMS."""
    return rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))


def _target_weights(seed: int, gain: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    types = np.array([e[2] for e in vocab_pieces("a")])
    n_vocab = len(types)
    embd = rng.standard_normal((n_vocab, _N_EMBD // _HEAD_DIM, _HEAD_DIM))
    embd *= np.sqrt(_HEAD_DIM) / np.linalg.norm(embd, axis=2, keepdims=True)
    w = {"token_embd.weight": embd.reshape(n_vocab, _N_EMBD)}
    kv = _N_EMBD // _T_HEAD * _T_HEAD_KV
    for i in range(_N_LAYER):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(_N_EMBD)
        w[p + "attn_q.weight"] = _mat(rng, _N_EMBD, _N_EMBD, 1.5)
        w[p + "attn_k.weight"] = _mat(rng, kv, _N_EMBD, 1.5)
        w[p + "attn_v.weight"] = _mat(rng, kv, _N_EMBD)
        w[p + "attn_output.weight"] = _mat(rng, _N_EMBD, _N_EMBD, gain)
        w[p + "ffn_norm.weight"] = np.ones(_N_EMBD)
        w[p + "ffn_gate.weight"] = _mat(rng, _N_FF, _N_EMBD)
        w[p + "ffn_up.weight"] = _mat(rng, _N_FF, _N_EMBD)
        w[p + "ffn_down.weight"] = _mat(rng, _N_EMBD, _N_FF, gain)
    w["output_norm.weight"] = np.ones(_N_EMBD)
    out = _mat(rng, n_vocab, _N_EMBD, DEFAULT_LOGIT_SCALE)
    out[np.isin(types, (_BYTE, _CONTROL, _UNKNOWN))] *= 0.5
    w["output.weight"] = out
    return w


def draft_ids(draft_vocab: int | None, seed: int = 0) -> np.ndarray | None:
    """The target ids of the draft vocabulary, ascending (``d2t``); None for the whole
    vocabulary. BOS, EOS, <|im_start|> and EOT, then ordinary pieces, a seeded random
    ``n_normal - (draft_vocab - 4)`` of them dropped; no <unk>, no byte tokens."""
    if draft_vocab is None:
        return None
    types = np.array([e[2] for e in vocab_pieces("a")])
    normal = np.flatnonzero(types == _NORMAL)
    keep = draft_vocab - 4
    if not 0 < keep <= len(normal):
        raise ValueError(f"draft_vocab must be in 5..{len(normal) + 4}, or None")
    rng = np.random.default_rng(seed + 31337)
    kept = np.sort(rng.choice(normal, size=keep, replace=False))
    return np.concatenate([[_BOS, _EOS, _IM_START, _EOT], kept]).astype(np.int64)


def _draft_weights(target: dict[str, np.ndarray], d2t: np.ndarray | None,
                   seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 15485863)
    eye, zero = np.eye(_N_EMBD), np.zeros((_N_EMBD, _N_EMBD))
    pick = np.hstack([eye, zero])  # [norm(token embedding) | norm(g)] -> the first half
    head = target["output.weight"]
    p = "blk.0."
    return {
        "fc.weight": _mat(rng, _N_EMBD, len(TARGET_LAYERS) * _N_EMBD),
        p + "attn_norm.weight": np.ones(_N_EMBD),
        p + "attn_norm_2.weight": np.full(_N_EMBD, G_WEIGHT),
        p + "attn_q.weight": ALPHA * pick,
        p + "attn_k.weight": ALPHA * pick,
        p + "attn_v.weight": pick,
        p + "attn_output.weight": eye,
        p + "ffn_norm.weight": np.ones(_N_EMBD),
        p + "ffn_gate.weight": _mat(rng, _N_FF, _N_EMBD),
        p + "ffn_up.weight": _mat(rng, _N_FF, _N_EMBD),
        p + "ffn_down.weight": _mat(rng, _N_EMBD, _N_FF, FFN_DOWN),
        "output_norm.weight": target["output_norm.weight"].copy(),
        "output.weight": head if d2t is None else head[d2t],
    }


def _writer(path: Path, arch: str, name: str, hparams: dict):
    import gguf  # test-only dependency

    path.parent.mkdir(parents=True, exist_ok=True)
    g = gguf.GGUFWriter(str(path), arch)
    g.add_string("general.name", name)
    g.add_uint32("general.file_type", 0)  # ALL_F32
    for key, value in hparams.items():
        k = f"{arch}.{key}"
        if isinstance(value, bool):
            g.add_bool(k, value)
        elif isinstance(value, (list, tuple)):
            g.add_array(k, list(value))  # ints go in as INT32, as the loader wants
        elif isinstance(value, float):
            g.add_float32(k, value)
        else:
            g.add_uint32(k, value)
    return g


def write_tiny_eagle3_pair(target: str | Path, draft: str | Path, *, seed: int = 0,
                           gain: float = 0.05,
                           draft_vocab: int | None = DRAFT_VOCAB) -> tuple[Path, Path]:
    """Write the tiny ``llama`` target (layers scaled by ``gain``) at ``target`` and an
    ``eagle3`` draft head for it at ``draft`` (see the module docstring); return both
    paths. ``draft_vocab``: the size of the draft's vocabulary (``d2t`` entries), None
    for the target's whole vocabulary (no ``d2t``). The same arguments write the same
    bytes; ``gain`` changes only the target's ``attn_output`` and ``ffn_down``."""
    import gguf  # test-only dependency

    target, draft = Path(target), Path(draft)
    n_vocab = len(vocab_pieces("a"))
    tw = _target_weights(seed, gain)
    common = {"vocab_size": n_vocab, "context_length": 4096, "embedding_length": _N_EMBD,
              "feed_forward_length": _N_FF, "rope.freq_base": 10000.0,
              "rope.dimension_count": _HEAD_DIM, "attention.layer_norm_rms_epsilon": 1e-6}
    g = _writer(target, "llama", f"tiny-eagle3-target-s{seed}-g{gain:g}",
                {**common, "block_count": _N_LAYER, "attention.head_count": _T_HEAD,
                 "attention.head_count_kv": _T_HEAD_KV})
    finish_with_vocab_a(g, tw)

    d2t = draft_ids(draft_vocab, seed)
    dw = _draft_weights(tw, d2t, seed)
    g = _writer(draft, "eagle3", f"tiny-eagle3-s{seed}-v{draft_vocab}",
                {**common, "block_count": 1, "attention.head_count": _D_HEAD,
                 "attention.head_count_kv": _D_HEAD_KV,
                 "target_layers": list(TARGET_LAYERS), "target_hidden_size": _N_EMBD,
                 "norm_before_residual": True})
    if d2t is not None:
        g.add_tensor("d2t", d2t, raw_dtype=gguf.GGMLQuantizationType.I64)
    finish_with_vocab_a(g, dw)
    return target, draft


# ------------------------------------------------- measuring agreement in llama.cpp


def _ext():
    """llama-ext.h functions llama-cpp-python does not bind (by their mangled names)."""
    from llama_cpp import llama_cpp as C
    from llama_cpp.llama_cpp_ext import _ctypes_function_from_names as names

    ctx, model = C.llama_context_p_ctypes, C.llama_model_p_ctypes
    f32 = ctypes.POINTER(ctypes.c_float)

    @names(("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",),
           [ctx, ctypes.c_uint32, ctypes.c_bool], None)
    def set_layer_inp(c, lid, value, /): ...

    @names(("_Z30llama_get_embeddings_layer_inpP13llama_contextj",), [ctx, ctypes.c_uint32], f32)
    def get_layer_inp(c, lid, /): ...

    @names(("_Z28llama_model_target_layer_idsPK11llama_model",), [model],
           ctypes.POINTER(ctypes.c_int32))
    def layer_ids(m, /): ...

    @names(("_Z30llama_model_target_layer_ids_nPK11llama_model",), [model], ctypes.c_uint32)
    def layer_ids_n(m, /): ...

    return set_layer_inp, get_layer_inp, layer_ids, layer_ids_n


def greedy_agreement(target: str | Path, draft: str | Path, texts: list[list[int]], *,
                     n_threads: int = 1) -> float:
    """Teacher-forced greedy agreement of an ``eagle3`` draft with its target in real
    llama.cpp, run as common/speculative.cpp runs it: the target decodes each text with
    the draft's target layers' inputs extracted, the draft's encoder makes g = fc(those)
    per position, and its decoder takes (x_{P+1}, g_P) at position P; its argmax there
    against the target's at P + 1. Texts of at most 255 tokens. (Only llama-arch
    targets whose target layers are below their layer count.)"""
    from llama_cpp import llama_cpp as C
    from llama_cpp.llama_cpp_ext import llama_get_embeddings_nextn, llama_set_embeddings_nextn

    set_layer_inp, get_layer_inp, layer_ids, layer_ids_n = _ext()
    mp = C.llama_model_default_params()
    tm = C.llama_model_load_from_file(str(target).encode(), mp)
    dm = C.llama_model_load_from_file(str(draft).encode(), mp)
    assert tm and dm and layer_ids_n(dm) == 3
    ids = layer_ids(dm)
    lids = [ids[i] for i in range(3)]
    cp = C.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
    cp.n_threads = cp.n_threads_batch = n_threads
    tctx = C.llama_init_from_model(tm, cp)
    cp.ctx_other = tctx  # the draft takes the target's token embeddings from it
    dctx = C.llama_init_from_model(dm, cp)
    assert tctx and dctx
    for lid in lids:
        set_layer_inp(tctx, lid, True)
    llama_set_embeddings_nextn(dctx, True, True)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(tm))
    e_t, e_d = C.llama_model_n_embd(tm), C.llama_model_n_embd(dm)

    def rows(p, n, w):
        return np.ctypeslib.as_array(p, shape=(n * w,)).reshape(n, w).copy()

    hits: list[bool] = []
    try:
        for toks in texts:
            n = len(toks)
            C.llama_memory_clear(C.llama_get_memory(tctx), True)
            C.llama_memory_clear(C.llama_get_memory(dctx), True)
            b = C.llama_batch_init(n, 0, 1)
            for i, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, True
                b.seq_id[i][0] = 0
            b.n_tokens = n
            assert C.llama_decode(tctx, b) == 0
            C.llama_batch_free(b)
            t_logits = rows(C.llama_get_logits(tctx), n, n_vocab)
            feats = np.ascontiguousarray(np.hstack(
                [rows(get_layer_inp(tctx, lid), n, e_t) for lid in lids]), np.float32)
            be = C.llama_batch_ext_init(dctx)
            for i in range(n):  # the encoder: g = fc(features), one row per position
                row = feats[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                idx = C.llama_batch_ext_add_embd(be, 0, C.llama_embd(row, 1, feats.shape[1]))
                C.llama_batch_ext_set_pos(be, idx, (C.llama_pos * 4)(i, 0, 0, 0))
                C.llama_batch_ext_set_output_logits(be, idx, True)
            assert C.llama_process(dctx, C.LLAMA_PROCESS_TYPE_ENCODE, be) == 0
            g = np.ascontiguousarray(rows(llama_get_embeddings_nextn(dctx), n, e_d))
            C.llama_batch_ext_clear(be)
            for i in range(n - 1):  # the decoder: (x_{P+1}, g_P) at P
                idx = C.llama_batch_ext_add_token(be, 0, toks[i + 1])
                C.llama_batch_ext_set_pos(be, idx, (C.llama_pos * 4)(i, 0, 0, 0))
                row = g[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                assert C.llama_batch_ext_set_embd_token(be, idx, C.llama_embd(row, 1, e_d))
                C.llama_batch_ext_set_output_logits(be, idx, True)
            assert C.llama_process(dctx, C.LLAMA_PROCESS_TYPE_DECODE, be) == 0
            d_logits = rows(C.llama_get_logits(dctx), n - 1, n_vocab)
            C.llama_batch_ext_free(be)
            hits += (d_logits.argmax(1) == t_logits[1:].argmax(1)).tolist()
    finally:
        C.llama_free(dctx)
        C.llama_free(tctx)
        C.llama_model_free(dm)
        C.llama_model_free(tm)
    return float(np.mean(hits))
