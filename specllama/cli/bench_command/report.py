"""The bench report as tables, a sentence about the machine, JSON and a plot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.table import Table

from ...errors import InvalidParameterError


def verdict(report: dict[str, Any]) -> str:
    """The bench's answer in one line, first: did any mode beat the target alone here?"""
    overall = report["summary"]["overall"]
    ratios = {name: o["vs_target_geomean"] for name, o in overall.items()
              if name != "target" and o.get("vs_target_geomean")}
    if not ratios:
        return "verdict: only the target alone was measured"
    best = max(ratios, key=lambda name: ratios[name])
    r = ratios[best]
    if r >= 1.05:
        word = f"speculation pays here: {best} ran at {r:.2f}x the target alone"
    elif r > 0.95:
        word = (f"speculation makes no difference here: the best mode, {best}, ran at "
                f"{r:.2f}x the target alone")
    else:
        word = (f"speculation does not pay here: the best mode, {best}, ran at {r:.2f}x "
                "the target alone")
    return f"verdict: {word} (geometric mean over {len(report['summary']['per_prompt'])} " \
           "prompts)"


def render_tables(report: dict[str, Any]) -> tuple[Table, Table]:
    """Two rich tables: tok/s per prompt and mode (with the ratio to the target
    alone), and per mode: acceptance, mean k, overhead share."""
    modes = [m["name"] for m in report["modes"]]
    summary = report["summary"]
    settings = report["settings"]
    t = Table(title=f"tokens/s, median of {settings['reps']} repetitions "
              "(ratio to the target alone)", title_justify="left")
    t.add_column("prompt", no_wrap=True)  # names stay whole; the figures may wrap
    for name in modes:
        t.add_column(name, justify="right")
    for pid, row in summary["per_prompt"].items():
        cells = []
        for name in modes:
            c = row[name]
            ratio = f" ({c['vs_target']:.2f}x)" if c["vs_target"] and name != "target" else ""
            best = "*" if row.get("best_fixed") == name else ""
            cells.append(f"{c['tokens_per_s']:.1f}{ratio}{best}")
        t.add_row(pid, *cells)
    cells = []
    for name in modes:
        o = summary["overall"][name]
        g = o["vs_target_geomean"]
        cells.append(f"{o['tokens_per_s_pooled']:.1f}"
                     + (f" ({g:.2f}x)" if g and name != "target" else ""))
    t.add_row("overall", *cells, style="bold")
    base = summary["overall"].get("target", {}).get("tokens_per_s_with_prompt")
    cells = [f"{summary['overall'][n]['tokens_per_s_with_prompt']:.1f}"
             + (f" ({summary['overall'][n]['tokens_per_s_with_prompt'] / base:.2f}x)"
                if base and n != "target" else "") for n in modes]
    t.add_row("with the prompt", *cells)
    t.caption = ("ratio: median over repetitions of mode / target alone in the same "
                 "repetition; overall: all tokens / all time, geometric mean of the ratios; "
                 "with the prompt: all tokens / all time, the prompt's too; * best fixed k")

    m = Table(title="per mode", title_justify="left")
    for col in ("mode", "acceptance", "mean k", "by position", "overhead", "worst ratio"):
        m.add_column(col, justify="left" if col in ("mode", "by position") else "right")
    for name in modes:
        o = summary["overall"][name]
        acc = "-" if o["acceptance_rate"] is None else f"{o['acceptance_rate']:.0%}"
        pos = " ".join("-" if a is None else f"{a:.0%}" for a in o["acceptance_by_position"][:6])
        worst = o["vs_target_min"]
        m.add_row(name, acc, f"{o['mean_draft_length']:.2f}", pos or "-",
                  f"{o['overhead_share_median']:.1%} (max {o['overhead_share_max']:.1%})",
                  "-" if worst is None or name == "target" else f"{worst:.2f}x")
    return t, m


def describe_environment(report: dict[str, Any]) -> str:
    s, mach, load = report["settings"], report["machine"], report["loadavg"]
    sp = s["sampling"]
    lines = [
        f"target {Path(s['target']).name}, draft "
        f"{Path(s['draft']).name if s['draft'] else s['drafters']}; {s['threads']} threads "
        f"on {mach['cpu']} ({mach['cpu_count']} cores); temperature {sp['temperature']}, "
        f"max {s['max_tokens']} tokens, seeds {s['seed']}..{s['seed'] + s['reps'] - 1}, "
        f"p_min {s['p_min']}",
    ]
    if load.get("start") is not None:
        lines.append(f"load average {load['start']:.2f} at start, {load['end']:.2f} at end")
    foreign = report.get("foreign_cpu")
    if foreign is not None:
        runs = [r["foreign_cpu"] for r in report["runs"] if r.get("foreign_cpu") is not None]
        worst = max(runs, default=0.0)
        lines.append(f"other processes used {foreign:.0%} of the CPU during the timed runs "
                     f"(worst run {worst:.0%})")
    excluded = report.get("summary", {}).get("excluded_reps") or []
    if excluded:
        lines.append(f"left out {len(excluded)} repetition(s) where other processes used more "
                     f"than {report['summary']['max_foreign']:.0%} of the CPU: "
                     + ", ".join(f"{e['prompt']} #{e['rep'] + 1}" for e in excluded))
    return "\n".join(lines)


def write_plot(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """tokens/s per mode and prompt, and acceptance by draft position, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InvalidParameterError(
            "--plot needs matplotlib: pip install 'specllama[plot]' (or matplotlib)"
        ) from exc
    modes = [m["name"] for m in report["modes"]]
    summary = report["summary"]
    prompts = list(summary["per_prompt"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(modes))
    for j, name in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(prompts))]
        ys = [summary["per_prompt"][p][name]["tokens_per_s"] for p in prompts]
        ax1.bar(xs, ys, width, label=name)
        for x, p in zip(xs, prompts):  # every repetition as a dot: the spread is visible
            pts = summary["per_prompt"][p][name]["tokens_per_s_all"]
            ax1.plot([x] * len(pts), pts, ".", color="black", markersize=3)
    ax1.set_xticks(range(len(prompts)))
    ax1.set_xticklabels(prompts, rotation=20, ha="right")
    ax1.set_ylabel("tokens/s (median; dots: each run)")
    ax1.set_title("speed per mode")
    ax1.legend(fontsize="small")
    plotted = False
    for name in modes:
        acc = summary["overall"][name]["acceptance_by_position"]
        pts = [(i + 1, a) for i, a in enumerate(acc) if a is not None]
        if pts:
            ax2.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=name)
            plotted = True
    from matplotlib.ticker import MaxNLocator

    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("acceptance rate")
    ax2.set_ylim(0, 1.02)
    ax2.set_title("acceptance by draft position")
    if plotted:
        ax2.legend(fontsize="small")
    else:
        ax2.text(0.5, 0.5, "no drafts", ha="center", va="center", transform=ax2.transAxes)
    fig.suptitle(describe_environment(report).splitlines()[0], fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def write_json(report: dict[str, Any], path: str | os.PathLike[str]) -> None:
    Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")


def predicted_line(report: dict[str, Any], mode: str = "auto") -> str | None:
    """auto's predicted speedup beside the measured one, per prompt: does the cost
    model of this machine hold?"""
    per_prompt = report["summary"]["per_prompt"]
    parts = []
    for pid, row in per_prompt.items():
        cell = row.get(mode, {})
        predicted, measured = cell.get("predicted_vs_target"), cell.get("vs_target")
        if predicted and measured:
            parts.append(f"{pid} {predicted:.2f}x/{measured:.2f}x")
    if not parts:
        return None
    return f"{mode} predicted/measured vs the target alone: " + ", ".join(parts)

