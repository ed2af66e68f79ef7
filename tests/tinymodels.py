"""Tiny random-weight GGUF language models for fast, real-llama.cpp tests.

``write_tiny_model`` writes a complete ``llama``-architecture GGUF file (all tensors F32,
a few hundred KiB) with a SentencePiece-style ("llama") vocabulary that real llama.cpp
loads in milliseconds. The weights are a deterministic function of ``seed``; ``noise``
perturbs every tensor by Gaussian noise of that *relative* size (drawn from
``noise_seed``), which turns a copy of a target into a "draft" with tunable agreement.
``noise=0`` reproduces the target's weights byte for byte.

Vocabulary layout (``vocab="a"``)::

    0 <unk>  1 <s> (BOS)  2 </s> (EOS)  3 <|im_start|>  4 <|im_end|> (EOT, end-of-generation)
    5..260   <0x00>..<0xFF> byte-fallback tokens
    261..    "▁", then ▁-prefixed words (with every prefix, so SPM merges can reach them),
             a few sub-word pieces, letters, digits, punctuation

``vocab="b"`` keeps ids 0..4 but is otherwise different (normal pieces first, different
words, byte tokens last) and larger by well over 128 tokens, so a target/draft pair made of
an "a" and a "b" model is vocabulary-incompatible.

``vocab="a_split"`` is another tokenizer for the same language as "a", for cross-vocabulary
drafting (engine/crossvocab.py): the pieces of "a" with the ids shuffled, a few words only
spelt in two pieces ("▁cat" as "▁ca" + "t"), some words "a" lacks ("▁sat"), byte tokens last.
Its weights are those of "a" (same ``seed``) row for row by piece, so a draft made of it
agrees with an "a" target; the rows of its own pieces are new, and weigh ``_ONLY_GAIN`` times
more, so the draft puts real mass outside the pieces "a" shares. ``vocab="a_split_nobytes"``
is "a_split" without byte fallback and without a few characters "a" writes
(``SPLIT_MISSING_CHARS``): a draft that cannot spell all of the target's text.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

__all__ = [
    "CHATML",
    "FIM_TOKENS",
    "THINK_TOKENS",
    "DEFAULT_LOGIT_SCALE",
    "finish_with_vocab_a",
    "vocab_pieces",
    "write_tiny_mamba",
    "write_tiny_model",
]

# ChatML, as used by SmolLM2-Instruct (minus its default system prompt).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Std of the output logits (before the byte/control down-weighting). Chosen so that at
# temperature 1 the top token typically has probability ~0.1-0.6 and the distribution
# has a long tail of non-negligible tokens.
DEFAULT_LOGIT_SCALE = 3.0

# gguf TokenType values (gguf.TokenType), spelled out to keep this module import-light.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6

_SPECIALS = [
    ("<unk>", _UNKNOWN),
    ("<s>", _CONTROL),
    ("</s>", _CONTROL),
    ("<|im_start|>", _CONTROL),
    ("<|im_end|>", _CONTROL),
]
_BYTES = [(f"<0x{i:02X}>", _BYTE) for i in range(256)]


def _special_entries() -> list[tuple[str, float, int]]:
    return [(t, 0.0, typ) for t, typ in _SPECIALS]


def _byte_entries() -> list[tuple[str, float, int]]:
    return [(t, 0.0, typ) for t, typ in _BYTES]


_WORDS_A = (
    "the a of and to in is it that was for on are with as I he she they we you "
    "hello world cat dog this from or had by not but what all can there an which "
    "one have be at his her will so if do how up out some time like see no two "
    "Hello The It A This"
).split()
_SUBWORDS_A = ["in", "ing", "er", "ed", "es", "th", "he", "re", "an", "on", "at", "ll"]

_WORDS_B = (
    "zebra quartz lorem ipsum dolor sit amet consectetur adipiscing elit sed eiusmod "
    "tempor incididunt labore dolore magna aliqua enim minim veniam quis nostrud "
    "exercitation ullamco laboris nisi aliquip commodo consequat duis aute irure "
    "reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur sint "
    "occaecat cupidatat proident sunt culpa officia deserunt mollit anim est laborum "
    "Zebra Lorem Quartz"
).split()
_SUBWORDS_B = ["or", "um", "it", "at", "qu", "ex", "con", "tion", "lab", "ol"]

_LETTERS = list(string.ascii_lowercase + string.ascii_uppercase)
_DIGITS = list(string.digits)
_PUNCT = list(".,!?;:'\"()-[]{}/\\@#$%&*+=<>_~`^|")


def _with_prefixes(pieces: list[str], *, min_len: int) -> list[str]:
    """Every piece plus all its prefixes of length >= ``min_len`` (merge chain for SPM)."""
    out: list[str] = []
    for piece in pieces:
        for n in range(min_len, len(piece) + 1):
            out.append(piece[:n])
    return out


def _dedupe(pieces: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for p in pieces:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def vocab_pieces(vocab: str = "a") -> list[tuple[str, float, int]]:
    """Return ``[(text, score, token_type), ...]`` for vocabulary ``"a"`` or ``"b"``."""
    if vocab == "a":
        normal = (
            ["▁"]
            + _with_prefixes(["▁" + w for w in _WORDS_A], min_len=2)
            + _with_prefixes(_SUBWORDS_A, min_len=2)
            + _LETTERS
            + _DIGITS
            + _PUNCT
        )
        normal = _dedupe(normal)
        normal_entries = [(p, -float(i), _NORMAL) for i, p in enumerate(normal)]
        entries = _special_entries() + _byte_entries() + normal_entries
    elif vocab == "b":
        normal = (
            _DIGITS
            + list(reversed(_LETTERS))
            + _PUNCT
            + ["▁"]
            + ["▁" + c for c in _LETTERS]
            + _with_prefixes(["▁" + w for w in _WORDS_B], min_len=3)
            + _with_prefixes(_SUBWORDS_B, min_len=2)
            + [a + b for a in "aeiou" for b in "bcdfglmnprstv"]
        )
        normal = _dedupe(normal)
        normal_entries = [(p, -float(i), _NORMAL) for i, p in enumerate(normal)]
        entries = _special_entries() + normal_entries + _byte_entries()
    elif vocab in _BASED_ON:
        entries = _split_entries(with_bytes=vocab == "a_split")
    else:
        raise ValueError(f"unknown vocab {vocab!r} (expected 'a' or 'b')")
    return entries


# ---------------------------------------------- "a_split": another tokenizer for "a"

#: Words "a_split" spells in two pieces (no other piece of "a" extends them, so every
#: other word of "a" stays reachable by the merges).
SPLIT_WORDS = ["▁cat", "▁dog", "▁not", "▁you", "▁how", "▁see", "▁from", "▁what", "▁like",
               "▁some", "▁Hello", "▁with", "▁time", "▁will"]
#: Words only "a_split" has (with their prefixes): none holds an inner "▁", so its
#: tokenization, like that of "a", never merges across a word start.
_ONLY_SPLIT_WORDS = ("sat mat cats dogs sun ran big red old new man day way boy girl tree "
                     "house water quick brown fox jumps lazy over upon once").split()
#: Characters "a" writes that "a_split_nobytes" cannot spell (nor has bytes for).
SPLIT_MISSING_CHARS = "|\\&~"
#: How much heavier the output rows of the pieces only "a_split" has are than the others.
_ONLY_GAIN = 1.2
#: The vocabulary whose weights each variant takes, row for row by piece.
_BASED_ON = {"a_split": "a", "a_split_nobytes": "a"}


def _split_entries(*, with_bytes: bool) -> list[tuple[str, float, int]]:
    base = vocab_pieces("a")
    normal = [e for e in base if e[2] == _NORMAL]
    texts = {e[0] for e in base}
    for w in SPLIT_WORDS:
        assert w in texts and not any(t != w and t.startswith(w) for t in texts), w
    kept = [e for e in normal if e[0] not in SPLIT_WORDS
            and (with_bytes or e[0] not in SPLIT_MISSING_CHARS)]
    only = [p for p in _dedupe(_with_prefixes(["▁" + w for w in _ONLY_SPLIT_WORDS], min_len=2))
            if p not in texts]
    lowest = min(e[1] for e in normal)
    kept += [(p, lowest - 1.0 - i, _NORMAL) for i, p in enumerate(only)]
    order = np.random.default_rng(2025).permutation(len(kept))
    shuffled = [kept[i] for i in order]
    return _special_entries() + shuffled + (_byte_entries() if with_bytes else [])


def _weights_by_piece(vocab: str, texts: list[str], *, seed: int, logit_scale: float,
                      **shape: int) -> dict[str, np.ndarray]:
    """The weights of the vocabulary `vocab` is based on, each token's embedding and output
    row moved to where its piece is in `vocab`; pieces only `vocab` has get new rows."""
    base = vocab_pieces(_BASED_ON[vocab])
    w = _weights(seed=seed, types=[e[2] for e in base], logit_scale=logit_scale, **shape)
    row = {e[0]: i for i, e in enumerate(base)}
    rng = np.random.default_rng(seed + 104729)
    n_embd = shape["n_embd"]
    embd = rng.standard_normal((len(texts), n_embd))
    out = rng.standard_normal((len(texts), n_embd)) * _ONLY_GAIN * logit_scale / np.sqrt(n_embd)
    for i, text in enumerate(texts):
        if text in row:
            embd[i] = w["token_embd.weight"][row[text]]
            out[i] = w["output.weight"][row[text]]
    w["token_embd.weight"], w["output.weight"] = embd, out
    return w


def _weights(
    *,
    seed: int,
    types: list[int],
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    logit_scale: float,
) -> dict[str, np.ndarray]:
    """Deterministic random weights (float64, insertion order is the generation order)."""
    rng = np.random.default_rng(seed)
    n_vocab = len(types)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    inv = 1.0 / np.sqrt(n_embd)
    qk_gain = 1.5  # makes attention reasonably peaked => real dependence on context

    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = rng.standard_normal((n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "attn_q.weight"] = rng.standard_normal((n_embd, n_embd)) * inv * qk_gain
        w[p + "attn_k.weight"] = rng.standard_normal((n_embd_kv, n_embd)) * inv * qk_gain
        w[p + "attn_v.weight"] = rng.standard_normal((n_embd_kv, n_embd)) * inv
        w[p + "attn_output.weight"] = rng.standard_normal((n_embd, n_embd)) * inv
        w[p + "ffn_norm.weight"] = np.ones(n_embd)
        w[p + "ffn_gate.weight"] = rng.standard_normal((n_ff, n_embd)) * inv
        w[p + "ffn_up.weight"] = rng.standard_normal((n_ff, n_embd)) * inv
        w[p + "ffn_down.weight"] = rng.standard_normal((n_embd, n_ff)) / np.sqrt(n_ff)
    w["output_norm.weight"] = np.ones(n_embd)
    out = rng.standard_normal((n_vocab, n_embd)) * inv * logit_scale
    # Byte and control tokens get flatter logits so that sampled text is mostly made of
    # normal pieces (they still carry real probability mass, so EOG and byte tokens do
    # get generated now and then).
    t = np.asarray(types)
    out[t == _BYTE] *= 0.5
    out[(t == _CONTROL) | (t == _UNKNOWN)] *= 0.5
    w["output.weight"] = out
    return w


#: The reasoning markers ``write_tiny_model(think=...)`` appends, in this order.
THINK_TOKENS = ("<think>", "</think>")

#: The fill-in-the-middle tokens ``write_tiny_model(fim=True)`` appends, by the GGUF key
#: naming each (tokenizer.ggml.fim_{key}_token_id). Texts llama.cpp does not know (it
#: recognises Qwen's "<|fim_prefix|>" and others by text): only the keys make them FIM's.
FIM_TOKENS = {"pre": "<fim:pre>", "suf": "<fim:suf>", "mid": "<fim:mid>", "pad": "<fim:pad>",
              "rep": "<fim:repo>", "sep": "<fim:sep>"}


def _add_rows(weights: dict[str, np.ndarray], n: int, *, seed: int,
              logit_scale: float) -> None:
    """Embedding and output rows for `n` appended control tokens, from their own generator
    (the other rows stay those of the same seed without them), flatter as control ones."""
    rng = np.random.default_rng(seed + 6151)
    n_embd = weights["token_embd.weight"].shape[1]
    weights["token_embd.weight"] = np.vstack([weights["token_embd.weight"],
                                              rng.standard_normal((n, n_embd))])
    rows = rng.standard_normal((n, n_embd)) * 0.5 * logit_scale / np.sqrt(n_embd)
    weights["output.weight"] = np.vstack([weights["output.weight"], rows])


def _pull(weights: dict[str, np.ndarray], token: int, *, seed: int, gain: float) -> None:
    """`token`'s logit raised at every position: all embeddings share a component along
    `u` (the final norm keeps it), and the token's output row gets `gain * u`."""
    rng = np.random.default_rng(seed)
    n_embd = weights["token_embd.weight"].shape[1]
    u = rng.standard_normal(n_embd)
    u /= np.linalg.norm(u)
    weights["token_embd.weight"] = weights["token_embd.weight"] + 0.5 * np.sqrt(n_embd) * u
    weights["output.weight"][token] += gain * u


def _add_think(weights: dict[str, np.ndarray], *, seed: int, gain: float,
               logit_scale: float) -> None:
    """Rows for ``THINK_TOKENS`` and a pull towards ``</think>``: every token's embedding
    gets the same component along one direction ``u`` (a constant in the residual stream,
    which the final norm keeps pointing the same way whatever the context), and the
    output row of ``</think>`` is ``gain * u``: its logit is high at every position, and
    the model closes its reasoning within a few dozen tokens. Its own embedding points
    the other way, so a close is seldom followed by another. ``<think>`` is an ordinary
    random row (flatter, as control tokens': it is seldom written)."""
    rng = np.random.default_rng(seed + 4099)
    n_embd = weights["token_embd.weight"].shape[1]
    u = rng.standard_normal(n_embd)
    u /= np.linalg.norm(u)
    shift = np.sqrt(n_embd) * u  # as long as a typical embedding row
    embd = rng.standard_normal((2, n_embd))
    embd[1] -= 2 * shift
    weights["token_embd.weight"] = np.vstack([weights["token_embd.weight"], embd]) + shift
    rows = rng.standard_normal((2, n_embd)) * 0.5 * logit_scale / np.sqrt(n_embd)
    rows[1] = gain * u
    weights["output.weight"] = np.vstack([weights["output.weight"], rows])


def write_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    vocab: str = "a",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 4,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    noise: float = 0.0,
    noise_seed: int = 1,
    logit_scale: float = DEFAULT_LOGIT_SCALE,
    chat_template: str | None = CHATML,
    add_space_prefix: bool = True,
    name: str | None = None,
    extra_tokens: int = 0,
    bos: str = "<s>",
    eos: str = "</s>",
    add_bos: bool = True,
    add_eos: bool = False,
    think: float = 0.0,
    fim: bool = False,
    lines: float = 0.0,
) -> Path:
    """Write a tiny random ``llama`` GGUF model to ``path`` and return the path.

    ``noise`` is relative: each tensor ``W`` becomes ``W + noise * rms(W) * N(0, 1)``
    with the normal draws taken from ``noise_seed`` (norm weights included).

    ``extra_tokens`` appends that many ordinary pieces ("▁zz0", "▁zz1", ...) at the end of
    the vocabulary, with their own embedding and output rows drawn from a separate
    generator: the other weights stay those of the same ``seed`` without them, so such a
    model and one without the extras form a pair whose vocabularies differ at the end, as
    Qwen2.5 7B (152,064 ids) and 0.5B (151,936) do.

    ``bos`` and ``eos`` name the special tokens (e.g. ``eos="<|im_end|>"``) the GGUF declares
    as BOS and EOS; ``add_bos`` and ``add_eos`` say whether the tokenizer adds them.

    ``add_space_prefix=True`` (the SPM/Llama-1/2 default) makes llama.cpp prepend "▁" to
    the text it tokenizes, so detokenizing yields a leading space unless it is stripped
    (``Llama.detokenize`` strips it only when the first token is BOS).

    ``think`` > 0 makes a reasoning model (see ``_add_think``): ``<think>`` and ``</think>``
    appended as one user-defined token each, as Qwen3's are, and ``</think>`` drawn often
    enough that the model closes its reasoning; the larger ``think``, the sooner.

    ``fim=True`` appends the fill-in-the-middle tokens ``FIM_TOKENS`` (control tokens) and
    the GGUF keys that make them the model's FIM prefix, suffix, middle, pad, repository
    and file separator, as a code model's (Qwen2.5-Coder's) are.

    ``lines`` > 0 makes the model write a newline often, as code has short lines: every
    token's embedding gets a component along one direction and the newline byte's output
    row ``lines`` times it (as ``think`` pulls towards ``</think>``).
    """
    import gguf  # test-only dependency

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be divisible by n_head, and n_head by n_head_kv")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    entries = vocab_pieces(vocab)
    n_base = len(entries)
    entries = entries + [(f"▁zz{i}", -float(n_base + i), _NORMAL) for i in range(extra_tokens)]
    texts = [e[0] for e in entries]
    scores = [e[1] for e in entries]
    types = [e[2] for e in entries]
    tok_id = {t: i for i, t in enumerate(texts)}
    head_dim = n_embd // n_head

    weights = _weights(
        seed=seed,
        types=types[:n_base],
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        logit_scale=logit_scale,
    )
    if vocab in _BASED_ON:
        weights = _weights_by_piece(
            vocab, texts[:n_base], seed=seed, n_layer=n_layer, n_embd=n_embd,
            n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, logit_scale=logit_scale,
        )
    if extra_tokens:
        xrng = np.random.default_rng(seed + 7919)
        rows = xrng.standard_normal((extra_tokens, n_embd))
        weights["token_embd.weight"] = np.vstack([weights["token_embd.weight"], rows])
        rows = xrng.standard_normal((extra_tokens, n_embd)) * logit_scale / np.sqrt(n_embd)
        weights["output.weight"] = np.vstack([weights["output.weight"], rows])
    if think > 0:
        entries += [(t, -float(len(entries)), _USER_DEFINED) for t in THINK_TOKENS]
        _add_think(weights, seed=seed, gain=think, logit_scale=logit_scale)
    if lines > 0:
        _pull(weights, tok_id["<0x0A>"], seed=seed + 31, gain=lines)
    if fim:
        entries += [(t, -float(len(entries)), _CONTROL) for t in FIM_TOKENS.values()]
        _add_rows(weights, len(FIM_TOKENS), seed=seed, logit_scale=logit_scale)
    texts = [e[0] for e in entries]
    scores = [e[1] for e in entries]
    types = [e[2] for e in entries]
    tok_id = {t: i for i, t in enumerate(texts)}
    if noise > 0:
        nrng = np.random.default_rng(noise_seed)
        for k, v in weights.items():
            rms = float(np.sqrt(np.mean(v * v)))
            weights[k] = v + noise * rms * nrng.standard_normal(v.shape)

    arch = "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.name", name or f"tiny-{vocab}-s{seed}-n{noise:g}")
    w.add_uint32("general.file_type", 0)  # ALL_F32
    w.add_uint32(f"{arch}.vocab_size", len(texts))
    w.add_uint32(f"{arch}.context_length", n_ctx_train)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_uint32(f"{arch}.feed_forward_length", n_ff)
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_head_kv)
    w.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)

    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", texts)
    w.add_array("tokenizer.ggml.scores", scores)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.unknown_token_id", tok_id["<unk>"])
    w.add_uint32("tokenizer.ggml.bos_token_id", tok_id[bos])
    w.add_uint32("tokenizer.ggml.eos_token_id", tok_id[eos])
    w.add_uint32("tokenizer.ggml.eot_token_id", tok_id["<|im_end|>"])
    w.add_bool("tokenizer.ggml.add_bos_token", add_bos)
    w.add_bool("tokenizer.ggml.add_eos_token", add_eos)
    w.add_bool("tokenizer.ggml.add_space_prefix", add_space_prefix)
    if chat_template is not None:
        w.add_string("tokenizer.chat_template", chat_template)
    if fim:
        for key, text in FIM_TOKENS.items():
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", tok_id[text])

    for k, v in weights.items():
        w.add_tensor(k, np.ascontiguousarray(v, dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_mamba(path: str | Path, *, seed: int = 0, n_layer: int = 2, n_embd: int = 32,
                     d_state: int = 8, d_conv: int = 4, noise: float = 0.0,
                     noise_seed: int = 1) -> Path:
    """A tiny random Mamba (recurrent) model with vocabulary "a": its memory keeps a running
    state that llama.cpp cannot cut back by itself (no snapshots for mamba), so specllama
    keeps checkpoints (engine/llama/rewind.py). `noise` as for write_tiny_model: a noisy
    copy is a draft that mostly agrees."""
    import gguf

    path = Path(path)
    entries = vocab_pieces("a")
    n_vocab = len(entries)
    d_inner = 2 * n_embd
    dt_rank = max(1, n_embd // 16)
    rng = np.random.default_rng(seed)
    inv = 1.0 / np.sqrt(n_embd)
    w: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd))}
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(n_embd)
        w[p + "ssm_in.weight"] = rng.standard_normal((2 * d_inner, n_embd)) * inv
        w[p + "ssm_conv1d.weight"] = rng.standard_normal((d_inner, d_conv)) * 0.5
        w[p + "ssm_conv1d.bias"] = np.zeros(d_inner)
        w[p + "ssm_x.weight"] = rng.standard_normal((dt_rank + 2 * d_state, d_inner)) / np.sqrt(
            d_inner
        )
        w[p + "ssm_dt.weight"] = rng.standard_normal((d_inner, dt_rank)) * 0.5
        w[p + "ssm_dt.bias"] = np.full(d_inner, -2.0)
        w[p + "ssm_a"] = -np.tile(np.arange(1, d_state + 1, dtype=np.float64), (d_inner, 1))
        w[p + "ssm_d"] = np.ones(d_inner)
        w[p + "ssm_out.weight"] = rng.standard_normal((n_embd, d_inner)) / np.sqrt(d_inner)
    w["output_norm.weight"] = np.ones(n_embd)
    w["output.weight"] = rng.standard_normal((n_vocab, n_embd)) * inv * DEFAULT_LOGIT_SCALE

    if noise > 0:
        nrng = np.random.default_rng(noise_seed)
        for k, v in w.items():
            if k.endswith(("ssm_a", "ssm_d", "norm.weight")):
                continue  # the dynamics' constants stay: the state must not blow up
            w[k] = v + noise * np.sqrt(np.mean(v**2)) * nrng.standard_normal(v.shape)
    arch = "mamba"
    g = gguf.GGUFWriter(str(path), arch)
    g.add_string("general.name", f"tiny-mamba-s{seed}")
    g.add_uint32("general.file_type", 0)
    g.add_uint32(f"{arch}.vocab_size", n_vocab)
    g.add_uint32(f"{arch}.context_length", 4096)
    g.add_uint32(f"{arch}.embedding_length", n_embd)
    g.add_uint32(f"{arch}.block_count", n_layer)
    g.add_uint32(f"{arch}.feed_forward_length", 0)
    g.add_uint32(f"{arch}.attention.head_count", 0)
    g.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    g.add_uint32(f"{arch}.ssm.inner_size", d_inner)
    g.add_uint32(f"{arch}.ssm.state_size", d_state)
    g.add_uint32(f"{arch}.ssm.time_step_rank", dt_rank)
    g.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    finish_with_vocab_a(g, w)
    return path


def finish_with_vocab_a(g, weights: dict[str, np.ndarray]) -> None:
    """Write vocabulary "a" (SPM, BOS 1, EOS 2, EOT 4, ChatML) and `weights` (as F32) into
    a GGUFWriter whose architecture keys are in, and close it."""
    entries = vocab_pieces("a")
    g.add_string("tokenizer.ggml.model", "llama")
    g.add_array("tokenizer.ggml.tokens", [e[0] for e in entries])
    g.add_array("tokenizer.ggml.scores", [e[1] for e in entries])
    g.add_array("tokenizer.ggml.token_type", [e[2] for e in entries])
    g.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    g.add_uint32("tokenizer.ggml.bos_token_id", 1)
    g.add_uint32("tokenizer.ggml.eos_token_id", 2)
    g.add_uint32("tokenizer.ggml.eot_token_id", 4)
    g.add_bool("tokenizer.ggml.add_bos_token", True)
    g.add_string("tokenizer.chat_template", CHATML)
    for k, v in weights.items():
        g.add_tensor(k, np.ascontiguousarray(v, dtype=np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
