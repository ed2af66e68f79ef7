"""Ctrl-C around the work it must not cut in half."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any


@contextmanager
def whole_messages(on_interrupt: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C waits until the message being read is whole (half of one would leave the
    pipe out of step), then raises; the engine is told at once."""
    hit: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        hit.append(signum)
        on_interrupt()

    with _sigint(handler):
        yield
    if hit:
        raise KeyboardInterrupt


def sigint_ignored() -> AbstractContextManager[None]:
    """Ignore Ctrl-C while the caches are being put back in order."""
    return _sigint(signal.SIG_IGN)


@contextmanager
def _sigint(handler: Any) -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
