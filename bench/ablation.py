"""Each mechanism of the auto policy switched off in turn, on simulated generations.

    python -m bench.ablation                 # every switch, markdown table on stdout
    python -m bench.ablation "my try:probe_k=1,upper_z=1"   # extra rows, AutoTuning syntax

The workloads are those of tests/test_policy.py (harness/simulated.py): greedy drafts on
the F32 pair's measured loop costs, accepted at rate alpha, where the draft model's
confidence tells which drafts match ("c") or says nothing ("n"), two with 3% of decodes
slowed tenfold by another process ("s") and two whose calibration put T(1) 20% too high
("m"); 24 texts of 256 tokens each (the test's 8, and 16 more for less noise); and two
of the synthetic Qwen3.5's MTP layer on its costs, 48-token texts accepted 97% of the
time whatever its confidence ("mtp": harness/simulated.py, copy_head_texts). A
workload's texts run as calls of one decoder (the auto state carries over between them,
as in a bench). Each cell is auto's speedup with the switch, relative to the full
policy's; the head rows give the full policy's and the best fixed k's speedup over the
target alone. Hybrid drafting's numbers (decline_margin, long_match, the lookup priors)
do not show here: only model drafts are simulated. The same switches reach real runs
through SPECLLAMA_AUTO_TUNING (bench/README.md); bench/ablation_real.py runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.lib.common import parser, run
from harness.simulated import (
    F32,
    F32_CALIBRATED_MS,
    F32_DRAFT_CURVE,
    QWEN35_MTP,
    Machine,
    Text,
    auto_calls,
    copy_head_texts,
    fixed_speedups,
    texts_for,
)
from specllama.policy import AutoState, AutoTuning
from specllama.policy.calibration import CostCurve

Workload = tuple[float, bool, float, float, bool]

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
    ("no curve fit of confidence", "confidence_fit=off"),
    ("no probe again after one that held", "probe_again=off"),
]
#: (alpha, the draft's confidence tells, the share of decodes another process slows
#: tenfold, the calibration's T(1) over the loop's, a near-copy MTP layer): "s", a machine
#: that is not idle; "m", a calibration that put T(1) 20% too high (taken on a busy
#: machine); "mtp", the synthetic Qwen3.5's MTP layer on its costs, 48-token texts, its
#: confidence flat (greedy) or spread ("T0.8"; it tells nothing either way).
WORKLOADS: list[Workload] = [(alpha, informative, 0.0, 1.0, False)
                             for informative in (True, False)
                             for alpha in (0.55, 0.65, 0.75, 0.85, 0.95)] + [
    (0.75, True, 0.03, 1.0, False), (0.85, True, 0.03, 1.0, False),
    (0.65, True, 0.0, 1.2, False), (0.75, True, 0.0, 1.2, False),
    (0.97, False, 0.0, 1.0, True), (0.97, True, 0.0, 1.0, True)]


def machine_of(w: Workload) -> Machine:
    return QWEN35_MTP if w[4] else F32


def texts_of(w: Workload) -> list[Text]:
    return copy_head_texts(w[0], w[1], count=24) if w[4] else texts_for(w[0], w[1], count=24)


def calls(texts: list[Text], tuning: AutoTuning, spikes: float = 0.0,
          t1_off: float = 1.0, machine: Machine = F32) -> float:
    """Auto's mean speedup over the texts, run as calls of one decoder."""
    state = None
    if machine is F32:
        calibrated = [F32_CALIBRATED_MS[0] * t1_off, *F32_CALIBRATED_MS[1:]]
        state = AutoState(CostCurve(tuple(x * 1e-3 for x in calibrated)), F32_DRAFT_CURVE,
                          tuning=tuning)
    return auto_calls(texts, tuning, machine, spikes, state)


def workload_name(w: Workload) -> str:
    """'0.75c', '0.85cs', '0.65cm': alpha, then c/n, s (slowed decodes), m (calibration off);
    'mtp 0.97 greedy' / 'mtp 0.97 T0.8'."""
    alpha, informative, spikes, t1_off, mtp = w
    if mtp:
        return f"mtp {alpha:.2f} {'T0.8' if informative else 'greedy'}"
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
    texts = {w: texts_of(w) for w in WORKLOADS}
    full = [calls(texts[w], AutoTuning(), w[2], w[3], machine_of(w)) for w in WORKLOADS]
    best = [max(1.0, *fixed_speedups(texts[w], spikes=w[2], machine=machine_of(w)).values())
            for w in WORKLOADS]
    print("| switch (AutoTuning) | " + " | ".join(map(workload_name, WORKLOADS))
          + " | worst | best |")
    print("| --- |" + " ---: |" * (len(WORKLOADS) + 2))
    print("| full policy, x target alone | " + " | ".join(f"{x:.3f}" for x in full) + " | | |")
    print("| best fixed k (or 1), x target alone | " + " | ".join(f"{x:.3f}" for x in best)
          + " | | |")
    for label, spec in switches:
        tuning = AutoTuning.parse(spec)
        switched = [calls(texts[w], tuning, w[2], w[3], machine_of(w)) for w in WORKLOADS]
        print(switch_row(label, spec, switched, full), flush=True)


if __name__ == "__main__":
    run(main)
