"""Ratios over a request sequence from a `specllama bench --carry --json` report.

Each repetition of a `--carry` bench runs the prompts in order as one sequence of
requests per mode, each drafting from the outputs before it. This prints, per mode,
tokens per second over the requests from the n-th on (tokens / generation time, per
repetition), and every mode's ratio against the others: median [min-max] over the
repetitions, with acceptance by origin.

    specllama bench --pair smollm2-f32 --prompts requests --carry \\
        --modes target,context,auto --reps 3 --json seq.json
    python bench/sequence.py seq.json            # requests 3 to the last
    python bench/sequence.py seq.json --from 1
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--from", dest="first", type=int, default=3,
                    help="the first request counted (1-based; default 3)")
    args = ap.parse_args()
    report = json.load(open(args.report))
    order = [p["id"] for p in report["prompts"]]
    counted = set(order[args.first - 1:])
    tokens: dict[tuple[str, int], int] = defaultdict(int)
    seconds: dict[tuple[str, int], float] = defaultdict(float)
    drafted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    accepted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for run in report["runs"]:
        if run["prompt"] not in counted:
            continue
        key = (run["mode"], run["rep"])
        tokens[key] += run["tokens"]
        seconds[key] += run["generate_s"]
        for origin, n in run["origin_drafted"].items():
            drafted[run["mode"]][origin] += n
        for origin, n in run["origin_accepted"].items():
            accepted[run["mode"]][origin] += n
    modes = list(dict.fromkeys(m for m, _ in tokens))
    reps = sorted({r for _, r in tokens})
    rate = {k: tokens[k] / seconds[k] for k in tokens}
    print(f"{report['settings']['target']}: requests {args.first}-{len(order)}, "
          f"{len(reps)} repetitions, T = {report['settings']['sampling']['temperature']}")
    for m in modes:
        rates = [rate[(m, r)] for r in reps]
        origins = ", ".join(f"{o} {accepted[m][o] / n:.0%} of {n}"
                            for o, n in sorted(drafted[m].items()) if n)
        print(f"  {m:<10} {statistics.median(rates):6.1f} tok/s "
              f"[{min(rates):.1f}-{max(rates):.1f}]" + (f"  lookups: {origins}" if origins
                                                         else ""))
    for i, a in enumerate(modes):
        for b in modes[:i]:
            ratios = [rate[(a, r)] / rate[(b, r)] for r in reps]
            print(f"  {a} / {b}: {statistics.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
