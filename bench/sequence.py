"""Ratios over a request sequence from a `specllama bench --carry --json` report.

Each repetition of a `--carry` bench runs the prompts in order as one sequence of
requests per mode, each drafting from the outputs before it. This prints, per mode,
tokens per second over the requests from the n-th on (tokens / generation time, per
repetition), and every mode's ratio against the others: median [min-max] over the
repetitions, with acceptance by origin.

    specllama bench --pair smollm2-f32 --prompts requests --carry \\
        --modes target,context,auto --reps 3 --json seq.json
    python -m bench.sequence seq.json            # requests 3 to the last
    python -m bench.sequence seq.json --from 1
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.common import Spread, parser, ratios, run


@dataclass
class Sequences:
    """The counted requests of a report, summed per (mode, repetition), and each mode's
    drafted and accepted tokens by origin."""

    tokens: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[tuple[str, int], float] = field(default_factory=lambda: defaultdict(float))
    drafted: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    accepted: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    @classmethod
    def of(cls, report: dict[str, Any], first: int) -> Sequences:
        """Requests `first` (1-based) to the last."""
        order = [p["id"] for p in report["prompts"]]
        counted = set(order[first - 1:])
        s = cls()
        for r in report["runs"]:
            if r["prompt"] not in counted:
                continue
            key = (r["mode"], r["rep"])
            s.tokens[key] += r["tokens"]
            s.seconds[key] += r["generate_s"]
            for origin, n in r["origin_drafted"].items():
                s.drafted[r["mode"]][origin] += n
            for origin, n in r["origin_accepted"].items():
                s.accepted[r["mode"]][origin] += n
        return s

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(m for m, _ in self.tokens))

    def rates(self, mode: str) -> list[float]:
        """Tokens per second of each repetition's sequence."""
        reps = sorted({r for _, r in self.tokens})
        return [self.tokens[(mode, r)] / self.seconds[(mode, r)] for r in reps]

    def lines(self) -> list[str]:
        out = []
        for m in self.modes:
            origins = ", ".join(f"{o} {self.accepted[m][o] / n:.0%} of {n}"
                                for o, n in sorted(self.drafted[m].items()) if n)
            rates = Spread.of(self.rates(m))
            out.append(f"  {m:<10} {rates.median:6.1f} tok/s [{rates.min:.1f}-{rates.max:.1f}]"
                       + (f"  lookups: {origins}" if origins else ""))
        for i, a in enumerate(self.modes):
            for b in self.modes[:i]:
                r = Spread.of(ratios(self.rates(a), self.rates(b)))
                out.append(f"  {a} / {b}: {r.median:.2f}x [{r.min:.2f}-{r.max:.2f}]")
        return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument("report", type=Path)
    p.add_argument("--from", dest="first", type=int, default=3,
                   help="the first request counted (1-based; default 3)")
    args = p.parse_args()
    report = json.loads(args.report.read_text())
    s = Sequences.of(report, args.first)
    reps = len({r for _, r in s.tokens})
    print(f"{report['settings']['target']}: requests {args.first}-{len(report['prompts'])}, "
          f"{reps} repetitions, T = {report['settings']['sampling']['temperature']}")
    print("\n".join(s.lines()))


if __name__ == "__main__":
    run(main)
