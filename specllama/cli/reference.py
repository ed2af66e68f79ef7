"""The command-line reference (docs/cli.md), rendered from click's own --help of every
command, so the page cannot drift from the flags: a test compares the two.

    python -m specllama.cli.reference > docs/cli.md
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

from .app import cli

#: Help is wrapped at this width whatever the terminal says, so the page is reproducible.
WIDTH = 80
REGENERATE = "python -m specllama.cli.reference > docs/cli.md"

HEADER = f"""\
# Command-line reference

Every command's `--help`, generated from the code by

    {REGENERATE}

A test fails when a flag changes and this page was not regenerated. What the settings do:
[usage.md](usage.md).
"""


def _contexts(command: click.Command, ctx: click.Context) -> Iterator[click.Context]:
    """The context of `command` and of each of its subcommands, depth first, by name."""
    yield ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _contexts(sub, click.Context(sub, info_name=name, parent=ctx))


def render(root: click.Command = cli, name: str = "specllama") -> str:
    """The reference page as Markdown: one section per command, its help verbatim."""
    top = click.Context(root, info_name=name, terminal_width=WIDTH, max_content_width=WIDTH)
    parts = [HEADER]
    for ctx in _contexts(root, top):
        parts.append(f"## `{ctx.command_path}`\n\n```text\n{ctx.command.get_help(ctx)}\n```\n")
    return "\n".join(parts)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
