"""Opening a pair: from what a run names (a pair or files, and setting flags) to a loaded
decoder and its resolved settings. Every command does this, and so does the engine
process that `serve` and a remote `chat` start (so none of it is command-line code).

Precedence for every setting: command-line flag, then the pair's defaults in
models.toml, then the table's default (engine/settings.py).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console

from .console import spinner, stderr_console
from .engine.decoder import SpeculativeDecoder
from .engine.drafting.chain import NEED_MODEL, Drafters, draft_kind, who_drafts
from .engine.drafting.corpus import read_corpus
from .engine.drafting.draftcache import tokenizer_fingerprint
from .engine.settings import SETTINGS, Overrides, Settings, validate_setting
from .errors import InvalidParameterError
from .models.config import Pair, find_and_load_config, source_from_flag
from .models.hf import resolve_hf
from .models.sources import check_gguf_file, resolve_pair
from .models.synthetic import SYNTHETIC_KEY
from .paths import cache_dir
from .policy import AutoState
from .policy.cpumeter import MIN_WALL_S, CpuMeter, cores, threads_for
from .policy.split import Split
from .policy.split import for_decoder as split_for


@dataclass(frozen=True)
class RunSettings(Settings):
    """Every setting of a run, resolved, and what it runs: what --json reports and /set
    changes. Its settings are the table's (engine/settings.py), so a new one follows."""

    drafters: Drafters = Drafters.default("model")  # resolved for the pair loaded
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
    choice = choose_models(run, lambda message: console.print(f"[dim]{message}[/dim]"))
    merged = resolve_settings(run, choice.pair)
    _check_before_loading(merged, choice, n_seq)
    # --rpc replaces the pair's own servers (models.toml: target = { ..., rpc = [...] })
    rpc = merged.rpc or (choice.pair.target_rpc if choice.pair else ())
    names = choice.target.name + (f" + {choice.draft.name}" if choice.draft else "")
    if rpc:
        names += f" (target on {', '.join(rpc)})"
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    split: Split | None = None
    with spinner(console, f"loading {names}") as say:
        decoder = SpeculativeDecoder.load(
            choice.target, choice.draft if choice.draft is not None else "lookup",
            n_ctx=merged.n_ctx, n_threads=merged.threads, p_min=merged.p_min,
            target_rpc=rpc, cross_vocab=merged.cross_vocab, n_seq=n_seq)
        drafters = who_drafts(merged.drafters, decoder.draft_model, choice.target.name)
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
    return decoder, _loaded(decoder, merged, choice, drafters, rpc, console)


def _check_before_loading(merged: Settings, choice: ModelChoice, n_seq: int) -> None:
    """What can be refused before the models load (seconds, not a minute, later)."""
    # (without a draft file the target may draft for itself: known once it is loaded)
    if merged.drafters and choice.draft:
        merged.drafters.check("model")
    if n_seq > 1 and isinstance(merged.draft_threads, int) and merged.draft_threads > 0:
        raise InvalidParameterError("--draft-threads drafts ahead for one request at a time; "
                                    "with --parallel above 1 leave it at 0")
    if merged.constraint is not None:  # a bad schema, grammar or regex fails here
        merged.constraint.grammar()


def _loaded(decoder: SpeculativeDecoder, merged: Settings, choice: ModelChoice,
            drafters: Drafters, rpc: tuple[str, ...], console: Console) -> RunSettings:
    """The run's settings as loaded, with the notes a user should read about them."""
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
    kind = draft_kind(decoder.draft)
    return RunSettings(**resolved, pair=choice.pair.name if choice.pair else None,
                       target=str(choice.target),
                       draft="mtp" if kind == "mtp" else choice.draft_label,
                       synthetic=synthetic)


def _split(decoder: SpeculativeDecoder, merged: Settings, drafters: Drafters,
           say: Callable[[str], None]) -> Split | None:
    """--draft-threads: a number applied as it is, "auto" measured (only where the draft
    model drafts, with auto's costs to weigh it with)."""
    if decoder.draft is None or not NEED_MODEL & set(drafters):
        if merged.draft_threads not in ("auto", 0):
            raise InvalidParameterError("--draft-threads needs the draft model among the "
                                        f"drafters, not {','.join(drafters)}")
        return None
    if merged.draft_threads == "auto" and (merged.draft_max != "auto"
                                           or not decoder.may_draft_ahead):
        return None  # (nothing measured to weigh it with, or it cannot: take turns)
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
        decoder.draft_cache.add_corpus(files)
    if cache_file is not None:
        warning = decoder.draft_cache.load(cache_file, fingerprint)
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


def serve_engine(run: RunOptions, first: bool, parallel: int = 1) -> tuple[
        SpeculativeDecoder, Callable[[], None], RunSettings]:
    """`serve`'s engine process (server/child.py's Factory): load the pair as any
    command does (a spinner and notes the first time only; the target with `parallel`
    sequences), and how to measure auto's costs on the thread that decodes."""
    err = stderr_console(plain=not first)
    decoder, settings = open_decoder(run, err, calibrate=False, n_seq=parallel)

    def measure() -> None:
        measure_costs(decoder, settings.draft_max, run.recalibrate and first,
                      lambda why: err.print(why, style="dim", markup=False))

    return decoder, measure, settings


def chat_engine(run: RunOptions, first: bool) -> tuple[
        SpeculativeDecoder, Callable[[], None], tuple[RunSettings, str | None, str]]:
    """A remote `chat`'s engine process: load as `chat` does (costs measured on this, the
    decoding thread); tell the settings, the draft's file and what it drafts as (a draft
    model, or the target's own MTP layers)."""
    decoder, settings = open_decoder(run, stderr_console(plain=not first))
    draft = str(decoder.draft.path) if decoder.draft is not None else None
    return decoder, lambda: None, (settings, draft, draft_kind(decoder.draft))


def target_is_remote(run: RunOptions) -> bool:
    """--rpc, or a pair whose target lists RPC servers (models.toml)."""
    pair = None if run.target else find_and_load_config(run.config_path).pair(run.pair_name)
    merged = resolve_settings(run, pair)
    return bool(merged.rpc or (pair.target_rpc if pair else ()))
