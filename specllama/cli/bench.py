"""`specllama bench`: is speculation worth it here? Measured side by side.

In one run, on the same prompts, seeds, threads and max tokens: the target
alone, speculative decoding with fixed draft lengths, the heuristic and the
cost-aware auto policy. Repetitions are interleaved (for each prompt and each
repetition every mode runs once, in an order rotated per repetition), so a
machine that gets busier slows every mode alike; figures are medians, and
ratios are to the target alone on the same prompt.

`run_bench` is the library entry (a dict, also what `--json` writes); the
click command `bench_command` renders it as tables, JSON and a plot.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..engine.sampling import SamplingParams
from ..errors import InvalidParameterError
from ..policy.auto import DEFAULT_P_MIN, MAX_DRAFT
from ..policy.cpumeter import CpuMeter, loadavg

if TYPE_CHECKING:
    from ..engine.decoder import SpeculativeDecoder

BENCH_VERSION = 1
DEFAULT_MODES = "target,1,2,4,auto"
DEFAULT_REPS = 3
DEFAULT_MAX_TOKENS = 128
DEFAULT_SEED = 0
WARMUP_TOKENS = 16
#: A repetition where other processes took more than this share of the CPU is left
#: out of the summary (see `summarize`).
DEFAULT_MAX_FOREIGN = 0.10


# ============================================================================ prompts


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    prompt: str
    category: str = "user"
    chat: bool = True  # wrap in the model's chat template (when it has one)


def _record(obj: Any, where: str, index: int) -> BenchPrompt:
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        raise InvalidParameterError(f"{where}: line {index}: expected a JSON object with a "
                                    "string 'prompt' (or a JSON string)")
    if not obj["prompt"].strip():
        raise InvalidParameterError(f"{where}: line {index}: the prompt is empty")
    chat = obj.get("chat", True)
    if not isinstance(chat, bool):
        raise InvalidParameterError(f"{where}: line {index}: 'chat' must be true or false")
    return BenchPrompt(
        id=str(obj.get("id") or f"p{index}"),
        prompt=obj["prompt"],
        category=str(obj.get("category") or "user"),
        chat=chat,
    )


def parse_prompts(text: str, where: str = "prompts") -> list[BenchPrompt]:
    """JSONL (each line a JSON object with "prompt", optional "id", "category",
    "chat"; or a JSON string), or plain text with one prompt per line. Blank
    lines and lines starting with '#' are skipped."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InvalidParameterError(f"{where}: no prompts in it")
    is_jsonl = all(line.lstrip().startswith(("{", '"')) for _, line in lines)
    out = []
    for i, line in lines:
        if is_jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidParameterError(f"{where}: line {i}: not valid JSON ({exc.msg})") \
                    from exc
            out.append(_record(obj, where, i))
        else:
            out.append(BenchPrompt(id=f"p{i}", prompt=line.strip()))
    ids = [p.id for p in out]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup is not None:
        raise InvalidParameterError(f"{where}: prompt id {dup!r} appears twice")
    return out


def builtin_prompts() -> list[BenchPrompt]:
    """The shipped set: chat, code, summarizing a given text, rewriting a given text."""
    text = resources.files("specllama").joinpath("prompts/bench.jsonl").read_text("utf-8")
    return parse_prompts(text, "built-in bench prompts")


def load_prompts(path: str | os.PathLike[str]) -> list[BenchPrompt]:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidParameterError(f"{p}: cannot read the prompts ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise InvalidParameterError(f"{p}: not UTF-8 text") from exc
    return parse_prompts(text, str(p))


# ============================================================================ modes


@dataclass(frozen=True)
class Mode:
    name: str  # "target", "k=2", "heuristic", "auto"
    draft_max: int | str

    @property
    def fixed_k(self) -> int | None:
        return self.draft_max if isinstance(self.draft_max, int) else None


def parse_modes(spec: str | Sequence[str]) -> list[Mode]:
    """'target,1,2,4,auto' (also 'k=2', 'k2', 'heuristic', '0' = target)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    modes: list[Mode] = []
    for raw in items:
        item = raw.strip().lower()
        if not item:
            continue
        if item in ("target", "0", "k=0", "k0"):
            mode = Mode("target", 0)
        elif item in ("auto", "heuristic"):
            mode = Mode(item, item)
        else:
            digits = item.removeprefix("k=").removeprefix("k")
            if not digits.isdigit() or not 1 <= int(digits) <= MAX_DRAFT:
                raise InvalidParameterError(
                    f"bench mode {raw.strip()!r}: expected 'target', 'auto', 'heuristic' or a "
                    f"draft length 1..{MAX_DRAFT}"
                )
            mode = Mode(f"k={int(digits)}", int(digits))
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise InvalidParameterError("no bench modes given")
    return modes


# ============================================================================ running


def _prompt_tokens(decoder: SpeculativeDecoder, p: BenchPrompt, raw: bool) -> list[int]:
    target = decoder.target
    if p.chat and not raw and target.chat_template():
        rendered = target.format_chat([{"role": "user", "content": p.prompt}])
        return target.tokenize_chat(rendered)
    return decoder.tokenize(p.prompt)


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def machine_info() -> dict[str, Any]:
    from ..policy.calibration import _cpu_model

    info: dict[str, Any] = {"node": platform.node(), "cpu": _cpu_model(),
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        import llama_cpp

        info["llama_cpp"] = getattr(llama_cpp, "__version__", "?")
    except ImportError:  # pragma: no cover
        pass
    return info


def run_bench(
    decoder: SpeculativeDecoder,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    *,
    reps: int = DEFAULT_REPS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sampling: SamplingParams | None = None,
    draft_mode: str | None = None,
    warmup: bool = True,
    raw: bool = False,
    progress: Callable[[str], None] | None = None,
    max_foreign: float | None = DEFAULT_MAX_FOREIGN,
) -> dict[str, Any]:
    """Run every mode on every prompt `reps` times, interleaved; the full report."""
    if not isinstance(reps, int) or reps < 1:
        raise InvalidParameterError(f"reps must be an integer >= 1, got {reps!r}")
    if not prompts:
        raise InvalidParameterError("no prompts to run")
    sampling = sampling or SamplingParams(seed=DEFAULT_SEED)
    seed0 = sampling.seed if sampling.seed is not None else DEFAULT_SEED
    say = progress or (lambda _msg: None)
    modes = list(modes)
    encoded = {p.id: _prompt_tokens(decoder, p, raw) for p in prompts}
    load_start = loadavg()
    t_begin = time.perf_counter()

    calibration: dict[str, Any] = {}
    if any(m.draft_max == "auto" for m in modes):
        from ..policy.auto import AutoState

        say("calibrating decode costs")
        calibration = AutoState.for_decoder(decoder).calibration

    def gen(tokens: list[int], mode: Mode, seed: int, n: int):
        params = SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k,
                                top_p=sampling.top_p, min_p=sampling.min_p, seed=seed)
        return decoder.generate(tokens, max_tokens=n, sampling=params,
                                draft_max=mode.draft_max, draft_mode=draft_mode)

    if warmup:
        say("warming up")
        first = encoded[prompts[0].id]
        for mode in modes:
            gen(first, mode, seed0, min(WARMUP_TOKENS, max_tokens))

    runs: list[dict[str, Any]] = []
    total = len(prompts) * reps * len(modes)
    meter, whole = CpuMeter(), CpuMeter()
    whole.start()
    for p in prompts:
        tokens = encoded[p.id]
        if warmup:  # untimed: the first run after a prompt change is slower, whatever the mode
            gen(tokens, modes[0], seed0, min(WARMUP_TOKENS, max_tokens))
        for rep in range(reps):
            shift = rep % len(modes)
            order = modes[shift:] + modes[:shift]
            for slot, mode in enumerate(order):
                meter.start()
                result = gen(tokens, mode, seed0 + rep, max_tokens)
                foreign = meter.stop()
                s = result.stats
                run = {
                    "prompt": p.id, "mode": mode.name, "draft_max": mode.draft_max,
                    "rep": rep, "slot": slot, "seed": seed0 + rep,
                    "finish_reason": result.finish_reason,
                    "foreign_cpu": foreign,
                    **s.to_dict(),
                }
                runs.append(run)
                busy = f"; other processes used {foreign:.0%} of the CPU" \
                    if foreign is not None and foreign > 0.05 else ""
                say(f"[{len(runs)}/{total}] {p.id} rep {rep + 1}/{reps} {mode.name}: "
                    f"{s.tokens_per_s:.1f} tok/s, {s.tokens} tokens{busy}")
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


# ============================================================================ output


def render_tables(report: dict[str, Any]):
    """Two rich tables: tok/s per prompt and mode (with the ratio to the target
    alone), and per mode: acceptance, mean k, overhead share."""
    from rich.table import Table

    modes = [m["name"] for m in report["modes"]]
    summary = report["summary"]
    settings = report["settings"]
    t = Table(title=f"tokens/s, median of {settings['reps']} repetitions "
              "(ratio to the target alone)", title_justify="left")
    t.add_column("prompt")
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
    t.caption = ("ratio: median over repetitions of mode / target alone in the same "
                 "repetition; overall: all tokens / all time, geometric mean of the ratios; "
                 "* best fixed k")

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
        f"{Path(s['draft']).name if s['draft'] else s['draft_mode']}; {s['threads']} threads "
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


# ============================================================================ the command


def _bench_options(f: Callable) -> Callable:
    from .options import RECALIBRATE_OPTION, model_options

    decorators = [
        model_options,
        click.option("--prompts", "prompts_path", metavar="FILE",
                     help="Your prompts: one per line, or JSONL with a 'prompt' field."),
        click.option("--modes", default=DEFAULT_MODES, show_default=True, metavar="LIST",
                     help="Comma-separated: target, auto, heuristic, draft lengths (1,2,4...)."),
        click.option("--reps", type=click.IntRange(1), default=DEFAULT_REPS, show_default=True,
                     help="Repetitions of each prompt and mode (interleaved)."),
        click.option("--max-tokens", type=click.IntRange(1), default=DEFAULT_MAX_TOKENS,
                     show_default=True, help="Tokens to generate per run."),
        click.option("--temperature", type=float, help="0 = greedy. [default: the pair's]"),
        click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, help="Nucleus sampling mass in (0, 1]."),
        click.option("--min-p", type=float, help="Drop tokens below min_p x the top probability."),
        click.option("--seed", type=click.IntRange(0), default=DEFAULT_SEED, show_default=True,
                     help="Seed of the first repetition (then +1 per repetition)."),
        click.option("--p-min", type=float,
                     help=f"Draft confidence cutoff (0 = off). [default: {DEFAULT_P_MIN}]"),
        RECALIBRATE_OPTION,
        click.option("--draft-mode", type=click.Choice(("model", "lookup", "hybrid")),
                     help="Who drafts: the draft model, prompt lookup, or both."),
        click.option("--raw", is_flag=True, help="Do not wrap prompts in the chat template."),
        click.option("--warmup/--no-warmup", default=True, show_default=True,
                     help="Short untimed runs first: one per mode, then one per prompt."),
        click.option("--max-foreign", type=click.FloatRange(0.0, 1.0),
                     default=DEFAULT_MAX_FOREIGN, show_default=True,
                     help="Leave out repetitions where other processes used more than this "
                          "share of the CPU (1 = keep all)."),
        click.option("--json", "json_path", metavar="FILE",
                     help="Write every raw timing and the summary as JSON."),
        click.option("--plot", "plot_path", metavar="FILE.png",
                     help="Plot tokens/s per mode and acceptance by position "
                          "(needs matplotlib: specllama[plot])."),
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


@click.command("bench")
@_bench_options
def bench_command(**opts: Any) -> None:
    """Benchmark the target alone, fixed draft lengths and auto, side by side.

    Every mode runs on the same prompts with the same seeds, threads and max
    tokens; repetitions are interleaved and figures are medians. Run it on an
    otherwise idle machine: llama.cpp slows down a lot when other processes
    share the cores.
    """
    from .options import open_decoder
    from .ui import stderr_console

    console = stderr_console()
    modes = parse_modes(opts["modes"])
    prompts = load_prompts(opts["prompts_path"]) if opts["prompts_path"] else builtin_prompts()
    if opts["plot_path"]:  # fail before the long run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise InvalidParameterError(
                "--plot needs matplotlib: pip install 'specllama[plot]' (or matplotlib)"
            ) from exc
    load = loadavg()
    if load is not None and load > 0.5 * (os.cpu_count() or 1):
        console.print(f"[yellow]warning:[/yellow] load average {load:.2f} on "
                      f"{os.cpu_count()} cores: other processes compete for the CPU and the "
                      "figures will be noisy")
    decoder, settings = open_decoder(opts, console)
    try:

        def progress(msg: str) -> None:
            console.print(f"[dim]{msg}[/dim]")

        report = run_bench(
            decoder, prompts, modes,
            reps=opts["reps"], max_tokens=opts["max_tokens"], sampling=settings.sampling,
            draft_mode=settings.draft_mode, warmup=opts["warmup"], raw=opts["raw"],
            progress=progress, max_foreign=opts["max_foreign"],
        )
    finally:
        decoder.close()
    report["command"] = " ".join(["specllama", *sys.argv[1:]]) if sys.argv else "specllama bench"
    out = sys.stdout
    from rich.console import Console

    screen = Console(file=out, highlight=False)
    for table in render_tables(report):
        screen.print(table)
    screen.print(describe_environment(report), style="dim")
    note = report["summary"]["overall"].get("auto", {}).get("policy_note")
    if note:
        screen.print(f"auto, last run: {note}", style="dim")
    if opts["json_path"]:
        write_json(report, opts["json_path"])
        console.print(f"[dim]wrote {opts['json_path']}[/dim]")
    if opts["plot_path"]:
        write_plot(report, opts["plot_path"])
        console.print(f"[dim]wrote {opts['plot_path']}[/dim]")
