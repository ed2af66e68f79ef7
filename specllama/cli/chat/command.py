"""`specllama chat`."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..options import model_options, open_decoder, pass_options, sampling_options, view_options
from ..ui import stderr_console
from .repl import ChatREPL
from .session import ChatSession


@click.command("chat")
@model_options
@sampling_options
@click.option("--system", metavar="TEXT", help="System prompt for the conversation.")
@click.option("--plain", is_flag=True, help="No colours.")
@view_options
@pass_options
def chat_command(opts: dict[str, Any]) -> None:
    """Chat with the model pair: replies stream as they are verified.

    On a terminal: line editing, history, slash commands (/help). Piped: every
    line of stdin is one message (or a slash command); the replies go to stdout.
    """
    err = stderr_console(plain=bool(opts.get("plain")))
    decoder, settings = open_decoder(opts, err)
    try:
        session = ChatSession(decoder, settings, system=opts.get("system"))
        interactive = sys.stdin.isatty()
        color = False if opts.get("plain") else None  # None: on a terminal, unless NO_COLOR
        code = ChatREPL(session, err=err, color=color, interactive=interactive,
                        show_drafts=opts["show_drafts"], pace_ms=opts["pace"]).run()
    finally:
        decoder.close()
    if code:
        sys.exit(code)
