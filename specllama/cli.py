"""The `specllama` command. Thin: it parses options, renders engine events, and is
the one place where domain errors become one-line messages and exit codes."""

from __future__ import annotations

import json
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from .errors import InvalidParameterError, SpecLlamaError
from .events import Finished
from .liveview import LiveDrafts
from .options import model_options, open_decoder, pass_options, sampling_options, view_options
from .trace import TraceRecorder, trace_kind
from .ui import TokenPrinter, stats_table, stderr_console

EXIT_INTERRUPTED = 130


class SpecGroup(click.Group):
    """Every error leaves as one line on stderr, never as a traceback (unless --debug)."""

    def main(self, args=None, prog_name=None, **extra: Any):  # type: ignore[override]
        extra.pop("standalone_mode", None)
        debug = "--debug" in (sys.argv[1:] if args is None else list(args))
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            click.echo("specllama: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as exc:
            if debug:
                traceback.print_exc()
            click.echo(f"specllama: error: {exc.format_message()}", err=True)
            sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except SpecLlamaError as exc:
            if debug:
                traceback.print_exc()
            click.echo(f"specllama: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=SpecGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="specllama")
def cli(debug: bool) -> None:
    """Exact speculative decoding for GGUF models on your CPU."""


def read_prompt(prompt: str | None) -> str:
    if prompt is not None and prompt != "-":
        text = prompt
    else:
        stdin = sys.stdin.buffer
        if prompt is None and stdin.isatty():
            raise InvalidParameterError("no prompt: give one as an argument or pipe it on stdin")
        try:
            text = stdin.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidParameterError(
                f"stdin is not valid UTF-8 text (byte {exc.start}); convert it first, "
                "e.g. iconv -t UTF-8"
            ) from exc
    if not text.strip():
        raise InvalidParameterError("the prompt is empty")
    return text


def prompt_tokens(decoder, text: str, chat: bool | None, system: str | None) -> list[int]:
    """The prompt as the target should see it: in its chat template unless --raw."""
    target = decoder.target
    template = target.chat_template()
    if chat is False or (chat is None and template is None):
        return decoder.tokenize(text)
    if template is None:
        stderr_console().print(
            "[yellow]warning:[/yellow] the target has no chat template; sending the prompt raw"
        )
        return decoder.tokenize(text)
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    return target.tokenize_chat(target.format_chat(messages))


@cli.command()
@click.argument("prompt", required=False)
@model_options
@sampling_options
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable).")
@click.option(
    "--chat/--raw",
    default=None,
    help="Wrap the prompt in the model's chat template (default when it has one) or send it raw.",
)
@click.option("--system", help="System message for --chat.")
@click.option("--plain", is_flag=True, help="No colours.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@view_options
@click.option("--trace", metavar="FILE", help="Write what each round did: FILE.html (a page "
              "to open or share) or FILE.json (the per-round records).")
@pass_options
def generate(opts: dict[str, Any]) -> None:
    """Generate text from PROMPT (or stdin) with speculative decoding."""
    err = stderr_console()
    if opts["trace"]:
        check_trace_path(opts["trace"])
    text = read_prompt(opts["prompt"])
    decoder, settings = open_decoder(opts, err)
    settings.stop = tuple(opts["stop"])
    tokens = prompt_tokens(decoder, text, opts["chat"], opts["system"])
    printer = None if opts["as_json"] else TokenPrinter(color=False if opts["plain"] else None)
    if printer is not None and printer.color and (opts["show_drafts"] or opts["pace"]):
        printer = LiveDrafts(printer.out, decoder.target.piece, pace_ms=opts["pace"])
    recorder = TraceRecorder(decoder.target.piece, settings.as_dict()) if opts["trace"] else None
    stream = decoder.stream(
        tokens,
        max_tokens=settings.max_tokens,
        sampling=settings.sampling,
        draft_max=settings.draft_max,
        draft_mode=settings.draft_mode,
        stop=settings.stop,
    )
    interrupted = False
    try:
        for event in stream:
            if recorder is not None:
                recorder.feed(event)
            if printer is not None:
                printer.show(event)
            if isinstance(event, Finished):
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stream.close()
        if printer is not None:
            printer.close()
    result = decoder.last_result
    if opts["as_json"]:
        click.echo(
            json.dumps(
                {
                    "text": result.text,
                    "tokens": result.tokens,
                    "prompt_tokens": result.prompt_tokens,
                    "finish_reason": result.finish_reason,
                    "stats": result.stats.to_dict(),
                    "settings": settings.as_dict(),
                },
                ensure_ascii=False,
            )
        )
    else:
        if printer.printed and not printer.printed.endswith("\n"):
            printer.out.write("\n")
        printer.out.flush()
        err.print(stats_table(result.stats, title=f"finish: {result.finish_reason}"))
    if recorder is not None:
        recorder.finish(result)
        kind = recorder.save(opts["trace"])
        err.print(f"trace ({kind}) written to {opts['trace']}", style="dim", markup=False)
    decoder.close()
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)


def check_trace_path(path: str) -> None:
    """Before loading anything: a name the trace can be written as, in a folder that exists."""
    trace_kind(path)
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise InvalidParameterError(f"cannot write the trace {path}: no folder {folder}")


@cli.group()
def pairs() -> None:
    """List and inspect the model pairs in models.toml."""


@pairs.command("list")
@click.option("--config", "config_path", metavar="FILE", help="models.toml to use.")
def pairs_list(config_path: str | None) -> None:
    """Every pair, its models, and whether they are on this machine."""
    from rich.console import Console
    from rich.table import Table

    from .config import find_and_load_config
    from .sources import source_status

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
    from .config import find_and_load_config
    from .sources import source_status

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
    import time

    from .config import find_and_load_config
    from .sampling import SamplingParams
    from .sources import pending_downloads, resolve_pair
    from .speculative import SpeculativeDecoder

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
        tokens = (dec.target.tokenize_chat(dec.target.format_chat(
            [{"role": "user", "content": prompt}]))
            if dec.target.chat_template() else dec.tokenize(prompt))
        greedy = SamplingParams(temperature=0.0)
        mode = "model" if dec.draft is not None else "lookup"
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


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM takes the same clean path as Ctrl-C: caches consistent, no partial files.
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    cli()

from .chat import chat_command  # noqa: E402

cli.add_command(chat_command)

from .bench import bench_command  # noqa: E402

cli.add_command(bench_command)
