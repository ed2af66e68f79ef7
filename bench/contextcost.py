"""A target decode of n tokens by context length, and after the draft model's steps.

auto's calibration times T(n) at position 16, each model alone. This times the pair's
target at other context lengths (T(1), and T(n)/T(1) for a few n), and with
--interleave whether a decode right after the draft model's steps (as in the round
loop) costs more than one after the target's own. Medians over interleaved passes.

    python bench/contextcost.py --pair smollm2
    python bench/contextcost.py --pair smollm2-f32 --interleave
"""

from __future__ import annotations

import argparse
import statistics
import time

from specllama.engine.llama import Model


def decode_timed(model: Model, tokens: list[int], at: int, n: int) -> float:
    """Seconds of one decode of tokens[at:at+n] after `at` cached ones (every row's
    logits, as a verification); the cache is cut back to `at` after."""
    t0 = time.perf_counter()
    model.decode(tokens[at : at + n], "all" if n > 1 else "last")
    seconds = time.perf_counter() - t0
    model.truncate(at)
    return seconds


def main() -> None:
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair
    from specllama.policy.calibration import _filler_tokens

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-f32")
    ap.add_argument("--contexts", default="16,128,256,512,1024")
    ap.add_argument("--sizes", default="1,2,3,4,6,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--interleave", action="store_true",
                    help="also time the target after 1 and 3 draft steps (at 200 tokens)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    sizes = sorted({1, *(int(x) for x in args.sizes.split(","))})

    target_path, draft_path = resolve_pair(find_and_load_config().pair(args.pair))
    target = Model(target_path, n_ctx=2048, n_threads=args.threads)
    tokens = _filler_tokens(target, max(contexts) + max(sizes) + 16)

    def timed(model: Model, at: int, n: int) -> float:
        return decode_timed(model, tokens, at, n)

    samples: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.reps):
        for c in contexts:
            target.clear()
            target.decode(tokens[:c], "none")
            for n in sizes:
                samples.setdefault((c, n), []).extend(timed(target, c, n) for _ in range(3))
    for c in contexts:
        t1 = statistics.median(samples[(c, 1)])
        print(f"context {c:5d}: T(1) {t1 * 1e3:6.2f} ms  " + "  ".join(
            f"T({n}) {statistics.median(samples[(c, n)]) / t1:4.2f}" for n in sizes[1:]))

    if args.interleave and draft_path is not None:
        interleaved(target, Model(draft_path, n_ctx=2048, n_threads=args.threads), tokens,
                    sizes, args.reps)


def interleaved(target: Model, draft: Model, tokens: list[int], sizes: list[int],
                reps: int) -> None:
    """The target's T(n) right after 0, 1 or 3 draft steps; a draft step alone and right
    after a target decode: at 200 tokens of context."""

    def timed(model: Model, at: int, n: int) -> float:
        return decode_timed(model, tokens, at, n)

    at = 200
    target.clear()
    target.decode(tokens[:at], "none")
    draft.decode(tokens[:at], "none")
    after: dict[tuple[int, int], list[float]] = {}
    for _ in range(reps):
        for steps in (0, 1, 3):
            for n in sizes:
                for _ in range(5):
                    for s in range(steps):
                        draft.decode(tokens[at + s : at + s + 1], "last")
                    draft.truncate(at)
                    after.setdefault((steps, n), []).append(timed(target, at, n))
    alone = statistics.median(after[(0, 1)])
    for steps in (0, 1, 3):
        print(f"after {steps} draft steps: " + "  ".join(
            f"T({n}) {statistics.median(after[(steps, n)]) * 1e3:5.1f} ms" for n in sizes)
            + f"  (T(1) {statistics.median(after[(steps, 1)]) / alone:.2f}x alone)")
    step: dict[str, list[float]] = {"alone": [], "after a target decode of 4": []}
    for _ in range(30):
        for name in step:
            if name != "alone":
                timed(target, at, 4)
            step[name].append(timed(draft, at, 1))
    print("draft step: " + ", ".join(f"{name} {statistics.median(v) * 1e3:.2f} ms"
                                    for name, v in step.items()))


if __name__ == "__main__":
    main()
