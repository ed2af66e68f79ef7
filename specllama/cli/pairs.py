"""`specllama pairs`: the pairs in models.toml, and a check that one works."""

from __future__ import annotations

import sys
import time

import click

from ..console import stderr_console
from ..engine.checks import batch_invariance, measure
from ..engine.decoder import SpeculativeDecoder
from ..engine.sampling import SamplingParams
from ..errors import SpecLlamaError
from ..models.config import Pair, find_and_load_config, packaged_config_path
from ..models.sources import resolve_pair
from ..models.status import locations, pending_downloads, pending_synthetic, source_status
from ..models.synthetic import SYNTHETIC_KEY

#: What `pairs check` generates from: a chat question, then raw text and code (a base
#: model has no chat template, and acceptance differs between kinds of text).
CHECK_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "The history of the printing press begins",
    "def is_prime(n):\n",
)
AGREEMENT_TOKENS = 32
BATCH_CHECK_TOKENS = 24


def _vocabularies(dec: SpeculativeDecoder) -> str:
    drafter = dec.draft_model
    return drafter.vocabulary_note() if drafter is not None else "no draft model"


@click.group()
def pairs() -> None:
    """List and inspect the model pairs in models.toml."""


def _origin(pair: Pair) -> str:
    if pair.config_path is None or pair.config_path.resolve() == packaged_config_path().resolve():
        return "built in"
    return f"defined in {pair.config_path}"


@pairs.command("list")
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pairs_list(config_path: str | None) -> None:
    """Every pair, its models, whether they are on this machine, and where it is defined."""
    config = find_and_load_config(config_path)
    # Lines rather than a table: a table at 80 columns cuts names and paths short.
    for name, pair in config.pairs.items():
        mark = " (default)" if name == config.default else ""
        click.echo(f"{name}{mark}: {source_status(pair)}; {_origin(pair)}")
        click.echo(f"  target: {_target(pair)}")
        click.echo(f"  draft:  {_draft(pair)}")


def _target(pair: Pair) -> str:
    quant = f", requantized to {pair.target_quant}" if pair.target_quant else ""
    return pair.target.describe() + quant


def _draft(pair: Pair) -> str:
    quant = f", requantized to {pair.draft_quant}" if pair.draft_quant else ""
    return pair.draft.describe() + quant


@pairs.command("show")
@click.argument("name", required=False)
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pairs_show(name: str | None, config_path: str | None) -> None:
    """One pair (NAME, or the default) in full: sources, where they resolve, defaults."""
    config = find_and_load_config(config_path)
    pair = config.pair(name)
    target_at, draft_at = locations(pair)
    click.echo(f"pair:        {pair.name}{' (default)' if pair.name == config.default else ''}")
    if pair.description:
        click.echo(f"description: {pair.description}")
    click.echo(f"target:      {_target(pair)}")
    click.echo(f"  file:      {target_at}")
    if pair.target_rpc:
        click.echo(f"target on:   rpc {', '.join(pair.target_rpc)}")
    click.echo(f"draft:       {_draft(pair)}")
    click.echo(f"  file:      {draft_at}")
    click.echo(f"status:      {source_status(pair)}")
    click.echo(f"from:        {_origin(pair)}")
    defaults = pair.defaults.as_dict()
    if defaults:
        click.echo("defaults:    " + ", ".join(f"{k}={v}" for k, v in defaults.items()))


@pairs.command("check")
@click.argument("names", nargs=-1)
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
@click.option("--max-tokens", default=48, show_default=True, help="Tokens per test generation.")
@click.option("--threads", type=int, help="CPU threads (default: all cores).")
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(min=0.0),
              help="Temperature of the acceptance estimate.")
def pairs_check(names: tuple[str, ...], config_path: str | None, max_tokens: int,
                threads: int | None, temperature: float) -> None:
    """Load each pair (or NAMES), check the vocabularies match, time a short generation
    with and without the draft, and check the target's batched decodes agree with its
    single-token ones: the command to run when something seems off."""
    err = stderr_console()
    config = find_and_load_config(config_path)
    failed = 0
    # Without names: the pairs of the file found (the built-in ones when it is the
    # built-in file), not every built-in pair under a file of one's own.
    mine = [n for n, p in config.pairs.items() if p.config_path == config.path]
    for name in names or mine:
        pair = config.pair(name)
        pending = pending_downloads(pair)
        if pending and not names:
            # Checking everything must not start gigabytes of downloads unasked.
            click.echo(f"{name}: skipped: needs a download ({'; '.join(pending)}); "
                       f"run `specllama pairs check {name}` to fetch and check it")
            continue
        unmade = pending_synthetic(pair)
        if unmade and not names:  # nor minutes of writing gigabytes of random weights
            click.echo(f"{name}: skipped: its target is made on first use ({unmade}); "
                       f"run `specllama pairs check {name}` to make and check it")
            continue
        cross = bool(pair.defaults.as_dict().get("cross_vocab", False))
        try:
            t0 = time.perf_counter()
            target, draft = resolve_pair(pair, n_threads=threads,
                                         progress=lambda m: err.print(f"[dim]{m}[/dim]"))
            dec = SpeculativeDecoder.load(target, draft if draft else "lookup",
                                          n_ctx=1024, n_threads=threads,
                                          target_rpc=pair.target_rpc, cross_vocab=cross)
            load_s = time.perf_counter() - t0
        except SpecLlamaError as exc:
            failed += 1
            click.echo(f"{name}: FAILED: {exc}")
            continue
        _report(dec, name, load_s, max_tokens, temperature)
        dec.close()
    if failed:
        sys.exit(1)


def _report(dec: SpeculativeDecoder, name: str, load_s: float, max_tokens: int,
            temperature: float) -> None:
    """The lines of one loaded pair: a timed greedy generation with and without drafts,
    whether the target is batch-invariant here, and the draft's agreement."""
    tokens = dec.target.prompt(CHECK_PROMPTS[0])
    greedy = SamplingParams(temperature=0.0)
    drafters = ("model",) if dec.draft is not None else ("lookup",)
    dec.generate(tokens, max_tokens=2, sampling=greedy, draft_max=0)  # page the weights in
    alone = dec.generate(tokens, max_tokens=max_tokens, sampling=greedy, draft_max=0)
    spec = dec.generate(tokens, max_tokens=max_tokens, sampling=greedy, draft_max=4,
                        drafters=drafters)
    same = "identical" if spec.tokens == alone.tokens else "DIFFERENT"
    base = alone.stats.tokens_per_s
    ratio = spec.stats.tokens_per_s / base if base else 0.0
    click.echo(
        f"{name}: ok: {_vocabularies(dec)}; loaded in {load_s:.1f} s; greedy output {same} "
        f"to the target alone; acceptance {spec.stats.acceptance_rate:.0%} at k=4, "
        f"{spec.stats.tokens_per_step:.2f} tokens/step; {spec.stats.tokens_per_s:.1f} tok/s "
        f"vs {alone.stats.tokens_per_s:.1f} alone ({ratio:.2f}x)"
    )
    synthetic = dec.target.meta(SYNTHETIC_KEY)
    if synthetic:  # part of this pair's report: what its figures mean
        click.echo(f"  note: synthetic model, {synthetic}")
    click.echo("  " + batch_invariance(dec, tokens, BATCH_CHECK_TOKENS).describe())
    if dec.draft is not None:
        prompts = [dec.target.prompt(p) for p in CHECK_PROMPTS]
        hot = SamplingParams(temperature=temperature)
        seen = measure(dec, prompts, AGREEMENT_TOKENS, hot)
        click.echo(
            f"  agreement over {seen.positions} positions of the target's text: the "
            f"draft may propose {seen.mass_inside:.0%} of its probability mass; its top "
            f"token is the target's {seen.greedy:.0%} of the time (greedy acceptance); "
            f"a draft is accepted {seen.alpha:.0%} of the time at T = {temperature:g}"
        )

