"""The stderr console and its spinner: shared by the command line and by loading a pair,
which also runs in the engine process (so it cannot live in cli/)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console


def stderr_console(*, plain: bool = False) -> Console:
    """Progress, stats and warnings. plain (--plain): no escape codes at all, not even
    dim or italic (which NO_COLOR keeps) or a spinner's cursor codes."""
    if plain:
        return Console(file=sys.stderr, highlight=False, soft_wrap=True, color_system=None,
                       force_terminal=False)
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def spinner(console: Console, message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on a terminal (nothing otherwise); yields a function that changes
    its message."""
    if console.is_terminal:
        with console.status(message, spinner="dots") as status:
            yield status.update
    else:
        yield lambda _message: None
