"""`specllama chat`."""

from __future__ import annotations

import sys

import click

from ... import SpeculativeDecoder
from ...console import stderr_console
from ...loading import RunOptions, open_decoder, target_is_remote
from ..options import model_options, run_options, sampling_options, view_options
from .remote import RemoteDecoder
from .repl import ChatREPL
from .session import ChatSession


@click.command("chat")
@model_options
@sampling_options
@click.option("--system", metavar="TEXT", help="System prompt for the conversation.")
@click.option("--plain", is_flag=True, help="No colours.")
@view_options
@run_options
def chat_command(run: RunOptions, system: str | None, plain: bool, show_drafts: bool,
                 pace: int) -> None:
    """Chat with the model pair: replies stream as they are verified.

    On a terminal: line editing, history, slash commands (/help). Piped: every
    line of stdin is one message (or a slash command); the replies go to stdout.
    """
    err = stderr_console(plain=plain)
    # A remote target can vanish (RPC server lost): the models then live in an engine
    # process, so that the conversation outlives it.
    decoder: SpeculativeDecoder | RemoteDecoder
    if target_is_remote(run):
        decoder = RemoteDecoder(run)
        settings = decoder.settings
    else:
        decoder, settings = open_decoder(run, err)
    try:
        session = ChatSession(decoder, settings, system=system)
        interactive = sys.stdin.isatty()
        color = False if plain else None  # None: on a terminal, unless NO_COLOR
        code = ChatREPL(session, err=err, color=color, interactive=interactive,
                        show_drafts=show_drafts, pace_ms=pace).run()
    finally:
        decoder.close()
    if code:
        sys.exit(code)
