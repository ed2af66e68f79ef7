"""Following earlier replies on the request sequence: what it costs, and what it earns.

Runs the built-in request sequence (specllama/prompts/requests.jsonl) greedy, with the
default drafters (lookup,model), each request drafting from the answers before it (the
first two have none to follow, and are not counted).

    python -m bench.following                   # cost per round, smollm2-f32
    python -m bench.following --ablate --reps 5 # the same sequence with parts of it off
    python -m bench.following --ablate --reps 8 --variants "no splicing"

The cost: the time of the two calls following makes, walking the followed replies along
the committed tokens each round (`Following.refollow`) and, inside model drafts, finding
what they agree on next (`LookupDrafter.agreed`, once per drawn token), beside the
target's time. The ablation: tokens per second over requests 3-12 as built, with no
splicing into model drafts, with FOLLOW 2 and 8 replies followed, and with nothing
followed (the lookups before it), interleaved per repetition; each ratio against "as
built", median [min-max]. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.lib.common import (
    Spread,
    add_pair_options,
    add_run_options,
    load_decoder,
    parser,
    percentile,
    ratios,
    run,
)
from specllama.engine.drafting import following, lookup

#: (tokens, seconds, target seconds, rounds) of requests 3 to the last.
Sequence = Callable[[], tuple[int, float, float, int]]
#: What each variant changes: (object, attribute, value) set for its runs.
VARIANTS: dict[str, list[tuple[Any, str, Any]]] = {
    "as built": [],
    "no splicing": [(lookup.LookupDrafter, "agreed", lambda self, tokens, k: ([], "context"))],
    "FOLLOW 2": [(following, "FOLLOW", 2)],
    "FOLLOW 8": [(following, "FOLLOW", 8)],
    "nothing followed": [(following, "FOLLOW", 0)],
}


@contextlib.contextmanager
def changed(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """The attributes set while the block runs, then as they were."""
    before = [(obj, name, getattr(obj, name)) for obj, name, _ in changes]
    try:
        for obj, name, value in changes:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(before):
            setattr(obj, name, value)


def cost_lines(spent: dict[str, list[float]], target_s: float, rounds: int) -> list[str]:
    """Each call's count, median and p95; following's time a round and as a share of
    the target's."""
    out = [f"{name:<7} {len(xs):5d} calls, median {Spread.of(xs).median * 1e6:6.1f} us, "
           f"p95 {(percentile(xs, 95) or 0.0) * 1e6:6.1f} us" for name, xs in spent.items() if xs]
    total = sum(map(sum, spent.values()))
    out.append(f"{rounds} rounds, {target_s / rounds * 1e3:.1f} ms a verify pass; following "
               f"{total / rounds * 1e6:.0f} us a round, {total / target_s:.2%} of the "
               "target's time")
    return out


def ablation_lines(rates: dict[str, list[float]]) -> list[str]:
    """Each variant's tokens/s (median) and its ratio to "as built" within each
    repetition, median [min-max]."""
    return [f"{name:<17} {Spread.of(xs).median:6.1f} tok/s   / as built "
            f"{Spread.of(ratios(xs, rates['as built'])).bracket()}"
            for name, xs in rates.items()]


def cost(sequence: Sequence) -> None:
    spent: dict[str, list[float]] = {"walk": [], "agreed": []}

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = f(*a, **k)
            spent[name].append(time.perf_counter() - t)
            return out
        return call

    with changed([(following.Following, "refollow",
                   timed("walk", following.Following.refollow)),
                  (lookup.LookupDrafter, "agreed",
                   timed("agreed", lookup.LookupDrafter.agreed))]):
        _, _, target_s, rounds = sequence()
    print("\n".join(cost_lines(spent, target_s, rounds)))


def ablate(sequence: Sequence, reps: int, only: str | None) -> None:
    variants = VARIANTS
    if only:
        keep = {"as built", *(name.strip() for name in only.split(","))}
        if unknown := keep - set(variants):
            raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}")
        variants = {name: change for name, change in variants.items() if name in keep}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps):
        for name, changes in variants.items():
            with changed(changes):
                tokens, seconds, _, _ = sequence()
            rates[name].append(tokens / seconds)
            print(f"rep {rep + 1}/{reps} {name}: {tokens / seconds:.1f} tok/s", flush=True)
    print("\n".join(ablation_lines(rates)))


def main() -> None:
    from specllama import SamplingParams
    from specllama.cli.bench_command.prompts import builtin_prompts

    p = parser(__doc__)
    add_pair_options(p)
    add_run_options(p, reps=3, max_tokens=96)
    p.add_argument("--ablate", action="store_true")
    p.add_argument("--variants", help="with --ablate: a comma-separated subset, e.g. "
                                      "'as built,no splicing' (default: all)")
    args = p.parse_args()
    dec = load_decoder(args, n_ctx=2048)
    prompts = [dec.target.prompt(q.prompt, chat=True) for q in builtin_prompts("requests")]
    dec.generate(prompts[0], max_tokens=8, draft_max=0)  # page the weights in

    def sequence() -> tuple[int, float, float, int]:
        dec.draft_cache.forget_session()
        tokens, seconds, target_s, rounds = 0, 0.0, 0.0, 0
        for i, prompt in enumerate(prompts):
            s = dec.generate(prompt, max_tokens=args.max_tokens, draft_max="auto",
                             sampling=SamplingParams(0.0, seed=1)).stats
            if i >= 2:
                tokens, seconds = tokens + s.tokens, seconds + s.generate_s
                target_s, rounds = target_s + s.target_s, rounds + s.target_steps
        return tokens, seconds, target_s, rounds

    if args.ablate:
        ablate(sequence, args.reps, args.variants)
    else:
        cost(sequence)
    dec.close()


if __name__ == "__main__":
    run(main)
