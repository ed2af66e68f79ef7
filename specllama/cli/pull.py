"""`specllama pull`: a pair's Hugging Face models, or one ``hf://`` file, fetched into the
Hugging Face cache ahead of time, so that the first run neither waits for gigabytes nor
needs the network.

Stdout gets one line per model, where it is on this machine; stderr gets what is being
downloaded, and huggingface_hub's own progress bar. A download cut short (Ctrl-C, a
dropped connection) leaves no file a later run would take for complete: huggingface_hub
writes into a temporary ``.incomplete`` file and moves it into the cache only whole.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..console import stderr_console
from ..models.config import Pair, find_and_load_config
from ..models.hf import hf_cache_dir, hf_lookup, resolve_hf
from ..models.packages import package_file
from ..models.schema import ModelSource
from ..models.sourceforms import SourceReader
from ..models.sources import resolve_source
from ..models.status import locations

#: An argument that is written like a URL is a source, anything else a pair's name.
_URL_MARKS = ("://", "hf:")


def _parts_note(source: ModelSource) -> str:
    """' (N parts)' for a split GGUF: the path printed is the first part's."""
    needed = hf_lookup(source, hf_cache_dir()).needed or []
    return f" ({len(needed)} parts)" if len(needed) > 1 else ""


def _check_local(pair: Pair) -> None:
    """A pair's files and packages that pull cannot fetch are there, or this raises the
    error the first run would: told before a long download rather than after it."""
    for role, source in (("target", pair.target), ("draft", pair.draft)):
        if source.kind == "path":
            resolve_source(source, pair=pair, role=role)
        elif source.kind == "package":
            assert source.package is not None and source.file is not None
            package_file(source.package, source.file, what=f"{role} model of pair {pair.name!r}")


def _pull_pair(pair: Pair) -> None:
    _check_local(pair)
    err = stderr_console()
    for index, (role, source) in enumerate((("target", pair.target), ("draft", pair.draft))):
        label = f"{pair.name} {role}"
        if source.kind == "lookup":
            click.echo(f"{label}: no model (prompt lookup)")
            continue
        if source.kind != "hf":
            # Derived drafts, synthetic targets, assembled packages: made here, not fetched.
            click.echo(f"{label}: nothing to download: {locations(pair)[index]}")
            continue
        if hf_lookup(source, hf_cache_dir()).complete:
            done = "already in the cache"
        else:
            # advise_pull=False: an offline error must not tell to run this very command.
            resolve_source(source, pair=pair, role=role, advise_pull=False,
                           progress=lambda m: err.print(m, style="dim", markup=False))
            done = "downloaded"
        click.echo(f"{label}: {done}: {locations(pair)[index]}{_parts_note(source)}")


def _pull_source(text: str) -> None:
    # Read as a --target flag is (the same forms, the same one-line errors), never a path.
    source = SourceReader(Path.cwd(), "").source(text, ("pull",), role="target")
    err = stderr_console()
    cached = hf_lookup(source, hf_cache_dir())
    path = resolve_hf(source, what=source.describe(), hint="",
                      progress=lambda m: err.print(m, style="dim", markup=False))
    done = "already in the cache" if cached.complete else "downloaded"
    click.echo(f"{source.describe()}: {done}: {path}{_parts_note(source)}")


@click.command()
@click.argument("names", nargs=-1, required=True, metavar="NAME|hf://OWNER/REPO/FILE...")
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pull(names: tuple[str, ...], config_path: str | None) -> None:
    """Fetch models into the Hugging Face cache ahead of time.

    Downloads the Hugging Face models of each pair NAME (target and draft), or each
    hf://OWNER/REPO/FILE (a glob takes the first match; a split GGUF, all its parts), and
    prints where each model is. What is cached is not fetched again. Derived drafts and
    synthetic targets need no download: they are made on first use."""
    config = None
    for name in names:
        if any(mark in name for mark in _URL_MARKS):
            _pull_source(name)
            continue
        config = config or find_and_load_config(config_path)
        _pull_pair(config.pair(name))
