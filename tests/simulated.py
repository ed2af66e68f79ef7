"""Simulated greedy generations on the F32 pair's measured costs: what the auto policy
is tested on (tests/test_policy.py) and what bench/ablation.py switches mechanisms
off in. No model is loaded: each token says whether the draft's guess there is the
target's and how sure the draft model was."""

from __future__ import annotations

import random
import statistics

from specllama.engine.drafting.base import ModelWork, Source
from specllama.engine.loop.events import RoundVerified
from specllama.policy import AutoDraftLength, AutoState, AutoTuning, FixedDraftLength
from specllama.policy.calibration import CostCurve

#: Measured in the round loop on the F32 pair (AMD EPYC, 2 threads, contexts of 100-300
#: tokens): T(n) in ms, a draft step, a round's first step's extra, a catch-up per token.
F32_LOOP_MS = [37, 48, 51, 56, 63, 66, 70, 73] + [73 + 5 * i for i in range(1, 9)]
F32_CALIBRATED_MS = [32.9, 41.9, 45.1, 48.6, 48.6, 56.2, 60.4, 64.6, 69, 73, 77, 81, 86, 91,
                     96, 101]
F32_STEP_MS, F32_WAKE_MS, F32_CATCH_UP_MS, F32_CALIBRATED_STEP_MS = 12.5, 2.5, 2.6, 10.2
#: The draft model's calibrated decodes: a step, and a catch-up priced like the loop's.
F32_DRAFT_CURVE = CostCurve((F32_CALIBRATED_STEP_MS * 1e-3,
                             (F32_CALIBRATED_STEP_MS + F32_CATCH_UP_MS) * 1e-3))

Text = list[tuple[bool, float]]


def model_draft(policy, k: int, confidences) -> tuple[int, int]:
    """What ModelDraft drafts when the policy allows k: it asks `extend` at each row it
    reads, with the draft model's confidence there. Returns (drafted, rows read)."""
    drafted = rows = 0
    for j in range(k):
        rows += 1
        step = policy.extend(j, confidences[j])
        if step == "stop":
            break
        drafted += 1
        if step == "last":
            break
    return drafted, rows


def simulate(policy, text: Text, loop_ms=F32_LOOP_MS, step_ms=F32_STEP_MS, seed=0,
             spikes: float = 0.0) -> float:
    """Greedy generation of len(text) tokens; text[i] = (the draft's token at position i is
    the target's, the draft model's confidence there), what teacher forcing measures; the
    loop's costs with their noise. `spikes`: the share of decodes another process slows
    tenfold (a machine that is not idle). Returns the speedup over the target alone."""
    rng = random.Random(seed)

    def ms(x: float) -> float:
        slow = 10.0 if spikes and rng.random() < spikes else 1.0
        return x * 1e-3 * rng.lognormvariate(0, 0.08) * slow
    i, behind, total, paused = 0, 0, 0.0, []
    n = len(text)
    while i < n:
        k = min(policy.choose("model"), n - i - 1)
        k, rows = model_draft(policy, k, [c for _, c in text[i : i + k]])
        m = 0
        while m < k and text[i + m][0]:
            m += 1
        target_s, draft_s, steps_s, shadow, caught_up = ms(loop_ms[k]), 0.0, 0.0, (), 0
        if rows > 0:
            caught_up = behind
            first = step_ms + F32_WAKE_MS + (F32_CATCH_UP_MS * behind if behind > 1 else 0)
            steps_s = ms((rows - 1) * step_ms)
            draft_s = ms(first) + steps_s
            if behind > 1:
                shadow = tuple(float(text[p][0]) for p in paused[-64:])
            paused, behind = [], int(m == k)
        else:
            paused.append(i)
            behind += 1
        seconds = target_s + draft_s + (0.4 + 0.5 * k) * 1e-3
        policy.observe(outcome(k, m, "model", target_s, draft_s, seconds, shadow,
                                    steps_s, behind, caught_up,
                                    tuple(c for _, c in text[i : i + k]), rows))
        i += m + 1
        total += seconds
    return n * (loop_ms[0] + 0.4) * 1e-3 * (1 + 9 * spikes) / total


def outcome(k: int, accepted: int, source: Source = "model", target_s: float = 0.0,
            draft_s: float = 0.0, seconds: float = 0.0, shadow: tuple[float, ...] = (),
            draft_steps_s: float = 0.0, draft_behind: int = 0, draft_caught_up: int = 0,
            confidences: tuple[float, ...] = (), draft_rows: int = 0,
            forced: int = 0) -> RoundVerified:
    """The record of a round a policy sees: k drafts after `forced` forced ones (all
    accepted), `accepted` of the k accepted, and what it cost."""
    origin = "model" if source == "model" else "context"
    return RoundVerified(
        drafted=(0,) * (forced + k), origins=("forced",) * forced + (origin,) * k,
        accepted=forced + accepted, token=0,
        kind="plain" if forced + k == 0 else "bonus" if accepted == k else "correction",
        emitted=forced + accepted + 1, p=(), q=(), source=source, draft_s=draft_s,
        target_s=target_s, seconds=seconds, confidences=confidences,
        work=ModelWork(draft_rows, draft_steps_s, draft_caught_up, shadow),
        behind=draft_behind, forced=forced)


def texts_for(alpha: float, informative: bool, count: int = 8, n: int = 256) -> list[Text]:
    """Drafts that match at rate alpha; the draft model's confidence says which will
    (as measured on the F32 pair: P(match) about confidence + 0.15) or nothing."""
    rng = random.Random(int(alpha * 100) + informative)
    def token():
        c = rng.betavariate(4 * (alpha - 0.12), 4 * (1.12 - alpha))
        agree = rng.random() < (min(1.0, c + 0.12) if informative else alpha)
        return agree, c
    return [[token() for _ in range(n)] for _ in range(count)]


def f32_auto(tuning: AutoTuning | None = None) -> AutoDraftLength:
    ms = tuple(x * 1e-3 for x in F32_CALIBRATED_MS)
    return AutoDraftLength(AutoState(CostCurve(ms), F32_DRAFT_CURVE,
                                     tuning=tuning))


def auto_speedup(texts: list[Text], tuning: AutoTuning | None = None) -> float:
    """Auto's mean speedup over the target alone on these texts (a fresh policy each)."""
    return statistics.mean(simulate(f32_auto(tuning), t, seed=s) for s, t in enumerate(texts))


def fixed_speedups(texts: list[Text], ks=range(1, 7), spikes: float = 0.0) -> dict[int, float]:
    return {k: statistics.mean(simulate(FixedDraftLength(k), t, seed=s, spikes=spikes)
                               for s, t in enumerate(texts)) for k in ks}
