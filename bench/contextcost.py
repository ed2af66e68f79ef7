"""A target decode of n tokens by context length, and after the draft model's steps.

auto's calibration times T(n) at position 16, each model alone. This times the pair's
target at other context lengths (T(1), and T(n)/T(1) for a few n), and with
--interleave whether a decode right after the draft model's steps (as in the round
loop) costs more than one after the target's own. Medians over interleaved passes.

    python -m bench.contextcost --pair smollm2
    python -m bench.contextcost --pair smollm2-f32 --interleave
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from bench.lib.common import add_pair_options, add_run_options, parser, resolve_models, run
from specllama.engine.llama import Model

#: Where the interleaved decodes are timed, and the draft steps before them.
AT, STEPS = 200, (0, 1, 3)

Samples = dict[tuple[int, int], list[float]]


def decode_timed(model: Model, tokens: list[int], at: int, n: int) -> float:
    """Seconds of one decode of tokens[at:at+n] after `at` cached ones (every row's
    logits, as a verification); the cache is cut back to `at` after."""
    t0 = time.perf_counter()
    model.decode(tokens[at : at + n], "all" if n > 1 else "last")
    seconds = time.perf_counter() - t0
    model.truncate(at)
    return seconds


def by_context(samples: Samples, contexts: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """Per context length: the median T(1), and each T(n) / T(1) (medians)."""
    out = []
    for c in contexts:
        t1 = statistics.median(samples[(c, 1)])
        out.append(f"context {c:5d}: T(1) {t1 * 1e3:6.2f} ms  " + "  ".join(
            f"T({n}) {statistics.median(samples[(c, n)]) / t1:4.2f}" for n in sizes[1:]))
    return out


def after_steps(after: Samples, sizes: Sequence[int]) -> list[str]:
    """Per number of draft steps before it: each T(n) (medians), and T(1) against T(1)
    with no draft step before it."""
    alone = statistics.median(after[(0, 1)])
    return [f"after {steps} draft steps: " + "  ".join(
        f"T({n}) {statistics.median(after[(steps, n)]) * 1e3:5.1f} ms" for n in sizes)
        + f"  (T(1) {statistics.median(after[(steps, 1)]) / alone:.2f}x alone)"
        for steps in STEPS]


def measure(target: Model, tokens: list[int], contexts: list[int], sizes: list[int],
            reps: int) -> Samples:
    samples: Samples = {}
    for _ in range(reps):
        for c in contexts:
            target.clear()
            target.decode(tokens[:c], "none")
            for n in sizes:
                samples.setdefault((c, n), []).extend(
                    decode_timed(target, tokens, c, n) for _ in range(3))
    return samples


def interleaved(target: Model, draft: Model, tokens: list[int], sizes: list[int],
                reps: int) -> None:
    """The target's T(n) right after 0, 1 or 3 draft steps; a draft step alone and right
    after a target decode: at 200 tokens of context."""
    target.clear()
    target.decode(tokens[:AT], "none")
    draft.decode(tokens[:AT], "none")
    after: Samples = {}
    for _ in range(reps):
        for steps in STEPS:
            for n in sizes:
                for _ in range(5):
                    for s in range(steps):
                        draft.decode(tokens[AT + s : AT + s + 1], "last")
                    draft.truncate(AT)
                    after.setdefault((steps, n), []).append(decode_timed(target, tokens, AT, n))
    print("\n".join(after_steps(after, sizes)))
    step: dict[str, list[float]] = {"alone": [], "after a target decode of 4": []}
    for _ in range(30):
        for name in step:
            if name != "alone":
                decode_timed(target, tokens, AT, 4)
            step[name].append(decode_timed(draft, tokens, AT, 1))
    print("draft step: " + ", ".join(f"{name} {statistics.median(v) * 1e3:.2f} ms"
                                    for name, v in step.items()))


def main() -> None:
    from specllama.policy.calibration import _filler_tokens

    p = parser(__doc__)
    add_pair_options(p)
    add_run_options(p, reps=5)
    p.add_argument("--contexts", default="16,128,256,512,1024")
    p.add_argument("--sizes", default="1,2,3,4,6,8")
    p.add_argument("--interleave", action="store_true",
                   help="also time the target after 1 and 3 draft steps (at 200 tokens)")
    args = p.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    sizes = sorted({1, *(int(x) for x in args.sizes.split(","))})
    target_path, draft_path = resolve_models(args, need_draft=args.interleave)
    target = Model(target_path, n_ctx=2048, n_threads=args.threads)
    tokens = _filler_tokens(target, max(contexts) + max(sizes) + 16)
    print("\n".join(by_context(measure(target, tokens, contexts, sizes, args.reps),
                               contexts, sizes)))
    if args.interleave and draft_path is not None:
        interleaved(target, Model(draft_path, n_ctx=2048, n_threads=args.threads), tokens,
                    sizes, args.reps)


if __name__ == "__main__":
    run(main)
