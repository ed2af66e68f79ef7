"""What a Gemma 4 assistant draft costs against its target on this machine, on a
synthetic pair in Gemma 4's layout (random weights: costs are real, text meaningless).

The target has Gemma 4 E2B's trunk without its per-layer inputs and shared KV layers
(1536 wide, 35 layers, 4 sliding : 1 global, head size 256, one KV head, a 262k
vocabulary); the assistant is four layers 256 wide that read the target's last global
and sliding layers' cache, as Gemma 4's published assistants are. It is built to agree:
the target's output head is the assistant's times the projection through which the
assistant reads the token's embedding, and every layer's attention and FFN are turned
down by `--gain`, so both compute nearly one map from a token to the next (as the
synthetic Qwen3.5's MTP layer does). The files are made once into specllama's cache.

    python -m bench.gemma4_assistant                # write the pair, time one step of each
    python -m bench.gemma4_assistant --paths        # only print the files (for other benches)

Then side by side with `llama-server --spec-type draft-mtp -md ASSISTANT` on the same files:

    python -m bench.llamaserver --target T --draft A --mtp 1,3 \
        --specllama "--draft-max 0;--drafters model" --reps 5 --max-tokens 48
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.lib.common import parser
from specllama.models.synthetic import _vocabulary
from specllama.models.synthetic_hybrid import matrix
from specllama.paths import cache_dir

D, LAYERS, FF, HEADS, HEAD_DIM, VOCAB, WINDOW = 1536, 35, 6144, 8, 256, 262144, 512
A_D, A_LAYERS, A_FF, A_HEADS = 256, 4, 2048, 4
HEAD_SCALE = 4.0  # the logits' spread, as synthetic.py's heads
VERSION = 1


def _shapes(arch: str, layers: int) -> dict[str, object]:
    """Layer il slides unless il % 5 == 4: the last of 35 is global, the one before slides."""
    return {"block_count": layers, "attention.head_count_kv": 1,
            "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM,
            "attention.key_length_swa": HEAD_DIM, "attention.value_length_swa": HEAD_DIM,
            "attention.sliding_window": WINDOW, "context_length": 32768,
            "attention.sliding_window_pattern": [i % 5 != 4 for i in range(layers)]
            if arch == "gemma4" else [True, True, True, False],
            "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
            "attention.layer_norm_rms_epsilon": 1e-6}


def _layer(rng: np.random.Generator, d: int, heads: int, ff: int, gain: float,
           kv: bool) -> Iterator[tuple[str, np.ndarray]]:
    f16 = np.float16
    yield "attn_q", matrix(rng, heads * HEAD_DIM, d, 1.0, f16)
    if kv:
        yield "attn_k", matrix(rng, HEAD_DIM, d, 1.0, f16)
        yield "attn_v", matrix(rng, HEAD_DIM, d, 1.0, f16)
        yield "attn_k_norm", np.ones(HEAD_DIM, np.float32)
    yield "attn_output", matrix(rng, d, heads * HEAD_DIM, 1.0, f16)
    yield "attn_q_norm", np.ones(HEAD_DIM, np.float32)
    for name in ("attn_norm", "ffn_norm"):
        yield name, np.ones(d, np.float32)
    for name in ("post_attention_norm", "post_ffw_norm"):
        yield name, np.full(d, gain, np.float32)
    yield "layer_output_scale", np.ones(1, np.float32)
    yield "ffn_gate", matrix(rng, ff, d, 1.0, f16)
    yield "ffn_up", matrix(rng, ff, d, 1.0, f16)
    yield "ffn_down", matrix(rng, d, ff, 1.0, f16)


def _write(path: Path, arch: str, hparams: dict[str, object],
           tensors: Iterator[tuple[str, np.ndarray]]) -> None:
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic {arch} (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value in hparams.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))  # type: ignore[call-overload]
    _vocabulary(w, VOCAB)
    for name, weights in tensors:
        w.add_tensor(name, weights)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_pair(target: Path, assistant: Path, gain: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    # P: orthonormal rows scaled so that rms(P x) ~ rms(x); A: the assistant's tied head
    proj = (np.linalg.qr(rng.standard_normal((D, A_D)))[0].T * math.sqrt(D / A_D))
    head = matrix(rng, VOCAB, A_D, HEAD_SCALE, np.float32)

    def target_tensors() -> Iterator[tuple[str, np.ndarray]]:
        yield "token_embd.weight", matrix(rng, VOCAB, D, 1.0, np.float16)
        yield "output.weight", (head @ (proj / math.sqrt(D / A_D))).astype(np.float16)
        yield "output_norm.weight", np.ones(D, np.float32)
        yield "rope_freqs.weight", np.ones(HEAD_DIM // 2, np.float32)
        for i in range(LAYERS):
            for name, weights in _layer(rng, D, HEADS, FF, gain, kv=True):
                yield f"blk.{i}.{name}.weight", weights

    def assistant_tensors() -> Iterator[tuple[str, np.ndarray]]:
        yield "token_embd.weight", head.astype(np.float16)
        yield "output_norm.weight", np.ones(A_D, np.float32)
        yield "nextn.pre_projection.weight", np.hstack(
            [proj, np.zeros((A_D, D))]).astype(np.float16)
        yield "nextn.post_projection.weight", matrix(rng, D, A_D, 1.0, np.float16)
        yield "rope_freqs.weight", np.ones(HEAD_DIM // 2, np.float32)
        for i in range(A_LAYERS):
            for name, weights in _layer(rng, A_D, A_HEADS, A_FF, gain, kv=False):
                yield f"blk.{i}.{name}.weight", weights

    _write(target, "gemma4", {**_shapes("gemma4", LAYERS), "embedding_length": D,
                              "feed_forward_length": FF, "attention.head_count": HEADS,
                              "embedding_length_per_layer_input": 0}, target_tensors())
    _write(assistant, "gemma4-assistant", {
        **_shapes("gemma4-assistant", A_LAYERS), "embedding_length": A_D,
        "embedding_length_out": D, "nextn_predict_layers": A_LAYERS,
        "feed_forward_length": A_FF, "attention.head_count": A_HEADS}, assistant_tensors())


def made_pair(gain: float, threads: int) -> tuple[Path, Path]:
    """The quantized pair (Q4_K_M target, Q8_0 assistant), written once."""
    from specllama.engine.llama import quantize

    folder = cache_dir() / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"gemma4-e2b-layout.gain{gain:g}.v{VERSION}"
    target, assistant = folder / f"{stem}.Q4_K_M.gguf", folder / f"{stem}.assistant.Q8_0.gguf"
    if not (target.exists() and assistant.exists()):
        raw_t, raw_a = target.with_suffix(".f16.part"), assistant.with_suffix(".f16.part")
        try:
            write_pair(raw_t, raw_a, gain)
            quantize(raw_t, target, "Q4_K_M", threads)
            quantize(raw_a, assistant, "Q8_0", threads)
        finally:
            raw_t.unlink(missing_ok=True)
            raw_a.unlink(missing_ok=True)
    return target, assistant


def step_costs(target: Path, assistant: Path, threads: int, reps: int) -> tuple[float, float]:
    """Median seconds of a target decode of one token and of one assistant step, at
    position ~64, interleaved."""
    from specllama import SpeculativeDecoder

    dec = SpeculativeDecoder.load(target, assistant, n_ctx=512, n_threads=threads)
    try:
        prompt = dec.tokenize("the quick brown fox jumps over the lazy dog " * 6)
        t, a = dec.target, dec.draft
        assert a is not None
        t.decode(prompt[:-1], "none")
        a.sync_to(prompt[:-1])
        ts, as_ = [], []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            a.decode([prompt[-1]], "last")
            as_.append(time.perf_counter() - t0)
            a.truncate(len(prompt) - 1)
            t0 = time.perf_counter()
            t.decode([prompt[-1]], "last")
            ts.append(time.perf_counter() - t0)
            t.truncate(len(prompt) - 1)
        return statistics.median(ts[1:]), statistics.median(as_[1:])
    finally:
        dec.close()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--gain", type=float, default=0.005)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--paths", action="store_true", help="only make and print the files")
    args = p.parse_args()
    target, assistant = made_pair(args.gain, args.threads)
    print(f"target {target}\nassistant {assistant}")
    if args.paths:
        return
    t, a = step_costs(target, assistant, args.threads, args.reps)
    print(f"target step {t * 1e3:.1f} ms, assistant step {a * 1e3:.1f} ms: {a / t:.3f} of a "
          f"target step ({args.threads} threads)")


if __name__ == "__main__":
    main()
