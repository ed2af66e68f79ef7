"""Auto against every fixed draft length on laptop-class costs, simulated (no model).

    python -m bench.laptop                   # both tables, markdown on stdout
    python -m bench.laptop --mode parallel   # one of them
    python -m bench.laptop --wait            # drafting ahead waits for its step in flight
    python -m bench.laptop --tuning stop_rule_cap=12   # auto with other AutoTuning

The costs are measured ones (bench/laptop_curves.json): T(k), a decode of k tokens, of
Llama 3.1 8B-shaped targets (Q4_K_M on 16, 8 and 4 threads, Q4_0 on 16 and 8, Q8_0 on
16) and of two drafts, Qwen2.5 0.5B-shaped Q8_0 and Llama 3.2 1B-shaped Q4_K_M, on a
16-core Intel Xeon (Sapphire Rapids class), with llama-bench `-p 1,2,3,4,6,8,16 -n 0
-r 3` on random-weight GGUFs of those shapes. The generations are harness/simulated.py's:
greedy drafts accepted at rate alpha, where the draft's confidence tells which will
match ("c") or says nothing ("n"), 16 texts of 256 tokens; each workload's texts run as
calls of one decoder, as bench/ablation.py runs them, with the loop's noise and our own
overhead as simulated there. Each cell is a speedup over the target alone on the same
threads (parallel: on all 16); k=0 is the target alone (parallel: on its own threads).

How the unmeasured costs are made (the assumptions, in one place):
- T(k) between measured k (5, 7, 9-15; 3 and 6 for Q4_0 and Q8_0): linear between the
  measured neighbours; measured points are kept as they are, even where T(3) < T(2).
- T(k) on a thread count between two measured ones: linear in 1 / threads, k by k.
- A draft step drawn in turn: the 0.5B draft's 8-thread step (9.2 ms, 0.11 of the
  8B Q4_K_M's 16-thread step) on 8 threads or more (the draft may run on 8 of 16), on
  4 threads that times the 1B draft's 4-thread/8-thread ratio; the 1B draft's own
  step as measured. A catch-up: T(2) - T(1) of the draft a token; a round's first
  step costs 0.2 of a step more (the F32 pair's measured ratio; no round loop ran).
- Drafting ahead (`parallel`): the target verifies on 16 - n threads, n the draft's
  (split.candidates(16)); the draft's step there is its 8-thread step times 8 / n
  (perfect scaling, and no memory bandwidth shared between the two models: both
  favour drafting ahead). A round opens with the tokens drawn ahead where the round
  before accepted every draft and the target's own token was the draft's next guess:
  those that fit in the target's verification after that guess (the engine does not
  top them up in turn); other rounds draw in turn, on all 16 threads.
- Auto is calibrated on the very curves the simulated loop runs on.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.lib.common import parser, run
from harness.simulated import Machine, Text, auto_calls, fixed_speedups, texts_for
from specllama.engine.loop.events import RoundVerified
from specllama.policy import AutoDraftLength, AutoTuning
from specllama.policy.calibration import CostCurve
from specllama.policy.split import candidates

CURVES = json.loads(Path(__file__).with_name("laptop_curves.json").read_text())["ms"]
MAX_N = 16  # T(1..16): auto verifies at most 16 tokens (TARGET_MAX_N)
#: The fixed draft lengths; 0 is the target alone (drafting ahead: on its own threads).
FIXED = range(0, 13)
ALPHAS = (0.6, 0.7, 0.8, 0.9)
#: The targets drafting in turn: (model, threads).
SERIAL = [("llama8b-q4_k_m", 16), ("llama8b-q4_k_m", 8), ("llama8b-q4_k_m", 4),
          ("llama8b-q4_0", 16), ("llama8b-q4_0", 8), ("llama8b-q8_0", 16)]
#: The targets drafting ahead on 16 threads (Q8_0 has no 8-thread curve to go between).
PARALLEL = ["llama8b-q4_k_m", "llama8b-q4_0"]
DRAFTS = {"qwen05-q8_0": "0.5B Q8_0", "llama1b-q4_k_m": "1B Q4_K_M"}
THREADS = 16
WAKE = 0.2  # a round's first draft step's extra, per step (the F32 pair's 2.5 / 12.5 ms)
#: Auto must come within 5% of the best fixed draft length.
NEAR = 0.95


# ------------------------------------------------------------------------------ costs


def interpolate(points: dict[int, float], max_n: int = MAX_N) -> tuple[float, ...]:
    """T(1..max_n) from measured T(k): linear between measured neighbours (linear
    extrapolation past the last), the measured ones as they are."""
    ms = {k: v * 1e-3 for k, v in points.items()}
    return tuple(s * 1e3 for s in CostCurve.from_points(ms, max_n).seconds)


def between_threads(lo: Sequence[float], hi: Sequence[float], lo_threads: int,
                    hi_threads: int, threads: int) -> tuple[float, ...]:
    """T(k) on `threads`, from the curves on lo_threads and hi_threads around it: linear
    in 1 / threads (the work of a decode shared among them), k by k."""
    w = (1 / threads - 1 / hi_threads) / (1 / lo_threads - 1 / hi_threads)
    return tuple(h + w * (lw - h) for lw, h in zip(lo, hi, strict=True))


def measured(model: str) -> dict[int, dict[int, float]]:
    """threads -> {k: T(k) ms} as measured."""
    return {int(t): {int(k): v for k, v in pts.items()} for t, pts in CURVES[model].items()}


def curve(model: str, threads: int) -> tuple[float, ...]:
    """T(1..16) ms of `model` on `threads`: measured, or between the measured thread
    counts around it."""
    known = measured(model)
    if threads in known:
        return interpolate(known[threads])
    lo = max(t for t in known if t < threads)
    hi = min(t for t in known if t > threads)
    return between_threads(interpolate(known[lo]), interpolate(known[hi]), lo, hi, threads)


def draft_step(draft: str, threads: int) -> tuple[float, float]:
    """A draft step drawn in turn on `threads` and a catch-up a token, ms (module
    docstring)."""
    known = measured(draft)
    if draft == "qwen05-q8_0":
        pts = known[8]
        scale = 1.0 if threads >= 8 else measured("llama1b-q4_k_m")[threads][1] / \
            measured("llama1b-q4_k_m")[8][1]
    else:
        pts, scale = known[threads], 1.0
    return pts[1] * scale, (pts[2] - pts[1]) * scale


def serial_machine(target: str, threads: int, draft: str) -> Machine:
    step, catch_up = draft_step(draft, threads)
    return Machine(curve(target, threads), step, WAKE * step, catch_up)


def parallel_machine(target: str, draft: str, draft_threads: int, wait: bool = False,
                     ) -> Machine:
    """The target on THREADS - draft_threads while the draft draws ahead on the rest;
    drafts drawn in turn on every thread; the speedup over the target alone on all."""
    step, catch_up = draft_step(draft, THREADS)
    ahead = draft_step(draft, 8)[0] * 8 / draft_threads
    return Machine(curve(target, THREADS - draft_threads), step, WAKE * step, catch_up,
                   alone_ms=curve(target, THREADS)[0], ahead_step_ms=ahead, ahead_wait=wait)


# ------------------------------------------------------------------------------ runs


class Watched:
    """A policy, and the drafts of its rounds counted (auto's mean draft length)."""

    def __init__(self, policy: AutoDraftLength, seen: list[int]) -> None:
        self.policy, self.seen = policy, seen

    def choose(self, source: str = "model") -> int:
        return self.policy.choose(source)

    def extend(self, j: int, confidence: float):  # noqa: ANN201 - the policy's DraftStep
        return self.policy.extend(j, confidence)

    def observe(self, outcome: RoundVerified) -> None:
        if outcome.k:
            self.seen.append(outcome.k)
        self.policy.observe(outcome)


def auto_run(texts: list[Text], machine: Machine, tuning: AutoTuning | None = None,
             ) -> tuple[float, float]:
    """Auto's mean speedup over the texts, run as calls of one decoder calibrated on the
    machine's own curve and draft step, and its mean draft (rounds that drafted)."""
    seen: list[int] = []
    speedup = auto_calls(texts, tuning, machine, watch=lambda policy: Watched(policy, seen))
    return speedup, statistics.mean(seen) if seen else 0.0


@dataclass(frozen=True)
class Row:
    label: str  # the workload's cells before the figures
    auto: float
    auto_k: float
    fixed: dict[int, float]

    @property
    def best_k(self) -> int:
        return max(self.fixed, key=self.fixed.__getitem__)

    @property
    def best(self) -> float:
        return self.fixed[self.best_k]

    @property
    def ratio(self) -> float:
        return self.auto / self.best

    def cells(self) -> str:
        fixed = " | ".join(f"{self.fixed[k]:.2f}" for k in FIXED)
        return (f"| {self.label} | {self.auto:.3f} | {self.auto_k:.1f} | {fixed} | "
                f"{self.best_k} | {self.ratio:.3f} |")


def measure(label: str, texts: list[Text], machine: Machine, tuning: AutoTuning) -> Row:
    auto, auto_k = auto_run(texts, machine, tuning)
    return Row(label, auto, auto_k, fixed_speedups(texts, FIXED, machine=machine))


def workloads() -> Iterable[tuple[float, bool]]:
    return ((a, c) for a in ALPHAS for c in (True, False))


def serial_rows(count: int, tuning: AutoTuning) -> Iterable[Row]:
    for target, threads in SERIAL:
        for draft, name in DRAFTS.items():
            m = serial_machine(target, threads, draft)
            for alpha, tells in workloads():
                label = (f"{target.removeprefix('llama8b-').upper()} | {threads} | {name} | "
                         f"{alpha:.1f}{'c' if tells else 'n'}")
                yield measure(label, texts_for(alpha, tells, count=count), m, tuning)


def parallel_rows(count: int, wait: bool, tuning: AutoTuning) -> Iterable[Row]:
    for target in PARALLEL:
        for n in candidates(THREADS):
            for draft, name in DRAFTS.items():
                m = parallel_machine(target, draft, n, wait)
                for alpha, tells in workloads():
                    label = (f"{target.removeprefix('llama8b-').upper()} | {THREADS - n}+{n} | "
                             f"{name} | {alpha:.1f}{'c' if tells else 'n'}")
                    yield measure(label, texts_for(alpha, tells, count=count), m, tuning)


def table(title: str, rows: Iterable[Row]) -> None:
    print(f"\n### {title}\n")
    print("| target | threads | draft | alpha | auto | auto's k | "
          + " | ".join(f"k={k}" for k in FIXED) + " | best k | auto / best |")
    print("| --- | ---: | --- | --- |" + " ---: |" * (len(FIXED) + 4))
    ratios = []
    for row in rows:
        print(row.cells(), flush=True)
        ratios.append(row.ratio)
    below = sum(r < NEAR for r in ratios)
    print(f"\nauto / best fixed: worst {min(ratios):.3f}, mean {statistics.mean(ratios):.3f}, "
          f"{below} of {len(ratios)} below {NEAR}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--mode", choices=("serial", "parallel", "both"), default="both")
    p.add_argument("--texts", type=int, default=16,
                   help="texts of 256 tokens per workload (default: %(default)s)")
    p.add_argument("--wait", action="store_true",
                   help="drafting ahead: the round waits for the draft's step in flight")
    p.add_argument("--tuning", default="", metavar="SPEC",
                   help="auto's AutoTuning changes, name=value,... (as SPECLLAMA_AUTO_TUNING)")
    args: argparse.Namespace = p.parse_args()
    tuning = AutoTuning.parse(args.tuning)
    if args.mode in ("serial", "both"):
        table("Drafting in turn", serial_rows(args.texts, tuning))
    if args.mode in ("parallel", "both"):
        table("Drafting ahead (target + draft threads)", parallel_rows(args.texts, args.wait,
                                                                       tuning))


if __name__ == "__main__":
    run(main)
