"""What an EAGLE3 head costs against its target on this machine: one target step, one
draft step of the head, and the encoder pass that fuses the target's three layers after
each target decode, each as a median over interleaved repetitions.

On the built-in synthetic pair (Llama 3.1 8B's shape and its EAGLE3 layout, random
weights: costs are real, text meaningless; the files are made once into the cache):

    python -m bench.eagle3 --pair synth-llama3.1-8b-eagle3
    python -m bench.eagle3 --target T.gguf --draft EAGLE3.gguf --threads 2

Then side by side with `llama-server --spec-type draft-eagle3` on the same files:

    python -m bench.llamaserver --pair synth-llama3.1-8b-eagle3 --eagle3 2,3,4 \\
        --specllama "--draft-max 0;default;--drafters model" --reps 3 --max-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.lib.common import add_pair_options, load_decoder, parser, run


def step_costs(args: argparse.Namespace) -> tuple[float, float, float]:
    """Median seconds of a target decode of one token, of one head step, and of the
    encoder pass over one token's fused states, at position ~64."""
    dec = load_decoder(args, n_ctx=512, need_draft=True)
    try:
        if dec.draft_model is None or dec.draft_model.traits.kind != "eagle3":
            raise SystemExit("error: the draft is not an EAGLE3 head")
        prompt = dec.tokenize("the quick brown fox jumps over the lazy dog " * 6)
        t, head = dec.target, dec.draft
        assert head is not None
        t.decode(prompt[:-1], "none")
        head.sync_to(prompt[:-1])
        head.decode(prompt[len(head.cached):-1], "none")
        ts, hs, es = [], [], []
        for _ in range(args.reps + 1):
            t0 = time.perf_counter()
            head.decode([prompt[-1]], "last")
            hs.append(time.perf_counter() - t0)
            head.truncate(len(prompt) - 1)
            before = head.decode_s
            t0 = time.perf_counter()
            t.decode([prompt[-1]], "last")  # (its hook runs the head's encoder)
            whole = time.perf_counter() - t0
            encoder = head.decode_s - before
            ts.append(whole - encoder)
            es.append(encoder)
            t.truncate(len(prompt) - 1)
        return (statistics.median(ts[1:]), statistics.median(hs[1:]),
                statistics.median(es[1:]))
    finally:
        dec.close()


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p, pair="synth-llama3.1-8b-eagle3")
    p.add_argument("--reps", type=int, default=15, help="repetitions (default: %(default)s)")
    args = p.parse_args()
    t, h, e = step_costs(args)
    print(f"target step {t * 1e3:.1f} ms; EAGLE3 step {h * 1e3:.2f} ms ({h / t:.3f} of a "
          f"target step); encoder {e * 1e3:.2f} ms a token ({e / t:.3f}); "
          f"{args.threads} threads")


if __name__ == "__main__":
    run(main)
