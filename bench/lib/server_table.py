"""The contenders of a request-level comparison (bench/llamaserver.py) and the table of
their runs: each contender's rate and its ratios to llama-server alone, to llama-server's
best speculative configuration and to our own target alone, taken within a repetition."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.lib.common import Spread, geomean, ratios

BASELINE = "llama-server"
#: specllama's own target alone, when it is among the contenders
OWN_TARGET = "specllama --draft-max 0"


@dataclass
class Contender:
    name: str
    argv: list[str]  # without the port
    port_flag: str
    kind: str  # "llama-server" or "specllama"
    # llama-server given our sampler chain in each request (sampler_fields)
    our_sampling: bool = False
    # stop strings its chat requests carry (llama-server: ours for a template-less model)
    stop: tuple[str, ...] = ()
    # send each prompt's prediction (OpenAI's Predicted Outputs: ours only)
    predict: bool = False
    # per temperature: one list per repetition of per-request records
    runs: dict[float, list[list[dict[str, Any]]]] = field(default_factory=dict)


def summarize(cs: list[Contender], temp: float) -> list[dict[str, Any]]:
    base = next(c for c in cs if c.name == BASELINE)
    base_gm = [geomean([r["tokens_per_s"] for r in rows]) for rows in base.runs[temp]]
    lcpp_spec = [c for c in cs if c.kind == "llama-server" and c.name != BASELINE]
    best = max(lcpp_spec, key=lambda c: statistics.median(_gms(c, temp)), default=None)
    own = next((c for c in cs if c.name == OWN_TARGET), None)
    out = []
    for c in cs:
        gms = _gms(c, temp)
        rows = [r for reps in c.runs[temp] for r in reps]
        drafted = sum(r["drafted"] for r in rows)
        row: dict[str, Any] = {
            "contender": c.name, "tokens_per_s": Spread.of(gms).as_dict(),
            "vs_llama_server_alone": Spread.of(ratios(gms, base_gm)).as_dict(),
            "drafted_per_request": drafted / len(rows),
            "acceptance": sum(r["accepted"] for r in rows) / drafted if drafted else None,
            "tokens_per_request": sum(r["tokens"] for r in rows) / len(rows),
            "best_llama_server_speculative": c is best,
        }
        if best is not None:
            row["vs_best_llama_server_speculative"] = Spread.of(
                ratios(gms, _gms(best, temp))).as_dict()
        # All tokens over all time: a 1-token answer (its time all prompt) weighs 1 token,
        # where the geometric mean over requests weighs it as much as a full answer.
        row["pooled_vs_llama_server_alone"] = Spread.of(
            ratios(_pooled(c, temp), _pooled(base, temp))).as_dict()
        if own is not None:
            row["pooled_vs_own_target"] = Spread.of(
                ratios(_pooled(c, temp), _pooled(own, temp))).as_dict()
        out.append(row)
    return out


def _gms(c: Contender, temp: float) -> list[float]:
    return [geomean([r["tokens_per_s"] for r in rows]) for rows in c.runs[temp]]


def _pooled(c: Contender, temp: float) -> list[float]:
    """Per repetition: all tokens over all seconds."""
    return [sum(r["tokens"] for r in rows) / sum(r["tokens"] / r["tokens_per_s"] for r in rows)
            for rows in c.runs[temp]]


def fmt(s: dict[str, float], digits: int = 2) -> str:
    return Spread(**s).bracket(digits)


def print_table(temp: float, rows: list[dict[str, Any]]) -> None:
    print(f"\nT = {temp:g}: tok/s and ratios, median [min-max] over repetitions "
          "(* = llama-server's best speculative configuration)")
    print(f"{'contender':52} {'tok/s':>20} {'vs alone':>18} {'vs best -md':>18} "
          f"{'drafted':>8} {'accept':>7}")
    for r in rows:
        star = "*" if r["best_llama_server_speculative"] else " "
        vs_best = r.get("vs_best_llama_server_speculative")
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"{star}{r['contender'][:51]:51} {fmt(r['tokens_per_s'], 1):>20} "
              f"{fmt(r['vs_llama_server_alone']):>18} "
              f"{fmt(vs_best) if vs_best else '':>18} "
              f"{r['drafted_per_request']:8.1f} {acc:>7}")
    print("all tokens over all time, against llama-server alone and specllama's own target "
          "alone:")
    for r in rows:
        own = r.get("pooled_vs_own_target")
        print(f" {r['contender'][:51]:51} {fmt(r['pooled_vs_llama_server_alone']):>18} "
              f"{fmt(own) if own else '':>18}")
