"""Options shared by `generate`, `chat` and `bench`, and loading a decoder from them.

Precedence for every setting: command-line flag, then the pair's defaults in
models.toml, then the built-in default below.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from .config import Pair, find_and_load_config, validate_setting
from .errors import InvalidParameterError
from .policy import DEFAULT_P_MIN
from .sampling import SamplingParams

BUILTIN_DEFAULTS: dict[str, Any] = {
    "n_ctx": 2048,
    "threads": None,  # all cores
    "draft_max": "auto",
    "temperature": 0.8,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "max_tokens": 256,
    "seed": None,
    "p_min": DEFAULT_P_MIN,
}
DRAFT_MODES = ("model", "lookup", "hybrid")


class DraftMaxType(click.ParamType):
    """An integer 0..64, or 'auto' (cost-aware) or 'heuristic'."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, int) or value in ("auto", "heuristic"):
            return value
        try:
            return int(value)
        except (TypeError, ValueError):
            self.fail(f"expected an integer, 'auto' or 'heuristic', got {value!r}", param, ctx)


def model_options(f: Callable) -> Callable:
    """--pair/--config or --target/--draft, plus context size and threads."""
    decorators = [
        click.option("--pair", "pair_name", metavar="NAME", help="Model pair from models.toml."),
        click.option("--config", "config_path", metavar="FILE", help="models.toml to use."),
        click.option("--target", metavar="GGUF", help="Target model file (instead of --pair)."),
        click.option(
            "--draft", metavar="GGUF|lookup", help="Draft model file, or 'lookup' for none."
        ),
        click.option("--n-ctx", type=int, help="Context window in tokens."),
        click.option("--threads", type=int, help="CPU threads (default: all cores)."),
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


RECALIBRATE_OPTION = click.option(
    "--recalibrate",
    is_flag=True,
    help="Measure decode costs again for --draft-max auto instead of using the cached "
    "ones (after a busy spell, or new hardware settings).",
)


def sampling_options(f: Callable) -> Callable:
    """Sampling and speculation settings."""
    decorators = [
        click.option("--temperature", type=float, help="0 = greedy. [default 0.8]"),
        click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, help="Nucleus sampling mass in (0, 1]."),
        click.option("--min-p", type=float, help="Drop tokens below min_p × the top probability."),
        click.option("--seed", type=int, help="Random seed (same seed, same output)."),
        click.option("--max-tokens", type=int, help="Tokens to generate at most. [default 256]"),
        click.option(
            "--draft-max",
            type=DraftMaxType(),
            help="Draft length: N (0 = target alone), 'auto' (cost-aware) or 'heuristic'.",
        ),
        click.option(
            "--draft-mode",
            type=click.Choice(DRAFT_MODES),
            help="Who drafts: the draft model, prompt lookup, or both.",
        ),
        click.option(
            "--p-min",
            type=float,
            help=f"Stop a draft when the draft model's top token has less probability "
            f"(0 = never; exact either way). [default {DEFAULT_P_MIN}]",
        ),
        RECALIBRATE_OPTION,
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def view_options(f: Callable) -> Callable:
    """How replies are shown: the live drafts view of the seed demo."""
    decorators = [
        click.option(
            "--show-drafts",
            is_flag=True,
            help="On a terminal, show each round's drafts as they are proposed (blue), then "
            "the verdict: accepted green, rejected struck through, the target's token yellow.",
        ),
        click.option(
            "--pace",
            type=click.IntRange(min=0),
            default=0,
            metavar="MS",
            help="Pause MS milliseconds after the drafts appear and after each verdict, to "
            "follow it by eye (implies --show-drafts; timings then include the pauses).",
        ),
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


@dataclass
class RunSettings:
    """Every setting of a run, resolved; what --json reports and /set changes."""

    sampling: SamplingParams
    max_tokens: int
    draft_max: int | str
    draft_mode: str
    n_ctx: int
    threads: int | None
    p_min: float = DEFAULT_P_MIN
    pair: str | None = None
    target: str = ""
    draft: str = ""
    stop: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        s = self.sampling
        return {
            "pair": self.pair,
            "target": self.target,
            "draft": self.draft,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "seed": s.seed,
            "max_tokens": self.max_tokens,
            "draft_max": self.draft_max,
            "draft_mode": self.draft_mode,
            "p_min": self.p_min,
            "n_ctx": self.n_ctx,
            "threads": self.threads,
            "stop": list(self.stop),
        }


SETTING_FLAGS = {
    "n_ctx": "--n-ctx",
    "threads": "--threads",
    "draft_max": "--draft-max",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
    "p_min": "--p-min",
}


def resolve_settings(opts: dict[str, Any], pair: Pair | None) -> dict[str, Any]:
    """Flag > pair default > built-in default, each flag validated with the file's rules."""
    merged = dict(BUILTIN_DEFAULTS)
    if pair is not None:
        merged.update(pair.defaults.as_dict())
    for name, flag in SETTING_FLAGS.items():
        value = opts.get(name)
        if value is not None:
            merged[name] = validate_setting(name, value, label=flag)
    return merged


@dataclass
class ModelChoice:
    target: Path
    draft: Path | None  # None: no draft model (lookup or target alone)
    pair: Pair | None
    draft_label: str


def choose_models(opts: dict[str, Any], progress: Callable[[str], None]) -> ModelChoice:
    """The files to load, from --target/--draft or a pair in models.toml."""
    from .sources import check_gguf_file, resolve_pair

    if opts.get("target"):
        if opts.get("pair_name"):
            raise InvalidParameterError("give either --pair or --target/--draft, not both")
        target = check_gguf_file(Path(opts["target"]).expanduser(), what="target model")
        draft_opt = opts.get("draft")
        if not draft_opt:
            raise InvalidParameterError(
                "--target needs --draft (a GGUF file, or 'lookup' for prompt-lookup drafts)"
            )
        if draft_opt == "lookup":
            return ModelChoice(target, None, None, "lookup")
        draft = check_gguf_file(Path(draft_opt).expanduser(), what="draft model")
        return ModelChoice(target, draft, None, str(draft))
    if opts.get("draft"):
        raise InvalidParameterError("--draft needs --target (or choose a pair with --pair)")
    config = find_and_load_config(opts.get("config_path"))
    pair = config.pair(opts.get("pair_name"))
    target, draft = resolve_pair(pair, n_threads=opts.get("threads"), progress=progress)
    return ModelChoice(target, draft, pair, str(draft) if draft else "lookup")


def open_decoder(opts: dict[str, Any], console: Console):
    """Resolve models and settings, load both models with a spinner; returns
    (decoder, RunSettings)."""
    from .speculative import SpeculativeDecoder
    from .ui import spinner

    def progress(message: str) -> None:
        console.print(f"[dim]{message}[/dim]")

    choice = choose_models(opts, progress)
    merged = resolve_settings(opts, choice.pair)
    sampling = SamplingParams(
        temperature=float(merged["temperature"]),
        top_k=merged["top_k"],
        top_p=float(merged["top_p"]),
        min_p=float(merged["min_p"]),
        seed=merged["seed"],
    )
    draft_mode = opts.get("draft_mode") or ("lookup" if choice.draft is None else "model")
    if draft_mode == "model" and choice.draft is None:
        raise InvalidParameterError(
            "--draft-mode model needs a draft model, but this pair drafts by lookup"
        )
    names = choice.target.name + (f" + {choice.draft.name}" if choice.draft else "")
    with spinner(console, f"loading {names}") as say:
        decoder = SpeculativeDecoder.load(
            choice.target,
            choice.draft if choice.draft is not None else "lookup",
            n_ctx=merged["n_ctx"],
            n_threads=merged["threads"],
            p_min=merged["p_min"],
        )
        if merged["draft_max"] == "auto" or opts.get("recalibrate"):
            # Here rather than at the first round, so the time shows as loading.
            from .policy import AutoState

            say("measuring decode costs (cached for next time)")
            AutoState.for_decoder(decoder, refresh=bool(opts.get("recalibrate")))
    settings = RunSettings(
        sampling=sampling,
        max_tokens=merged["max_tokens"],
        draft_max=merged["draft_max"],
        draft_mode=draft_mode,
        p_min=merged["p_min"],
        n_ctx=decoder.n_ctx,
        threads=decoder.target.n_threads,
        pair=choice.pair.name if choice.pair else None,
        target=str(choice.target),
        draft=choice.draft_label,
    )
    return decoder, settings


def pass_options(f: Callable) -> Callable:
    """Collect a command's keyword options into one dict argument `opts`."""

    @functools.wraps(f)
    def wrapper(**kwargs: Any):
        return f(kwargs)

    return wrapper

