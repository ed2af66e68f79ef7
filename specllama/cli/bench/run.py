"""Running the bench: every mode on every prompt, interleaved, and the summary."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from ...engine.constraint import ConstraintSpec
from ...engine.decoder import SpeculativeDecoder
from ...engine.drafts import DraftMode
from ...engine.llama import LLAMA_CPP_VERSION
from ...engine.sampling import SamplingParams
from ...errors import InvalidParameterError
from ...policy import AutoState
from ...policy.calibration import cpu_model
from ...policy.cpumeter import CpuMeter, loadavg
from .prompts import BenchPrompt, Mode

BENCH_VERSION = 1
DEFAULT_REPS = 3
DEFAULT_MAX_TOKENS = 128
DEFAULT_SEED = 0
WARMUP_TOKENS = 16
#: A repetition where other processes took more than this share of the CPU is left
#: out of the summary (see `summarize`).
DEFAULT_MAX_FOREIGN = 0.10


def _prompt_tokens(decoder: SpeculativeDecoder, p: BenchPrompt, raw: bool) -> list[int]:
    return decoder.target.prompt(p.prompt, chat=p.chat and not raw)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def machine_info() -> dict[str, Any]:
    return {"node": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "llama_cpp": LLAMA_CPP_VERSION}


def run_bench(
    decoder: SpeculativeDecoder,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    *,
    reps: int = DEFAULT_REPS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sampling: SamplingParams | None = None,
    draft_mode: DraftMode | None = None,
    warmup: bool = True,
    raw: bool = False,
    progress: Callable[[str], None] | None = None,
    max_foreign: float | None = DEFAULT_MAX_FOREIGN,
    constraint: ConstraintSpec | None = None,
    carry: bool = False,
) -> dict[str, Any]:
    """Run every mode on every prompt `reps` times, interleaved; the full report.
    `constraint` applies to the prompts without a schema of their own. Each run starts
    with the suffix cache as loaded (this process's earlier outputs forgotten), unless
    `carry`: then each repetition runs the prompts in order as one sequence of requests
    per mode, each drafting from the outputs before it."""
    if not isinstance(reps, int) or reps < 1:
        raise InvalidParameterError(f"reps must be an integer >= 1, got {reps!r}")
    if not prompts:
        raise InvalidParameterError("no prompts to run")
    sampling = sampling or SamplingParams(seed=DEFAULT_SEED)
    seed0 = sampling.seed if sampling.seed is not None else DEFAULT_SEED
    say = progress or (lambda _msg: None)
    modes = list(modes)
    encoded = {p.id: _prompt_tokens(decoder, p, raw) for p in prompts}
    constraints = {p.id: constraint if p.schema is None else ConstraintSpec.json_schema(p.schema)
                   for p in prompts}
    load_start = loadavg()
    t_begin = time.perf_counter()

    calibration: dict[str, Any] = {}
    if any(m.draft_max == "auto" for m in modes):
        say("calibrating decode costs")
        calibration = AutoState.for_decoder(decoder).calibration

    def gen(p: BenchPrompt, mode: Mode, seed: int, n: int):
        params = SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k,
                                top_p=sampling.top_p, min_p=sampling.min_p, seed=seed)
        if not carry:
            decoder.suffix_cache.forget_session()
        return decoder.generate(encoded[p.id], max_tokens=n, sampling=params,
                                draft_max=mode.draft_max, draft_mode=draft_mode,
                                constraint=constraints[p.id], suffix_cache=mode.suffix_cache)

    if warmup:
        say("warming up")
        for mode in modes:
            gen(prompts[0], mode, seed0, min(WARMUP_TOKENS, max_tokens))

    runs: list[dict[str, Any]] = []
    total = len(prompts) * reps * len(modes)
    meter, whole = CpuMeter(), CpuMeter()
    whole.start()

    def timed(p: BenchPrompt, mode: Mode, rep: int, slot: int) -> None:
        meter.start()
        result = gen(p, mode, seed0 + rep, max_tokens)
        foreign = meter.stop()
        s = result.stats
        runs.append({
            "prompt": p.id, "mode": mode.name, "draft_max": mode.draft_max,
            "rep": rep, "slot": slot, "seed": seed0 + rep,
            "finish_reason": result.finish_reason,
            "constrained": constraints[p.id] is not None,
            "foreign_cpu": foreign,
            **s.to_dict(),
        })
        busy = f"; other processes used {foreign:.0%} of the CPU" \
            if foreign is not None and foreign > 0.05 else ""
        say(f"[{len(runs)}/{total}] {p.id} rep {rep + 1}/{reps} {mode.name}: "
            f"{s.tokens_per_s:.1f} tok/s, {s.tokens} tokens{busy}")

    for p, mode, rep, slot, first in schedule(prompts, modes, reps, carry):
        if first and carry:
            decoder.suffix_cache.forget_session()  # each sequence starts afresh
        elif first and warmup:  # untimed: the first run after a prompt change is slower
            gen(p, modes[0], seed0, min(WARMUP_TOKENS, max_tokens))
        timed(p, mode, rep, slot)
    report = {
        "version": BENCH_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": time.perf_counter() - t_begin,
        "machine": machine_info(),
        "loadavg": {"start": load_start, "end": loadavg()},
        # share of all cores busy with other processes while the timed runs ran
        "foreign_cpu": whole.stop(),
        "settings": {
            "target": str(decoder.target.path),
            "draft": str(decoder.draft.path) if decoder.draft is not None else None,
            "threads": decoder.target.n_threads,
            "n_ctx": decoder.n_ctx,
            "p_min": decoder.p_min,
            "draft_mode": draft_mode or getattr(decoder, "default_draft_mode", "model"),
            "reps": reps,
            "max_tokens": max_tokens,
            "seed": seed0,
            "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                         "top_p": sampling.top_p, "min_p": sampling.min_p},
            "warmup": warmup,
            "carry": carry,
            "chat_template": not raw and bool(decoder.target.chat_template()),
        },
        "calibration": calibration,
        "modes": [asdict(m) for m in modes],
        "prompts": [{**asdict(p), "prompt_tokens": len(encoded[p.id])} for p in prompts],
        "runs": runs,
    }
    report["summary"] = summarize(runs, [m.name for m in modes], [p.id for p in prompts], modes,
                                  max_foreign)
    return report


def schedule(prompts: Sequence[BenchPrompt], modes: Sequence[Mode], reps: int,
             carry: bool) -> Iterator[tuple[BenchPrompt, Mode, int, int, bool]]:
    """(prompt, mode, repetition, slot, first) in the order runs are made, the modes
    rotated per repetition. Each prompt's repetitions in turn, `first` at a new prompt;
    with `carry` each repetition runs every prompt in order per mode, `first` at the
    start of such a sequence."""
    for rep in range(reps) if carry else ():
        shift = rep % len(modes)
        for slot, mode in enumerate([*modes[shift:], *modes[:shift]]):
            for i, p in enumerate(prompts):
                yield p, mode, rep, slot, i == 0
    for p in prompts if not carry else ():
        for rep in range(reps):
            shift = rep % len(modes)
            for slot, mode in enumerate([*modes[shift:], *modes[:shift]]):
                yield p, mode, rep, slot, rep == 0 and slot == 0


def summarize(
    runs: Sequence[dict[str, Any]],
    mode_names: Sequence[str],
    prompt_ids: Sequence[str],
    modes: Sequence[Mode] | None = None,
    max_foreign: float | None = DEFAULT_MAX_FOREIGN,
) -> dict[str, Any]:
    """Medians per (prompt, mode); ratios to the target alone and to the best fixed k,
    paired by repetition (median of the per-repetition ratios).

    A repetition (all modes of one prompt) in which any run had other processes
    using more than `max_foreign` of the CPU is left out of the figures, as long as
    the prompt keeps at least one clean repetition; the runs stay in the JSON."""
    fixed = [m.name for m in (modes or []) if m.fixed_k]
    excluded: list[dict[str, Any]] = []
    if max_foreign is not None:
        kept = []
        for pid in prompt_ids:
            mine = [r for r in runs if r["prompt"] == pid]
            dirty = {r["rep"] for r in mine
                     if (r.get("foreign_cpu") or 0.0) > max_foreign}
            if dirty and len({r["rep"] for r in mine} - dirty) >= 1:
                excluded.extend({"prompt": pid, "rep": rep} for rep in sorted(dirty))
                mine = [r for r in mine if r["rep"] not in dirty]
            kept.extend(mine)
        runs = kept
    per_prompt: dict[str, dict[str, Any]] = {}
    for pid in prompt_ids:
        row: dict[str, Any] = {}
        for name in mode_names:
            rs = [r for r in runs if r["prompt"] == pid and r["mode"] == name]
            row[name] = {
                "tokens_per_s": _median([r["tokens_per_s"] for r in rs]),
                "tokens_per_s_all": [r["tokens_per_s"] for r in rs],
                "tokens": _median([r["tokens"] for r in rs]),
                "overhead_share": _median([r["overhead_share"] for r in rs]),
                # auto's cost model: the speedup it expected of the rounds it ran
                "predicted_vs_target": _median([r["predicted_speedup"] for r in rs
                                                if r.get("predicted_speedup")]) or None,
            }
        base = row.get("target", {}).get("tokens_per_s", 0.0)
        by_rep = {(r["mode"], r["rep"]): r["tokens_per_s"] for r in runs if r["prompt"] == pid}
        for name in mode_names:
            row[name]["vs_target_of_medians"] = row[name]["tokens_per_s"] / base if base else None
            # Paired: each repetition runs every mode back to back, so the ratio within a
            # repetition cancels slow drifts of the machine's speed; then the median.
            pairs = [v / by_rep[("target", rep)] for (mode, rep), v in by_rep.items()
                     if mode == name and by_rep.get(("target", rep))]
            row[name]["vs_target"] = _median(pairs) if pairs else None
        if fixed:
            best = max(fixed, key=lambda n: row[n]["tokens_per_s"])
            row["best_fixed"] = best
            for name in mode_names:
                pairs = [v / by_rep[(best, rep)] for (mode, rep), v in by_rep.items()
                         if mode == name and by_rep.get((best, rep))]
                row[name]["vs_best_fixed"] = _median(pairs) if pairs else None
        per_prompt[pid] = row

    overall: dict[str, Any] = {}
    for name in mode_names:
        rs = [r for r in runs if r["mode"] == name]
        def pooled(key: str, rs=rs) -> list[int]:
            width = max((len(r.get(key, ())) for r in rs), default=0)
            return [sum(r[key][i] for r in rs if i < len(r.get(key, ()))) for i in range(width)]

        drafted, accepted = pooled("drafted_at"), pooled("accepted_at")
        # conditional acceptance at position i: accepted / reached (all earlier accepted)
        reached = pooled("reached_at") if all("reached_at" in r for r in rs) else drafted
        gen_s = sum(r["generate_s"] for r in rs)
        n_drafted = sum(r["drafted"] for r in rs)
        rounds = sum(r["target_steps"] for r in rs)
        vs_t = [per_prompt[p][name]["vs_target"] for p in prompt_ids]
        vs_b = [per_prompt[p][name].get("vs_best_fixed") for p in prompt_ids]
        notes = [r["policy_note"] for r in rs if r.get("policy_note")]
        overall[name] = {
            "runs": len(rs),
            "tokens_per_s_pooled": sum(r["tokens"] for r in rs) / gen_s if gen_s else 0.0,
            "vs_target_geomean": _geomean([x for x in vs_t if x]) if any(vs_t) else None,
            "vs_target_min": min((x for x in vs_t if x is not None), default=None),
            "vs_best_fixed_min": min((x for x in vs_b if x is not None), default=None),
            "overhead_share_median": _median([r["overhead_share"] for r in rs]),
            "overhead_share_max": max((r["overhead_share"] for r in rs), default=0.0),
            "overhead_share_pooled": (sum(r["overhead_s"] for r in rs) / gen_s) if gen_s else 0.0,
            "acceptance_rate": (sum(r["accepted"] for r in rs) / n_drafted) if n_drafted else None,
            "mean_draft_length": n_drafted / rounds if rounds else 0.0,
            "acceptance_by_position": [a / d if d else None for a, d in zip(accepted, reached)],
            "drafted_by_position": drafted,
            "reached_by_position": reached,
            "policy_note": notes[-1] if notes else "",
        }
    return {"per_prompt": per_prompt, "overall": overall, "excluded_reps": excluded,
            "max_foreign": max_foreign}
