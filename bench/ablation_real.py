"""auto's mechanisms switched off in turn on a real pair: `specllama bench` runs of the
target alone and auto, one per switch and repetition, repetitions interleaved.

    python bench/ablation_real.py --pair smollm2-f32 --temperature 0 --reps 3
    python bench/ablation_real.py --pair smollm2 --switch "no spike cap:spike=1e9,spike_first=1e9"

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
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SWITCHES = [
    ("full policy", ""),
    ("no probes", "probe_k=0"),
    ("no stop rule", "stop_rule_cap=0"),
    ("no shadow acceptance", "shadow=off"),
    ("no spike cap", "spike=1e9,spike_first=1e9"),
    ("no averaging of first decodes", "average_first=0"),
    ("no plain reference rounds", "reference_every=1000000000"),
    ("hybrid: decline a lookup on any advantage", "decline_margin=0"),
]


def run(pair: str, temperature: float, max_tokens: int, seed: int, spec: str,
        out: Path) -> float:
    """auto / target alone in one bench run with this tuning."""
    env = dict(os.environ, SPECLLAMA_AUTO_TUNING=spec)
    subprocess.run(
        [sys.executable, "-c", "from specllama.cli import main; main()", "bench",
         "--pair", pair, "--modes",
         "target,auto", "--reps", "1", "--max-tokens", str(max_tokens), "--temperature",
         str(temperature), "--seed", str(seed), "--threads", "2", "--json", str(out)],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ratio = json.loads(out.read_text())["summary"]["overall"]["auto"]["vs_target_geomean"]
    return float(ratio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-f32")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--switch", action="append", default=[],
                    help="an extra row, LABEL:AutoTuning spec")
    args = ap.parse_args()
    switches = SWITCHES + [tuple(s.split(":", 1)) for s in args.switch]
    ratios: dict[str, list[float]] = {label: [] for label, _ in switches}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for label, spec in switches:
                out = Path(tmp) / "run.json"
                ratios[label].append(run(args.pair, args.temperature, args.max_tokens,
                                         rep, spec, out))
                print(f"rep {rep + 1} {label}: {ratios[label][-1]:.3f}x", file=sys.stderr,
                      flush=True)
    full = statistics.median(ratios["full policy"])
    print(f"{args.pair}, T = {args.temperature}, {args.reps} repetitions, "
          f"{args.max_tokens} tokens")
    print("| switch | auto / target min / median / max | median vs full |")
    print("| --- | --- | ---: |")
    for label, spec in switches:
        xs = ratios[label]
        med = statistics.median(xs)
        name = f"{label} (`{spec}`)" if spec else label
        print(f"| {name} | {min(xs):.3f} / {med:.3f} / {max(xs):.3f} | "
              f"{med / full - 1:+.1%} |")


if __name__ == "__main__":
    main()
