"""Simulated greedy generations on the F32 pair's measured costs: what the auto policy
is tested on (tests/test_policy.py) and what bench/ablation.py switches mechanisms
off in; bench/laptop.py gives them other machines' costs (`Machine`), drafting in turn
or ahead. No model is loaded: each token says whether the draft's guess there is the
target's and how sure the draft model was."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

from specllama.engine.decoder import AHEAD_MAX
from specllama.engine.drafting.base import ModelWork, Origin, Source
from specllama.engine.loop.events import RoundVerified
from specllama.engine.loop.lengths import PolicyHost
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


@dataclass(frozen=True)
class Machine:
    """What a simulated round loop's decodes cost, in ms: the target's T(n), n = 1..16, as
    the loop meets them; a draft step drawn in turn; a round's first step's extra (w_d);
    a catch-up, per token the draft model missed; and the target alone's T(1), what the
    speedup is over (None: T(1) of loop_ms). ahead_step_ms > 0: the draft model draws
    ahead on threads of its own while the target verifies (engine/drafting/ahead.py),
    one token each ahead_step_ms, at most ahead_max (the first a guess of the target's
    own token); ahead_wait: the round waits for the ahead step in flight, as the engine
    does (else it counts only the steps that fit in the target's decode)."""

    loop_ms: Sequence[float] = tuple(F32_LOOP_MS)
    step_ms: float = F32_STEP_MS
    wake_ms: float = F32_WAKE_MS
    catch_up_ms: float = F32_CATCH_UP_MS
    alone_ms: float | None = None
    ahead_step_ms: float = 0.0
    ahead_max: int = AHEAD_MAX
    ahead_wait: bool = False

    def drawn_ahead(self, verify_s: float) -> tuple[int, float]:
        """While the target verifies for verify_s: the tokens drawn ahead after the
        first (what the next draft may open with), and the seconds the round then waits
        for the step in flight."""
        step_s = self.ahead_step_ms * 1e-3
        fit = verify_s / step_s
        steps = min(self.ahead_max, math.ceil(fit) if self.ahead_wait else math.floor(fit))
        wait = max(0.0, steps * step_s - verify_s)
        return max(0, steps - 1), wait


F32 = Machine()
#: The synthetic Qwen3.5 2B layout drafted by its own MTP layer (Intel Xeon, 2 threads;
#: docs/lab/2026-12-hybrid-mtp.md): T(n) over a 119 ms step (n = 1..6 and 9 measured,
#: the rest interpolated), an MTP step 0.28 of it, its catch-up a guess.
QWEN35_MTP = Machine(loop_ms=tuple(119 * r for r in (
    1, 1.49, 1.80, 2.11, 2.40, 2.63, 2.80, 2.97, 3.13, 3.29, 3.45, 3.61, 3.77, 3.93, 4.09,
    4.25)), step_ms=30.0, wake_ms=2.0, catch_up_ms=8.0)


def simulate(policy, text: Text, machine: Machine = F32, seed=0, spikes: float = 0.0) -> float:
    """Greedy generation of len(text) tokens; text[i] = (the draft's token at position i is
    the target's, the draft model's confidence there), what teacher forcing measures; the
    loop's costs (`machine`: by default the F32 pair's) with their noise. `spikes`: the
    share of decodes another process slows tenfold (a machine that is not idle). Drafting
    ahead (machine.ahead_step_ms), a round opens with the tokens drawn ahead where the
    round before accepted every draft and the draft's next guess was the target's own
    token: no draft step then, ModelWork(ahead=k). Returns the speedup over the target
    alone."""
    rng = random.Random(seed)

    def ms(x: float) -> float:
        slow = 10.0 if spikes and rng.random() < spikes else 1.0
        return x * 1e-3 * rng.lognormvariate(0, 0.08) * slow
    mc = machine
    i, behind, total, drawn = 0, 0, 0.0, 0
    paused: list[int] = []
    n = len(text)
    while i < n:
        k = min(policy.choose("model"), n - i - 1)
        ahead = min(k, drawn)  # the draft opens with tokens drawn ahead (no draft step)
        k, rows = model_draft(policy, ahead or k, [c for _, c in text[i : i + k]])
        if ahead:
            ahead, rows = k, 0
        m = 0
        while m < k and text[i + m][0]:
            m += 1
        target_s, draft_s, steps_s, caught_up = ms(mc.loop_ms[k]), 0.0, 0.0, 0
        shadow: tuple[float, ...] = ()
        if rows > 0:
            caught_up = behind
            first = mc.step_ms + mc.wake_ms + (mc.catch_up_ms * behind if behind > 1 else 0)
            steps_s = ms((rows - 1) * mc.step_ms)
            draft_s = ms(first) + steps_s
            if behind > 1:
                shadow = tuple(float(text[p][0]) for p in paused[-64:])
            paused, behind = [], int(m == k)
        elif ahead:
            paused, behind = [], int(m == k)
        else:
            paused.append(i)
            behind += 1
        seconds = target_s + draft_s + (0.4 + 0.5 * k) * 1e-3
        drawn = 0
        if mc.ahead_step_ms > 0 and k > 0:
            drawn, wait = mc.drawn_ahead(target_s)
            seconds += wait
            if not (m == k and i + k < n and text[i + k][0]):
                drawn = 0  # a rejection, or the target's own token was not the guess
        policy.observe(outcome(k, m, "model", target_s, draft_s, seconds, shadow,
                               steps_s, behind, caught_up,
                               tuple(c for _, c in text[i : i + k]), rows, ahead=ahead))
        i += m + 1
        total += seconds
    alone = mc.loop_ms[0] if mc.alone_ms is None else mc.alone_ms
    return n * (alone + 0.4) * 1e-3 * (1 + 9 * spikes) / total


def outcome(k: int, accepted: int, source: Source = "model", target_s: float = 0.0,
            draft_s: float = 0.0, seconds: float = 0.0, shadow: tuple[float, ...] = (),
            draft_steps_s: float = 0.0, draft_behind: int = 0, draft_caught_up: int = 0,
            confidences: tuple[float, ...] = (), draft_rows: int = 0,
            forced: int = 0, ahead: int = 0) -> RoundVerified:
    """The record of a round a policy sees: k drafts after `forced` forced ones (all
    accepted), `accepted` of the k accepted, and what it cost; `ahead`: drafts drawn
    ahead, while the target verified the round before."""
    origin: Origin = "model" if source == "model" else "context"
    forced_origin: Origin = "forced"
    return RoundVerified(
        drafted=(0,) * (forced + k), origins=(*[forced_origin] * forced, *[origin] * k),
        accepted=forced + accepted, token=0,
        kind="plain" if forced + k == 0 else "bonus" if accepted == k else "correction",
        emitted=forced + accepted + 1, p=(), q=(), source=source, draft_s=draft_s,
        target_s=target_s, seconds=seconds, confidences=confidences,
        work=ModelWork(draft_rows, draft_steps_s, draft_caught_up, shadow, ahead),
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


def copy_head_texts(alpha: float, spread: bool, count: int = 8, n: int = 48) -> list[Text]:
    """An MTP layer near a copy of its target (the synthetic Qwen3.5's): drafts accepted
    at rate alpha whatever its confidence, which is flat and low greedy (random weights:
    a few percent) or spread over 0.05-0.95 (T = 0.8)."""
    rng = random.Random(int(alpha * 100) + 7 * spread)
    def token():
        c = rng.uniform(0.05, 0.95) if spread else rng.uniform(0.01, 0.05)
        return rng.random() < alpha, c
    return [[token() for _ in range(n)] for _ in range(count)]


def state_for(machine: Machine, tuning: AutoTuning | None = None) -> AutoState:
    """Auto's state calibrated as on `machine`: the F32 pair's own calibration, any other
    machine's on its loop costs."""
    if machine is F32:
        return AutoState(CostCurve(tuple(x * 1e-3 for x in F32_CALIBRATED_MS)),
                         F32_DRAFT_CURVE, tuning=tuning)
    draft = CostCurve((machine.step_ms * 1e-3, (machine.step_ms + machine.catch_up_ms) * 1e-3))
    return AutoState(CostCurve(tuple(x * 1e-3 for x in machine.loop_ms)), draft, tuning=tuning)


def auto_speedup(texts: list[Text], tuning: AutoTuning | None = None,
                 machine: Machine = F32) -> float:
    """Auto's mean speedup over the target alone on these texts (a fresh policy each)."""
    return statistics.mean(simulate(AutoDraftLength(state_for(machine, tuning)), t, machine,
                                    seed=s) for s, t in enumerate(texts))


def auto_calls(texts: list[Text], tuning: AutoTuning | None = None, machine: Machine = F32,
               spikes: float = 0.0, state: AutoState | None = None,
               watch: Callable[[AutoDraftLength], Any] = lambda policy: policy) -> float:
    """Auto's mean speedup over the texts run as calls of one decoder, each a new text
    (`AutoDraftLength.for_decoder`: it probes in its first round, carries some evidence);
    `watch` wraps each call's policy (to record what it chose)."""
    held = state or state_for(machine, tuning)

    class Decoder:  # what AutoDraftLength.for_decoder reads
        target = SimpleNamespace(others=0, companions=0)  # alone in its batches
        policy_state = {"auto": held}

    host = cast(PolicyHost, Decoder())  # a stand-in: what for_decoder reads, no models
    return statistics.mean(simulate(watch(AutoDraftLength.for_decoder(host)), t, machine,
                                    seed=s, spikes=spikes) for s, t in enumerate(texts))


def fixed_speedups(texts: list[Text], ks=range(1, 7), spikes: float = 0.0,
                   machine: Machine = F32) -> dict[int, float]:
    return {k: statistics.mean(simulate(FixedDraftLength(k), t, machine, seed=s, spikes=spikes)
                               for s, t in enumerate(texts)) for k in ks}
