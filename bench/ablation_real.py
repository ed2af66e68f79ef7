"""auto's mechanisms switched off in turn on a real pair: `specllama bench` runs of the
target alone and auto, one per switch and repetition, repetitions interleaved.

    python -m bench.ablation_real --pair smollm2-f32 --temperature 0 --reps 3
    python -m bench.ablation_real --pair smollm2 --switch "no spike cap:spike=1e9,spike_first=1e9"

Each run sets SPECLLAMA_AUTO_TUNING (bench/README.md) for one switch; its figure is auto's
speedup over the target alone in the same run (the bench's geometric mean over the
built-in prompts of paired ratios, which cancels the machine's drift). The table gives
min/median/max over the repetitions and the median relative to the full policy's.
Run it on an idle machine; the switches that bench/ablation.py shows on simulated
generations are its default rows, plus those the simulation cannot show.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.lib.common import (
    SPECLLAMA,
    Spread,
    add_pair_options,
    add_run_options,
    model_flags,
    parser,
)
from bench.lib.common import run as run_script

SWITCHES = [
    ("full policy", ""),
    ("no probes", "probe_k=0"),
    ("no stop rule", "stop_rule_cap=0"),
    ("no shadow acceptance", "shadow=off"),
    ("no spike cap", "spike=1e9,spike_first=1e9"),
    ("no averaging of first decodes", "average_first=0"),
    ("no plain reference rounds", "reference_every=1000000000"),
    ("lookup,model: decline a lookup on any advantage", "decline_margin=0"),
]


def auto_ratio(report: dict[str, Any]) -> float:
    """auto / target alone in a `specllama bench --json` report."""
    return float(report["summary"]["overall"]["auto"]["vs_target_geomean"])


def run(args: argparse.Namespace, seed: int, spec: str, out: Path) -> float:
    """auto / target alone in one bench run with this tuning."""
    env = dict(os.environ, SPECLLAMA_AUTO_TUNING=spec)
    subprocess.run(
        [*SPECLLAMA, "bench", *model_flags(args), "--modes", "target,auto", "--reps", "1",
         "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
         "--seed", str(seed), "--threads", str(args.threads), "--json", str(out)],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return auto_ratio(json.loads(out.read_text()))


def table(switches: list[tuple[str, str]], ratios: dict[str, list[float]]) -> list[str]:
    """Per switch: auto / target alone over the repetitions, and its median against the
    full policy's."""
    full = Spread.of(ratios["full policy"]).median
    out = ["| switch | auto / target min / median / max | median vs full |", "| --- | --- | ---: |"]
    for label, spec in switches:
        s = Spread.of(ratios[label])
        name = f"{label} (`{spec}`)" if spec else label
        out.append(f"| {name} | {s.slashed()} | {s.median / full - 1:+.1%} |")
    return out


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p)
    add_run_options(p, reps=3, max_tokens=128, temperature=0.0)
    p.add_argument("--switch", action="append", default=[],
                   help="an extra row, LABEL:AutoTuning spec")
    args = p.parse_args()
    switches = SWITCHES + [tuple(s.split(":", 1)) for s in args.switch]
    ratios: dict[str, list[float]] = {label: [] for label, _ in switches}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for label, spec in switches:
                ratios[label].append(run(args, rep, spec, Path(tmp) / "run.json"))
                print(f"rep {rep + 1} {label}: {ratios[label][-1]:.3f}x", file=sys.stderr,
                      flush=True)
    print(f"{args.target or args.pair}, T = {args.temperature}, {args.reps} repetitions, "
          f"{args.max_tokens} tokens")
    print("\n".join(table(switches, ratios)))


if __name__ == "__main__":
    run_script(main)
