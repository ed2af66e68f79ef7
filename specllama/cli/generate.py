"""`specllama generate`: one prompt, the text to stdout, the stats to stderr."""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
from pathlib import Path

import click
from rich.console import Console

from ..console import spinner, stderr_console
from ..engine.constraint import ConstraintSpec
from ..engine.decoder import GenerationResult, GenerationStream, SpeculativeDecoder
from ..engine.loop.events import Finished
from ..errors import ConstraintError, InvalidParameterError
from ..loading import RunOptions, RunSettings, open_decoder
from ..policy.compare import Comparison, compare_with_target, needs_measuring
from ..policy.cpumeter import CpuMeter
from .liveview import LiveDrafts
from .options import model_options, run_options, sampling_options, view_options
from .trace import TraceRecorder, token_piece, trace_kind
from .ui import TokenPrinter, stats_table

EXIT_INTERRUPTED = 130


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


def read_prediction(path: str) -> str:
    """--predict FILE's text, read before any model loads; a one-line error if it cannot be."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameterError(f"--predict {path} is not UTF-8 text (byte {exc.start})"
                                    ) from None
    except OSError as exc:
        raise InvalidParameterError(f"cannot read --predict {path}: "
                                    f"{exc.strerror or exc}") from None


def prompt_tokens(decoder: SpeculativeDecoder, text: str, chat: bool | None,
                  system: str | None) -> list[int]:
    """The prompt as the target should see it: in its chat template unless --raw."""
    if chat and decoder.target.chat_template() is None:
        stderr_console().print(
            "[yellow]warning:[/yellow] the target has no chat template; sending the prompt raw"
        )
    return decoder.target.prompt(text, chat=chat is not False, system=system)


@click.command()
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
@click.option("--verbose", "-v", is_flag=True,
              help="Add to the stats why the draft length was what it was.")
@view_options
@click.option("--trace", metavar="FILE", help="Write what each round did: FILE.html (a page "
              "to open or share) or FILE.json (the per-round records).")
@click.option("--predict", metavar="FILE", help="Text the output is expected to resemble "
              "(the file being edited): drafted first wherever the output is in step with "
              "it, as OpenAI's Predicted Outputs. The output stays the target's own.")
@run_options
def generate(run: RunOptions, prompt: str | None, stop: tuple[str, ...], chat: bool | None,
             system: str | None, plain: bool, as_json: bool, verbose: bool, show_drafts: bool,
             pace: int, trace: str | None, predict: str | None) -> None:
    """Generate text from PROMPT (or stdin) with speculative decoding."""
    err = stderr_console(plain=plain)
    if trace:
        check_trace_path(trace)
    prediction = read_prediction(predict) if predict is not None else None
    text = read_prompt(prompt)
    decoder, settings = open_decoder(run, err)
    try:
        # A seed drawn here is recorded (--json, the stats), so any run can be repeated.
        seed = secrets.randbits(31) if settings.seed is None else settings.seed
        settings = dataclasses.replace(settings, stop=stop, seed=seed)
        tokens = prompt_tokens(decoder, text, chat, system)
        # A draft of another family reads the conversation in its own chat template.
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        own = decoder.draft_prompt_for(messages) if chat is not False else None
        _generate(decoder, settings, tokens, err, plain=plain, as_json=as_json, why=verbose,
                  live=bool(show_drafts or pace), pace=pace, trace=trace, draft_prompt=own,
                  prediction=prediction)
    finally:
        decoder.close()


def _generate(decoder: SpeculativeDecoder, settings: RunSettings, tokens: list[int],
              err: Console, *, plain: bool, as_json: bool, why: bool, live: bool, pace: int,
              trace: str | None, draft_prompt: list[int] | None = None,
              prediction: str | None = None) -> None:
    constraint = settings.constraint
    # Constrained output going to a file or a pipe is written whole or not at all: a
    # program reading it never gets half a JSON document.
    hold = constraint is not None and not sys.stdout.isatty()
    printer = None if as_json or hold else \
        _text_printer(decoder, plain=plain, live=live, pace=pace)
    recorder = TraceRecorder(token_piece(decoder), settings.as_dict()) if trace else None
    stream = decoder.stream(
        tokens,
        max_tokens=settings.max_tokens,
        sampling=settings.sampling,
        draft_max=settings.draft_max,
        drafters=settings.drafters,
        stop=settings.stop,
        constraint=constraint,
        draft_prompt=draft_prompt,
        prediction=prediction,
    )
    meter = CpuMeter()  # how much of the CPU others took: the figures' reliability
    meter.start()
    interrupted = _play(stream, printer, recorder)
    busy = meter.stop()
    result = stream.result
    if result is None:  # interrupted while the prompt was read: nothing to report
        click.echo("specllama: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if printer is not None:  # end the text's line before anything goes to the terminal
        _end_line(printer)
    if constraint is not None and not result.constraint_met and not interrupted:
        _unmet(constraint, result, decoder.n_ctx, err)
    if hold and not as_json:
        click.echo(result.text)
    comparison = _compare(decoder, result, err)
    if as_json:
        click.echo(_json_report(result, comparison, busy, settings))
    else:
        err.print(stats_table(result.stats, title=f"finish: {result.finish_reason}",
                              comparison=comparison, busy=busy, why=why))
    if recorder is not None and trace:
        recorder.finish(result)
        kind = recorder.save(trace)
        err.print(f"trace ({kind}) written to {trace}", style="dim", markup=False)
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)


def _unmet(constraint: ConstraintSpec, result: GenerationResult, n_ctx: int,
           err: Console) -> None:
    """The output stopped before the constraint was complete: an error where the context
    window was too small for it, a warning where --max-tokens or a stop string cut it."""
    what = constraint.describe()
    if result.finish_reason == "context":
        raise ConstraintError(
            f"the context window ({n_ctx} tokens) filled before the output completed the "
            f"{what} ({len(result.tokens)} tokens generated); raise --n-ctx or shorten the prompt")
    err.print(f"warning: the output is not complete by the {what}: "
              f"{'--max-tokens' if result.finish_reason == 'length' else 'a stop string'} "
              "cut it", style="yellow", markup=False)


def _text_printer(decoder: SpeculativeDecoder, *, plain: bool, live: bool,
                  pace: int) -> TokenPrinter | LiveDrafts:
    """Colours unless --plain or not a terminal; the drafts drawn live when asked and shown."""
    text_out = TokenPrinter(color=False if plain else None)
    if text_out.color and live:
        return LiveDrafts(text_out.out, token_piece(decoder), pace_ms=pace)
    return text_out


def _play(stream: GenerationStream, printer: TokenPrinter | LiveDrafts | None,
          recorder: TraceRecorder | None) -> bool:
    """Each event to the trace and the screen; True when Ctrl-C cut the run short."""
    try:
        for event in stream:
            if recorder is not None:
                recorder.feed(event)
            if printer is not None:
                printer.show(event)
            if isinstance(event, Finished):
                break
    except KeyboardInterrupt:
        return True
    finally:
        stream.close()
        if printer is not None:
            printer.close()
    return False


def _end_line(printer: TokenPrinter | LiveDrafts) -> None:
    if printer.printed and not printer.printed.endswith("\n"):
        printer.out.write("\n")
    printer.out.flush()


def _compare(decoder: SpeculativeDecoder, result: GenerationResult,
             err: Console) -> Comparison:
    """The run against the target alone; its step cost is measured once, under a spinner."""
    if result.stats.drafted and needs_measuring(decoder):
        with spinner(err, "measuring the target's step cost, to compare with (kept for next "
                     "time)"):
            return compare_with_target(decoder, result.stats)
    return compare_with_target(decoder, result.stats)


def _json_report(result: GenerationResult, comparison: Comparison, busy: float | None,
                 settings: RunSettings) -> str:
    return json.dumps(
        {
            "text": result.text,
            "tokens": result.tokens,
            "prompt_tokens": result.prompt_tokens,
            "finish_reason": result.finish_reason,
            "stats": result.stats.to_dict(),
            "vs_target_alone": dataclasses.asdict(comparison),
            "busy": busy,
            "settings": settings.as_dict(),
        },
        ensure_ascii=False,
    )


def check_trace_path(path: str) -> None:
    """Before loading anything: a name the trace can be written as, in a folder that exists."""
    trace_kind(path)
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise InvalidParameterError(f"cannot write the trace {path}: no folder {folder}")


