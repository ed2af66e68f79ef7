"""`specllama bench`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from ...console import stderr_console
from ...errors import InvalidParameterError
from ...loading import RunOptions, open_decoder
from ...policy.cpumeter import loadavg
from ..options import RECALIBRATE_OPTION, model_options, run_options, setting_option
from .prompts import BUILTIN_SETS, DEFAULT_MODES, builtin_prompts, load_prompts, parse_modes
from .report import (
    describe_environment,
    predicted_line,
    render_tables,
    verdict,
    write_json,
    write_plot,
)
from .run import DEFAULT_MAX_TOKENS, DEFAULT_REPS, DEFAULT_SEED, run_bench
from .summary import DEFAULT_MAX_FOREIGN

F = TypeVar("F", bound=Callable[..., Any])


def _bench_options(f: F) -> F:
    decorators: list[Callable[[F], F]] = [
        model_options,
        click.option("--prompts", "prompts_path", metavar="FILE|NAME",
                     help="Your prompts: one per line, or JSONL with a 'prompt' field (and "
                          "an optional 'schema'); or a built-in set by name: "
                          + ", ".join(BUILTIN_SETS) + "."),
        click.option("--modes", default=DEFAULT_MODES, show_default=True, metavar="LIST",
                     help="Comma-separated: target, auto, context (auto drafting from each "
                          "call's own context alone), heuristic, draft lengths (1,2,4...); "
                          "any but target with @DRAFTERS joined by '+' (auto@lookup>model, "
                          "4@lookup+model) to override --drafters for that mode."),
        click.option("--reps", type=click.IntRange(1), default=DEFAULT_REPS, show_default=True,
                     help="Repetitions of each prompt and mode (interleaved)."),
        click.option("--max-tokens", type=click.IntRange(1), default=DEFAULT_MAX_TOKENS,
                     show_default=True, help="Tokens to generate per run."),
        *(setting_option(name) for name in ("temperature", "top_k", "top_p", "min_p",
                                            "repeat_penalty", "repeat_last_n",
                                            "presence_penalty", "frequency_penalty")),
        click.option("--seed", type=click.IntRange(0), default=DEFAULT_SEED, show_default=True,
                     help="Seed of the first repetition (then +1 per repetition)."),
        setting_option("p_min"),
        RECALIBRATE_OPTION,
        setting_option("drafters"),
        *(setting_option(name) for name in ("json_schema", "grammar", "regex")),
        click.option("--raw", is_flag=True, help="Do not wrap prompts in the chat template."),
        click.option("--carry", is_flag=True,
                     help="Run the prompts in order as one sequence of requests per mode and "
                          "repetition, each drafting from the outputs before it (without: "
                          "every run starts with none)."),
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
@run_options
def bench_command(run: RunOptions, prompts_path: str | None, modes: str, reps: int, raw: bool,
                  carry: bool, warmup: bool, max_foreign: float, json_path: str | None,
                  plot_path: str | None) -> None:
    """Benchmark the target alone, fixed draft lengths and auto, side by side.

    Every mode runs on the same prompts with the same seeds, threads and max
    tokens; repetitions are interleaved and figures are medians. Run it on an
    otherwise idle machine: llama.cpp slows down a lot when other processes
    share the cores.
    """
    console = stderr_console()
    mode_list = parse_modes(modes)
    prompts = load_prompts(prompts_path) if prompts_path else builtin_prompts()
    if plot_path:  # fail before the long run, not after it
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
    decoder, settings = open_decoder(run, console)
    try:

        def progress(msg: str) -> None:
            console.print(f"[dim]{msg}[/dim]")

        report = run_bench(
            decoder, prompts, mode_list,
            reps=reps, max_tokens=settings.max_tokens, sampling=settings.sampling,
            drafters=settings.drafters, warmup=warmup, raw=raw,
            constraint=settings.constraint, carry=carry,
            progress=progress, max_foreign=max_foreign,
        )
    finally:
        decoder.close()
    report["command"] = " ".join(["specllama", *sys.argv[1:]]) if sys.argv else "specllama bench"
    screen = Console(file=sys.stdout, highlight=False)
    screen.print(verdict(report), style="bold")
    for table in render_tables(report):
        screen.print(table)
    screen.print(describe_environment(report), style="dim")
    predicted = predicted_line(report)
    if predicted:
        screen.print(predicted, style="dim")
    note = report["summary"]["overall"].get("auto", {}).get("policy_note")
    if note:
        screen.print(f"auto, last run: {note}", style="dim")
    if json_path:
        write_json(report, json_path)
        console.print(f"[dim]wrote {json_path}[/dim]")
    if plot_path:
        write_plot(report, plot_path)
        console.print(f"[dim]wrote {plot_path}[/dim]")
