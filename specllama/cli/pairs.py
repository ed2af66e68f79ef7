"""`specllama pairs`: the pairs in models.toml, and a check that one works."""

from __future__ import annotations

import sys
import time

import click
from rich.console import Console
from rich.table import Table

from ..engine.decoder import SpeculativeDecoder
from ..engine.drafts import DraftMode
from ..engine.sampling import SamplingParams
from ..errors import SpecLlamaError
from ..models.config import find_and_load_config
from ..models.sources import pending_downloads, resolve_pair, source_status
from .ui import stderr_console


@click.group()
def pairs() -> None:
    """List and inspect the model pairs in models.toml."""


@pairs.command("list")
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pairs_list(config_path: str | None) -> None:
    """Every pair, its models, and whether they are on this machine."""
    config = find_and_load_config(config_path)
    table = Table(title=f"pairs in {config.path}", title_justify="left")
    for col in ("name", "target", "draft", "status"):
        table.add_column(col)
    for name, pair in config.pairs.items():
        mark = " (default)" if name == config.default else ""
        table.add_row(
            name + mark,
            pair.target.describe(),
            pair.draft.describe(),
            source_status(pair),
        )
    Console(soft_wrap=False).print(table)


@pairs.command("show")
@click.argument("name")
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pairs_show(name: str, config_path: str | None) -> None:
    """One pair in full: sources, where they resolve, and its defaults."""
    config = find_and_load_config(config_path)
    pair = config.pair(name)
    click.echo(f"pair:        {pair.name}{' (default)' if name == config.default else ''}")
    if pair.description:
        click.echo(f"description: {pair.description}")
    click.echo(f"target:      {pair.target.describe()}")
    click.echo(f"draft:       {pair.draft.describe()}")
    click.echo(f"status:      {source_status(pair)}")
    click.echo(f"defined in:  {config.path}")
    defaults = pair.defaults.as_dict()
    if defaults:
        click.echo("defaults:    " + ", ".join(f"{k}={v}" for k, v in defaults.items()))


@pairs.command("check")
@click.argument("names", nargs=-1)
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
@click.option("--max-tokens", default=48, show_default=True, help="Tokens per test generation.")
@click.option("--threads", type=int, help="CPU threads (default: all cores).")
def pairs_check(names: tuple[str, ...], config_path: str | None, max_tokens: int,
                threads: int | None) -> None:
    """Load each pair (or NAMES), check the vocabularies match, and time a short
    generation with and without the draft: the command to run when something seems off."""
    err = stderr_console()
    config = find_and_load_config(config_path)
    failed = 0
    for name in names or tuple(config.names):
        pair = config.pair(name)
        pending = pending_downloads(pair)
        if pending and not names:
            # Checking everything must not start gigabytes of downloads unasked.
            click.echo(f"{name}: skipped: needs a download ({'; '.join(pending)}); "
                       f"run `specllama pairs check {name}` to fetch and check it")
            continue
        try:
            t0 = time.perf_counter()
            target, draft = resolve_pair(pair, n_threads=threads,
                                         progress=lambda m: err.print(f"[dim]{m}[/dim]"))
            dec = SpeculativeDecoder.load(target, draft if draft else "lookup",
                                          n_ctx=1024, n_threads=threads)
            load_s = time.perf_counter() - t0
        except SpecLlamaError as exc:
            failed += 1
            click.echo(f"{name}: FAILED: {exc}")
            continue
        prompt = "Explain in a few sentences why the sky is blue."
        tokens = dec.target.prompt(prompt)
        greedy = SamplingParams(temperature=0.0)
        mode: DraftMode = "model" if dec.draft is not None else "lookup"
        alone = dec.generate(tokens, max_tokens=max_tokens, sampling=greedy, draft_max=0)
        spec = dec.generate(tokens, max_tokens=max_tokens, sampling=greedy, draft_max=4,
                            draft_mode=mode)
        same = "identical" if spec.tokens == alone.tokens else "DIFFERENT"
        base = alone.stats.tokens_per_s
        ratio = spec.stats.tokens_per_s / base if base else 0.0
        click.echo(
            f"{name}: ok: vocabularies match; loaded in {load_s:.1f} s; greedy output {same} "
            f"to the target alone; acceptance {spec.stats.acceptance_rate:.0%} at k=4, "
            f"{spec.stats.tokens_per_step:.2f} tokens/step; {spec.stats.tokens_per_s:.1f} tok/s "
            f"vs {alone.stats.tokens_per_s:.1f} alone ({ratio:.2f}x)"
        )
        dec.close()
    if failed:
        sys.exit(1)


