"""The `specllama` command: the group, and the one place where domain errors
become one-line messages and exit codes."""

from __future__ import annotations

import signal
import sys
import traceback
from typing import Any

import click

from ..errors import SpecLlamaError
from .bench_command import bench_command
from .chat import chat_command
from .generate import EXIT_INTERRUPTED, generate
from .pairs import pairs
from .pull import pull
from .rpcserver import rpc_server
from .serve import serve


class SpecGroup(click.Group):
    """Every error leaves as one line on stderr, never as a traceback (unless --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (SpecLlamaError, click.ClickException):
            if ctx.params.get("debug"):
                traceback.print_exc()
            raise

    def main(self, *args: Any, **extra: Any) -> Any:
        extra["standalone_mode"] = False  # errors come here, to be told in one line
        try:
            rv = super().main(*args, **extra)
        except click.exceptions.Abort:
            click.echo("specllama: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as exc:
            click.echo(f"specllama: error: {exc.format_message()}", err=True)
            sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except SpecLlamaError as exc:
            click.echo(f"specllama: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=SpecGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="specllama")
def cli(debug: bool) -> None:
    """Exact speculative decoding for GGUF models on your CPU."""


for command in (generate, pairs, pull, chat_command, bench_command, serve, rpc_server):
    cli.add_command(command)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM takes the same clean path as Ctrl-C: caches consistent, no partial files.
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    cli()
