"""Options shared by `generate`, `chat` and `bench`, and loading a decoder from them.

The flags come from the settings table (engine/settings.py). Precedence for every
setting: command-line flag, then the pair's defaults in models.toml, then the
table's default.
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from ..engine.decoder import SpeculativeDecoder
from ..engine.drafting.chain import NEED_MODEL, check_drafters, default_drafters, slot_of
from ..engine.drafting.corpus import read_corpus
from ..engine.drafting.draftcache import tokenizer_fingerprint
from ..engine.settings import (
    LIVE_SETTINGS,
    SETTINGS,
    Overrides,
    Settings,
    validate_setting,
)
from ..errors import InvalidParameterError
from ..models.config import Pair, find_and_load_config, source_from_flag
from ..models.hf import resolve_hf
from ..models.sources import check_gguf_file, resolve_pair
from ..models.synthetic import SYNTHETIC_KEY
from ..paths import cache_dir
from ..policy import AutoState
from ..policy.cpumeter import MIN_WALL_S, CpuMeter, cores, threads_for
from ..policy.split import Split
from ..policy.split import for_decoder as split_for
from .ui import spinner

F = TypeVar("F", bound=Callable[..., Any])


class IntOrWord(click.ParamType):
    """An integer, or one of a setting's words ('auto', ...); the table checks the range."""

    name = "N|auto"

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value in self.words:
            return value
        try:
            return int(value)
        except (TypeError, ValueError):
            said = ", ".join(f"'{w}'" for w in self.words)
            self.fail(f"expected an integer or {said}, got {value!r}", param, ctx)


def setting_option(name: str) -> Callable[[F], F]:
    """The flag of one setting, from the settings table. It has no click default:
    an absent flag leaves the pair's default (or the table's) in force."""
    s = SETTINGS[name]
    kind: Any = s.type
    if s.type is tuple:
        return click.option(s.flag, name, metavar=s.metavar or "HOST:PORT", multiple=True,
                            help=s.help)
    if s.metavar:
        return click.option(s.flag, *s.aliases, name, metavar=s.metavar, help=s.help)
    if s.type is bool:  # None when absent, like every other setting's flag
        return click.option(s.flag, name, is_flag=True, flag_value=True, default=None,
                            help=s.help)
    if s.type is int and s.words:
        kind = IntOrWord(s.words)
    elif s.type is str:
        kind = click.Choice(s.words)
    shown = "" if s.default is None else f" [default {s.default}]"
    return click.option(s.flag, *s.aliases, name, type=kind, help=s.help + shown)


def settings_markdown() -> str:
    """The settings table as the README shows it (a test keeps the two in step)."""
    rows = ["| flag | models.toml / `/set` | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        where = ", ".join(w for w, ok in (("[defaults]", s.in_file), ("/set", not s.at_load))
                          if ok) or "-"
        shown = "-" if s.default is None or s.default == () else f"`{s.default}`"
        flags = ", ".join(f"`{f}`" for f in (s.flag, *s.aliases))
        rows.append(f"| {flags} | {where} | {shown} | {s.help} |")
    return "\n".join(rows)


def _apply(f: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def model_options(f: F) -> F:
    """--pair/--config or --target/--draft, plus the settings fixed at load."""
    return _apply(f, [
        click.option("--pair", "pair_name", metavar="NAME", help="Model pair from models.toml."),
        click.option("--config", "config_path", metavar="FILE", help="models.toml to use."),
        click.option("--target", metavar="GGUF", help="Target model file (instead of --pair)."),
        click.option(
            "--draft", metavar="GGUF|lookup",
            help="Draft model file, or 'lookup' for none (the default with --target: the "
                 "target drafts for itself, by lookup and its MTP layers if it has them)."
        ),
        *(setting_option(n) for n, s in SETTINGS.items() if s.at_load),
    ])


RECALIBRATE_OPTION = click.option(
    "--recalibrate",
    is_flag=True,
    help="Measure decode costs again for --draft-max auto instead of using the cached "
    "ones (after a busy spell, or new hardware settings).",
)


def sampling_options(f: F) -> F:
    """Every setting that can change while the models stay loaded."""
    return _apply(f, [*(setting_option(n) for n in LIVE_SETTINGS), RECALIBRATE_OPTION])


def view_options(f: F) -> F:
    """How replies are shown: the live drafts view of the seed demo. Display only, so
    not in the settings table (the engine never renders)."""
    return _apply(f, [
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
    ])


@dataclass(frozen=True)
class RunSettings(Settings):
    """Every setting of a run, resolved, and what it runs: what --json reports and /set
    changes. Its settings are the table's (engine/settings.py), so a new one follows."""

    drafters: tuple[str, ...] = ("lookup", "model")  # resolved for the pair loaded
    pair: str | None = None
    target: str = ""
    draft: str = ""
    stop: tuple[str, ...] = ()
    #: What a synthetic target says of itself (random weights: costs real, text meaningless).
    synthetic: str | None = None

    def as_dict(self) -> dict[str, object]:
        """For JSON: every field, tuples as lists; `synthetic` only for a synthetic model."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: list(v) if isinstance(v, tuple) else v for name, v in values
                if name != "synthetic" or v is not None}


@dataclass(frozen=True)
class RunOptions:
    """What the command line says about a run: which models, and the setting flags given
    (checked by the table once the models are chosen, so a missing file is told first)."""

    pair_name: str | None = None
    config_path: str | None = None
    target: str | None = None
    draft: str | None = None
    recalibrate: bool = False
    flags: tuple[tuple[str, object], ...] = ()  # (setting name, value as click gave it)

    def overrides(self) -> Overrides:
        return Overrides.of(**{name: validate_setting(name, value, label=SETTINGS[name].flag)
                               for name, value in self.flags})


_MODEL_FLAGS = ("pair_name", "config_path", "target", "draft", "recalibrate")


def run_options(f: Callable[..., None]) -> Callable[..., None]:
    """Gather a command's model and setting flags into its first argument, a RunOptions;
    the command's own options stay keyword arguments."""

    @functools.wraps(f)
    def wrapper(**kwargs: Any) -> None:
        flags = tuple((name, value) for name in SETTINGS
                      if (value := kwargs.pop(name, None)) is not None and value != ())
        models = {name: kwargs.pop(name) for name in _MODEL_FLAGS if name in kwargs}
        f(RunOptions(**models, flags=flags), **kwargs)

    return wrapper


def resolve_settings(run: RunOptions, pair: Pair | None) -> Settings:
    """Flag > pair default > the table's default, each flag validated by the table."""
    settings = Settings() if pair is None else pair.defaults.over(Settings())
    return run.overrides().over(settings)


@dataclass
class ModelChoice:
    target: Path
    draft: Path | None  # None: no draft model (lookup or target alone)
    pair: Pair | None
    draft_label: str


def _flag_model(value: str, role: str, progress: Callable[[str], None]) -> Path | None:
    """A --target/--draft value as a checked GGUF path (None: a lookup draft)."""
    source = source_from_flag(value, role=role)
    if source.kind == "lookup":
        return None
    if source.kind == "hf":
        return resolve_hf(source, what=f"{role} model", hint="", progress=progress,
                          fetch=f"specllama pull {shlex.quote(source.hf_url)}")
    assert source.path is not None
    return check_gguf_file(source.path, what=f"{role} model")


def choose_models(run: RunOptions, progress: Callable[[str], None]) -> ModelChoice:
    """The files to load, from --target/--draft or a pair in models.toml."""
    if run.target:
        if run.pair_name:
            raise InvalidParameterError("give either --pair or --target/--draft, not both")
        target = _flag_model(run.target, "target", progress)
        assert target is not None  # "lookup" is refused for a target
        # no --draft: the target drafts for itself (prompt lookup)
        draft_file = _flag_model(run.draft, "draft", progress) if run.draft else None
        return ModelChoice(target, draft_file, None, str(draft_file) if draft_file else "lookup")
    if run.draft:
        raise InvalidParameterError("--draft needs --target (or choose a pair with --pair)")
    config = find_and_load_config(run.config_path)
    pair = config.pair(run.pair_name)
    threads = dict(run.flags).get("threads")
    target, draft = resolve_pair(pair, n_threads=threads if isinstance(threads, int) else None,
                                 progress=progress)
    return ModelChoice(target, draft, pair, str(draft) if draft else "lookup")


def open_decoder(run: RunOptions, console: Console, *, calibrate: bool = True,
                 n_seq: int = 1) -> tuple[SpeculativeDecoder, RunSettings]:
    """Resolve models and settings, load both models with a spinner, and measure auto's
    decode costs unless `calibrate` is False (serve measures them on the thread that
    decodes: see server/worker.py)."""
    def progress(message: str) -> None:
        console.print(f"[dim]{message}[/dim]")

    choice = choose_models(run, progress)
    merged = resolve_settings(run, choice.pair)
    # (without a draft file the target may draft for itself: known once it is loaded)
    drafters = check_drafters(merged.drafters or ("lookup",), "model" if choice.draft else None)
    if n_seq > 1 and isinstance(merged.draft_threads, int) and merged.draft_threads > 0:
        raise InvalidParameterError("--draft-threads drafts ahead for one request at a time; "
                                    "with --parallel above 1 leave it at 0")
    constraint = merged.constraint  # a bad schema, grammar or regex fails before loading
    if constraint is not None:
        constraint.grammar()
    # --rpc replaces the pair's own servers (models.toml: target = { ..., rpc = [...] })
    rpc = merged.rpc or (choice.pair.target_rpc if choice.pair else ())
    names = choice.target.name + (f" + {choice.draft.name}" if choice.draft else "")
    if rpc:
        names += f" (target on {', '.join(rpc)})"
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    with spinner(console, f"loading {names}") as say:
        decoder = SpeculativeDecoder.load(
            choice.target,
            choice.draft if choice.draft is not None else "lookup",
            n_ctx=merged.n_ctx,
            n_threads=merged.threads,
            p_min=merged.p_min,
            target_rpc=rpc,
            cross_vocab=merged.cross_vocab,
            n_seq=n_seq,
        )
        slot = slot_of(decoder.draft)
        drafters = check_drafters(merged.drafters or default_drafters(slot), slot,
                                  choice.target.name)
        if merged.threads is None:
            _choose_threads(decoder, meter, t0, console)
        if calibrate:  # here rather than at the first round: the time shows as loading
            measure_costs(decoder, merged.draft_max, run.recalibrate, say)
            split = _split(decoder, merged, drafters, say)
        elif isinstance(merged.draft_threads, int) and merged.draft_threads > 0:
            split = _split(decoder, merged, drafters, say)  # serve: a number, as it is
        attach_cache(decoder, merged, say, console)
    if calibrate and split is not None:
        console.print(f"[dim]{split.describe()}[/dim]")
    synthetic = decoder.target.meta(SYNTHETIC_KEY)
    if synthetic:  # whatever is timed or read from this run, it is not a real model's
        console.print(f"note: synthetic model, {synthetic}", markup=False, highlight=False)
    if decoder.n_ctx != merged.n_ctx:
        # llama.cpp rounds the context up (to a multiple of 256): say so, not silently.
        console.print(f"note: the context window is {decoder.n_ctx} tokens, not "
                      f"{merged.n_ctx}: llama.cpp rounds it up to what it supports")
    resolved: dict[str, Any] = {f.name: getattr(merged, f.name) for f in fields(merged)}
    # What was loaded: the context llama.cpp gave, the threads chosen, the servers used.
    resolved.update(drafters=drafters, n_ctx=decoder.n_ctx, threads=decoder.threads,
                    draft_threads=decoder.draft_threads, rpc=rpc)
    settings = RunSettings(**resolved, pair=choice.pair.name if choice.pair else None,
                           target=str(choice.target),
                           draft="mtp" if slot == "mtp" else choice.draft_label,
                           synthetic=synthetic)
    return decoder, settings


def _split(decoder: SpeculativeDecoder, merged: Settings, drafters: tuple[str, ...],
           say: Callable[[str], None]) -> Split | None:
    """--draft-threads: a number applied as it is, "auto" measured (only where the draft
    model drafts, with auto's costs to weigh it with)."""
    if decoder.draft is None or not NEED_MODEL & set(drafters):
        if merged.draft_threads not in ("auto", 0):
            raise InvalidParameterError("--draft-threads needs the draft model among the "
                                        f"drafters, not {','.join(drafters)}")
        return None
    if merged.draft_threads == "auto" and merged.draft_max != "auto":
        return None  # (nothing measured to weigh it with: take turns)
    if isinstance(merged.draft_threads, int) and merged.draft_threads >= decoder.threads:
        raise InvalidParameterError(f"--draft-threads must be fewer than the "
                                    f"{decoder.threads} threads in all")
    return split_for(decoder, merged.draft_threads, say)


def attach_cache(decoder: SpeculativeDecoder, merged: Settings, say: Callable[[str], None],
                 console: Console) -> None:
    """--corpus and --draft-cache: what lookups may copy from besides the context. A
    path that does not exist is an error; a file that cannot be used, a warning."""
    paths = [Path(p).expanduser() for p in merged.corpus]
    for path in paths:
        if not path.exists():
            raise InvalidParameterError(f"--corpus: {path}: no such file or folder")
    cache_file = None if merged.draft_cache in (None, "off") else \
        Path(str(merged.draft_cache)).expanduser()
    if not paths and cache_file is None:
        return
    fingerprint = tokenizer_fingerprint(decoder.target)
    warnings: list[str] = []
    if paths:
        say("reading the corpus (tokenized once, then cached)")
        target = decoder.target
        files, warnings = read_corpus(
            paths, lambda text: target.tokenize(text, add_bos=False, special=False),
            fingerprint, cache_dir())
        decoder.suffix_cache.add_corpus(files)
    if cache_file is not None:
        warning = decoder.suffix_cache.load(cache_file, fingerprint)
        warnings += [warning] if warning else []
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False)


def measure_costs(decoder: SpeculativeDecoder, draft_max: int | str, recalibrate: bool,
                  say: Callable[[str], None]) -> None:
    """auto's decode costs, measured now unless cached (`say` tells what it measures)."""
    if draft_max == "auto" or recalibrate:
        why = AutoState.measuring(decoder, refresh=recalibrate)
        if why:
            say(why)
        AutoState.for_decoder(decoder, refresh=recalibrate)


def _choose_threads(decoder: SpeculativeDecoder, meter: CpuMeter, t0: float,
                    console: Console) -> None:
    """Without --threads: as many threads as there are cores other processes left
    free while the models loaded (llama.cpp's threads stall on a core in use)."""
    left = MIN_WALL_S - (time.perf_counter() - t0)
    if left > 0:
        time.sleep(left)  # /proc/stat needs this long to tell busy from idle
    busy = meter.stop()
    n_cores = cores()
    n = threads_for(busy, n_cores)
    if n != decoder.threads:
        decoder.set_threads(n)
    if busy is not None and n < n_cores:
        console.print(f"note: other processes are using {busy:.0%} of the CPU, so this runs "
                      f"on {n} thread{'s' if n > 1 else ''} of {n_cores} (--threads N to choose)")
