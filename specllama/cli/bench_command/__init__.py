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

from .command import bench_command
from .prompts import BenchPrompt, Mode, builtin_prompts, load_prompts, parse_modes, parse_prompts
from .report import describe_environment, render_tables, write_json, write_plot
from .run import run_bench
from .summary import summarize

__all__ = [
    "BenchPrompt",
    "Mode",
    "bench_command",
    "builtin_prompts",
    "describe_environment",
    "load_prompts",
    "parse_modes",
    "parse_prompts",
    "render_tables",
    "run_bench",
    "summarize",
    "write_json",
    "write_plot",
]
