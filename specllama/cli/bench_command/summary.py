"""The bench's figures from its runs: medians per prompt and mode, ratios paired by
repetition, and per mode the acceptance, draft lengths and overhead pooled."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .prompts import Mode

#: A repetition where other processes took more than this share of the CPU is left
#: out of the summary (see `summarize`).
DEFAULT_MAX_FOREIGN = 0.10

Run = dict[str, Any]


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def summarize(
    runs: Sequence[Run],
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
        runs, excluded = _clean(runs, prompt_ids, max_foreign)
    per_prompt = {pid: _prompt_row([r for r in runs if r["prompt"] == pid], mode_names, fixed)
                  for pid in prompt_ids}
    overall = {name: _overall([r for r in runs if r["mode"] == name],
                              [per_prompt[p][name] for p in prompt_ids])
               for name in mode_names}
    return {"per_prompt": per_prompt, "overall": overall, "excluded_reps": excluded,
            "max_foreign": max_foreign}


def _clean(runs: Sequence[Run], prompt_ids: Sequence[str], max_foreign: float,
           ) -> tuple[list[Run], list[dict[str, Any]]]:
    """The runs without each prompt's busy repetitions (while it keeps a clean one),
    and which were left out."""
    kept: list[Run] = []
    excluded: list[dict[str, Any]] = []
    for pid in prompt_ids:
        mine = [r for r in runs if r["prompt"] == pid]
        dirty = {r["rep"] for r in mine if (r.get("foreign_cpu") or 0.0) > max_foreign}
        if dirty and len({r["rep"] for r in mine} - dirty) >= 1:
            excluded.extend({"prompt": pid, "rep": rep} for rep in sorted(dirty))
            mine = [r for r in mine if r["rep"] not in dirty]
        kept.extend(mine)
    return kept, excluded


def _paired(by_rep: dict[tuple[str, int], float], name: str, base: str) -> float | None:
    """Median over repetitions of mode `name` / mode `base` in the same repetition: each
    repetition runs every mode back to back, so the ratio cancels slow drifts of the
    machine's speed."""
    pairs = [v / by_rep[(base, rep)] for (mode, rep), v in by_rep.items()
             if mode == name and by_rep.get((base, rep))]
    return _median(pairs) if pairs else None


def _prompt_row(runs: Sequence[Run], mode_names: Sequence[str], fixed: Sequence[str],
                ) -> dict[str, Any]:
    """One prompt's figures per mode, and its best fixed draft length."""
    row: dict[str, Any] = {}
    for name in mode_names:
        rs = [r for r in runs if r["mode"] == name]
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
    by_rep = {(r["mode"], r["rep"]): r["tokens_per_s"] for r in runs}
    for name in mode_names:
        row[name]["vs_target_of_medians"] = row[name]["tokens_per_s"] / base if base else None
        row[name]["vs_target"] = _paired(by_rep, name, "target")
    if fixed:
        best = max(fixed, key=lambda n: row[n]["tokens_per_s"])
        row["best_fixed"] = best
        for name in mode_names:
            row[name]["vs_best_fixed"] = _paired(by_rep, name, best)
    return row


def _pooled(rs: Sequence[Run], key: str) -> list[int]:
    """Per draft position, the sum over runs of `key`'s counts."""
    width = max((len(r.get(key, ())) for r in rs), default=0)
    return [sum(r[key][i] for r in rs if i < len(r.get(key, ()))) for i in range(width)]


def _overall(rs: Sequence[Run], cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One mode over every prompt: its runs pooled, and its per-prompt ratios `cells`."""
    drafted, accepted = _pooled(rs, "drafted_at"), _pooled(rs, "accepted_at")
    # conditional acceptance at position i: accepted / reached (all earlier accepted)
    reached = _pooled(rs, "reached_at") if all("reached_at" in r for r in rs) else drafted
    gen_s = sum(r["generate_s"] for r in rs)
    n_drafted = sum(r["drafted"] for r in rs)
    rounds = sum(r["target_steps"] for r in rs)
    vs_t = [c["vs_target"] for c in cells]
    vs_b = [c.get("vs_best_fixed") for c in cells]
    notes = [r["policy_note"] for r in rs if r.get("policy_note")]
    # what a user waits for: the prompt too (a draft model reads it as well)
    waited_s = gen_s + sum(r.get("prompt_s", 0.0) for r in rs)
    return {
        "runs": len(rs),
        "tokens_per_s_pooled": sum(r["tokens"] for r in rs) / gen_s if gen_s else 0.0,
        "tokens_per_s_with_prompt": sum(r["tokens"] for r in rs) / waited_s if waited_s
        else 0.0,
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
