"""Each mechanism of the auto policy switched off in turn, on simulated generations.

    python -m bench.ablation                 # every switch, markdown table on stdout
    python -m bench.ablation "my try:probe_k=1,upper_z=1"   # extra rows, AutoTuning syntax

The workloads are those of tests/test_policy.py (bench/lib/simulated.py): greedy drafts on
the F32 pair's measured loop costs, accepted at rate alpha, where the draft model's
confidence tells which drafts match ("c") or says nothing ("n"), two with 3% of decodes
slowed tenfold by another process ("s") and two whose calibration put T(1) 20% too high
("m"); 24 texts of 256 tokens each (the test's 8, and 16 more for less noise). A
workload's texts run as calls of one decoder (the auto state carries over between them,
as in a bench). Each cell is auto's speedup with the switch, relative to the full
policy's; the head rows give the full policy's and the best fixed k's speedup over the
target alone. Hybrid drafting's numbers (decline_margin, long_match, the lookup priors)
do not show here: only model drafts are simulated. The same switches reach real runs
through SPECLLAMA_AUTO_TUNING (bench/README.md); bench/ablation_real.py runs them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from types import SimpleNamespace

from bench.lib.common import parser, run
from bench.lib.simulated import (
    F32_CALIBRATED_MS,
    F32_DRAFT_CURVE,
    Text,
    fixed_speedups,
    simulate,
    texts_for,
)
from specllama.policy import AutoDraftLength, AutoState, AutoTuning
from specllama.policy.calibration import CostCurve

Workload = tuple[float, bool, float, float]

SWITCHES = [
    ("no probes", "probe_k=0"),
    ("no stop rule (drafts run to k)", "stop_rule_cap=0"),
    ("no shadow acceptance", "shadow=off"),
    ("no confidence prediction", "confidence_evidence=inf"),
    ("catch-up not priced on resume", "resume_horizon=inf"),
    ("no hysteresis (keep_margin = margin)", "keep_margin=0.03"),
    ("no upper bound on probes", "upper_z=inf"),
    ("no plain reference rounds", "reference_every=1000000000"),
    ("no spike cap", "spike=1e9,spike_first=1e9"),
    ("no fast first rounds", "first_rounds=0"),
    ("no averaging of first decodes", "average_first=0"),
    ("nothing carried to the next call", "carry_over=0"),
    ("everything carried to the next call", "carry_over=1"),
    ("margin 0", "margin=0"),
]
#: (alpha, the draft's confidence tells, the share of decodes another process slows
#: tenfold, the calibration's T(1) over the loop's): "s", a machine that is not idle;
#: "m", a calibration that put T(1) 20% too high (taken on a busy machine).
WORKLOADS: list[Workload] = [(alpha, informative, 0.0, 1.0) for informative in (True, False)
             for alpha in (0.55, 0.65, 0.75, 0.85, 0.95)] + [
    (0.75, True, 0.03, 1.0), (0.85, True, 0.03, 1.0),
    (0.65, True, 0.0, 1.2), (0.75, True, 0.0, 1.2)]


def calls(texts: list[Text], tuning: AutoTuning, spikes: float = 0.0,
          t1_off: float = 1.0) -> float:
    """Auto's mean speedup over the texts, run as calls of one decoder."""
    calibrated = [F32_CALIBRATED_MS[0] * t1_off, *F32_CALIBRATED_MS[1:]]

    class Decoder:  # what AutoDraftLength.for_decoder reads
        target = SimpleNamespace(others=0, companions=0)  # alone in its batches
        policy_state = {"auto": AutoState(CostCurve(tuple(x * 1e-3 for x in calibrated)),
                                          F32_DRAFT_CURVE, tuning=tuning)}

    return statistics.mean(simulate(AutoDraftLength.for_decoder(Decoder()), t, seed=s,
                                    spikes=spikes) for s, t in enumerate(texts))


def workload_name(w: Workload) -> str:
    """'0.75c', '0.85cs', '0.65cm': alpha, then c/n, s (slowed decodes), m (calibration off)."""
    alpha, informative, spikes, t1_off = w
    return (f"{alpha:.2f}{'c' if informative else 'n'}{'s' if spikes else ''}"
            f"{'m' if t1_off != 1 else ''}")


def switch_row(label: str, spec: str, switched: Sequence[float], full: Sequence[float]) -> str:
    """A switch's row: each workload's speedup relative to the full policy's, then the
    worst and the best of them."""
    rel = [s / f - 1 for s, f in zip(switched, full, strict=True)]
    cells = " | ".join(f"{r:+.1%}" for r in rel)
    return f"| {label} (`{spec}`) | {cells} | {min(rel):+.1%} | {max(rel):+.1%} |"


def main() -> None:
    p = parser(__doc__)
    p.add_argument("switch", nargs="*", help="an extra row, LABEL:AutoTuning spec")
    extra = p.parse_args().switch
    switches = SWITCHES + [tuple(arg.split(":", 1)) for arg in extra]  # type: ignore[misc]
    texts = {w: texts_for(w[0], w[1], count=24) for w in WORKLOADS}
    full = [calls(texts[w], AutoTuning(), w[2], w[3]) for w in WORKLOADS]
    best = [max(1.0, *fixed_speedups(texts[w], spikes=w[2]).values()) for w in WORKLOADS]
    print("| switch (AutoTuning) | " + " | ".join(map(workload_name, WORKLOADS))
          + " | worst | best |")
    print("| --- |" + " ---: |" * (len(WORKLOADS) + 2))
    print("| full policy, x target alone | " + " | ".join(f"{x:.3f}" for x in full) + " | | |")
    print("| best fixed k (or 1), x target alone | " + " | ".join(f"{x:.3f}" for x in best)
          + " | | |")
    for label, spec in switches:
        tuning = AutoTuning.parse(spec)
        switched = [calls(texts[w], tuning, w[2], w[3]) for w in WORKLOADS]
        print(switch_row(label, spec, switched, full), flush=True)


if __name__ == "__main__":
    run(main)
