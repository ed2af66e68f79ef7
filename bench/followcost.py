"""What following earlier replies costs per round, beside a target step.

Runs the built-in request sequence (specllama/prompts/requests.jsonl) once, greedy, in
the default mode, each request drafting from the ones before, and times the two calls
following makes: walking the followed replies along the committed tokens each round
(`LookupDraft._refollow`) and, inside model drafts, finding what they agree on next
(`LookupDraft.agreed`, once per drawn token).

    python bench/followcost.py                  # smollm2-f32
    python bench/followcost.py --pair smollm2

Run it on an otherwise idle machine.
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
    from specllama.engine.lookup import LookupDraft
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-f32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    spent: dict[str, list[float]] = {"walk": [], "agreed": []}

    def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = f(*a, **k)
            spent[name].append(time.perf_counter() - t)
            return out
        return call

    LookupDraft._refollow = timed("walk", LookupDraft._refollow)  # type: ignore[method-assign]
    LookupDraft.agreed = timed("agreed", LookupDraft.agreed)  # type: ignore[method-assign]
    target, draft = resolve_pair(find_and_load_config().pair(args.pair))
    dec = SpeculativeDecoder.load(target, draft, n_ctx=2048, n_threads=args.threads)
    prompts = [dec.target.prompt(p.prompt, chat=True) for p in builtin_prompts("requests")]
    dec.suffix_cache.forget_session()
    rounds, target_s = 0, 0.0
    for prompt in prompts:
        out = dec.generate(prompt, max_tokens=args.max_tokens, draft_max="auto",
                           sampling=SamplingParams(0.0, seed=1))
        rounds += out.stats.target_steps
        target_s += out.stats.target_s
    dec.close()
    for name, xs in spent.items():
        if xs:
            print(f"{name:<7} {len(xs):5d} calls, median {statistics.median(xs) * 1e6:6.1f} us, "
                  f"p95 {sorted(xs)[int(0.95 * len(xs))] * 1e6:6.1f} us")
    total = sum(map(sum, spent.values()))
    print(f"{rounds} rounds, {target_s / rounds * 1e3:.1f} ms a verify pass; following "
          f"{total / rounds * 1e6:.0f} us a round, {total / target_s:.2%} of the target's time")


if __name__ == "__main__":
    main()
