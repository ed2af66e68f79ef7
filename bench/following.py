"""Following earlier replies on the request sequence: what it costs, and what it earns.

Runs the built-in request sequence (specllama/prompts/requests.jsonl) greedy, in the
default mode, each request drafting from the answers before it (the first two have
none to follow, and are not counted).

    python bench/following.py                   # cost per round, smollm2-f32
    python bench/following.py --ablate --reps 5 # the same sequence with parts of it off
    python bench/following.py --ablate --reps 8 --variants "no splicing"

The cost: the time of the two calls following makes, walking the followed replies along
the committed tokens each round (`LookupDraft._refollow`) and, inside model drafts,
finding what they agree on next (`LookupDraft.agreed`, once per drawn token), beside
the target's time. The ablation: tokens per second over requests 3-12 as built, with no
splicing into model drafts, with FOLLOW 2 and 8 replies followed, and with nothing
followed (the lookups before it), interleaved per repetition; each ratio against "as
built", median [min-max]. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def main() -> None:
    from specllama import SamplingParams, SpeculativeDecoder
    from specllama.cli.bench.prompts import builtin_prompts
    from specllama.engine import lookup
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-f32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--reps", type=int, default=3, help="with --ablate")
    ap.add_argument("--variants", help="with --ablate: a comma-separated subset, e.g. "
                                       "'as built,no splicing' (default: all)")
    args = ap.parse_args()

    target, draft = resolve_pair(find_and_load_config().pair(args.pair))
    dec = SpeculativeDecoder.load(target, draft, n_ctx=2048, n_threads=args.threads)
    prompts = [dec.target.prompt(p.prompt, chat=True) for p in builtin_prompts("requests")]
    dec.generate(prompts[0], max_tokens=8, draft_max=0)  # page the weights in

    def sequence() -> tuple[int, float, float, int]:
        """(tokens, seconds, target seconds, rounds) of requests 3 to the last."""
        dec.suffix_cache.forget_session()
        tokens, seconds, target_s, rounds = 0, 0.0, 0.0, 0
        for i, prompt in enumerate(prompts):
            s = dec.generate(prompt, max_tokens=args.max_tokens, draft_max="auto",
                             sampling=SamplingParams(0.0, seed=1)).stats
            if i >= 2:
                tokens, seconds = tokens + s.tokens, seconds + s.generate_s
                target_s, rounds = target_s + s.target_s, rounds + s.target_steps
        return tokens, seconds, target_s, rounds

    if args.ablate:
        ablate(sequence, lookup, args.reps, args.variants)
    else:
        cost(sequence, lookup)
    dec.close()


def cost(sequence: Callable[[], tuple[int, float, float, int]], lookup: Any) -> None:
    spent: dict[str, list[float]] = {"walk": [], "agreed": []}

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = f(*a, **k)
            spent[name].append(time.perf_counter() - t)
            return out
        return call

    lookup.LookupDraft._refollow = timed("walk", lookup.LookupDraft._refollow)
    lookup.LookupDraft.agreed = timed("agreed", lookup.LookupDraft.agreed)
    _, _, target_s, rounds = sequence()
    for name, xs in spent.items():
        if xs:
            print(f"{name:<7} {len(xs):5d} calls, median {statistics.median(xs) * 1e6:6.1f} us, "
                  f"p95 {sorted(xs)[int(0.95 * len(xs))] * 1e6:6.1f} us")
    total = sum(map(sum, spent.values()))
    print(f"{rounds} rounds, {target_s / rounds * 1e3:.1f} ms a verify pass; following "
          f"{total / rounds * 1e6:.0f} us a round, {total / target_s:.2%} of the target's time")


def ablate(sequence: Callable[[], tuple[int, float, float, int]], lookup: Any,
           reps: int, only: str | None) -> None:
    built = lookup.FOLLOW
    variants: dict[str, Callable[[], None]] = {
        "as built": lambda: None,
        "no splicing": lambda: setattr(lookup.LookupDraft, "agreed",
                                       lambda self, tokens, k: ([], "")),
        "FOLLOW 2": lambda: setattr(lookup, "FOLLOW", 2),
        "FOLLOW 8": lambda: setattr(lookup, "FOLLOW", 8),
        "nothing followed": lambda: setattr(lookup, "FOLLOW", 0),
    }
    if only:
        keep = {"as built", *(name.strip() for name in only.split(","))}
        if unknown := keep - set(variants):
            raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}")
        variants = {name: change for name, change in variants.items() if name in keep}
    agreed = lookup.LookupDraft.agreed
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps):
        for name, change in variants.items():
            change()
            try:
                tokens, seconds, _, _ = sequence()
            finally:
                lookup.FOLLOW, lookup.LookupDraft.agreed = built, agreed
            rates[name].append(tokens / seconds)
            print(f"rep {rep + 1}/{reps} {name}: {tokens / seconds:.1f} tok/s", flush=True)
    for name, xs in rates.items():
        ratios = [x / b for x, b in zip(xs, rates["as built"])]
        print(f"{name:<17} {statistics.median(xs):6.1f} tok/s   / as built "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
