"""The live terminal view of `--show-drafts`: each round's drafts appear as pending
(blue; magenta where they come from the prediction, `generate --predict`), then turn into
accepted (green) text, a struck-through rejected tail (dim red) and the target's own token
(yellow), with a one-line footer of the seed's three figures (big-model steps, tokens per
step, tokens).

Verified text is written once and left to the terminal to wrap, so it scrolls and
copies like plain output. Only the *tail* (this round's cells and the footer) is
redrawn: erasing it moves the cursor back to where the text ended, which needs the
exact rows the tail took. Those come from the same wrapping rules the terminal
applies (cell widths from rich, a wide character that does not fit moves to the next
row, the cursor waits in the last column until the next character).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.cells import get_character_cell_size
from rich.console import Console
from rich.text import Text

from ..engine.loop.events import (
    DraftProposed,
    Event,
    RoundVerified,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from ..engine.loop.textstream import TokenTexts
from .ui import ACCEPTED, PENDING, PREDICTED, TARGET

REJECTED = "dim red strike"
_FOOTER = "dim"
Piece = tuple[str, str | None]  # text and its style


class LiveDrafts:
    """Renders events like `ui.TokenPrinter`, plus the drafts before their verdict.
    Use it on a terminal only; call `close()` at the end (also after Ctrl-C)."""

    def __init__(
        self,
        out: TextIO,
        piece: Callable[[int], bytes],
        *,
        pace_ms: int = 0,
        width: int | None = None,
    ) -> None:
        self.out = out
        self._pace = pace_ms / 1000
        self._width = width
        self._console = Console(file=out, force_terminal=True, highlight=False)
        styles = (ACCEPTED, TARGET, PENDING, PREDICTED, REJECTED, _FOOTER)
        self._codes = {s: self._codes_for(s) for s in styles}
        self._texts = TokenTexts(piece)
        self.printed = ""  # verified text written so far
        self._col = 0  # cursor column where the verified text ends
        self._last_cell: Piece | None = None  # what fills the last column, when _col == width
        self._tail_rows: int | None = None  # rows the tail moved down; None: no tail shown
        self._unwritten: list[Piece] = []  # verified text not yet written (shown in the tail)
        self._target: Piece | None = None
        self.steps = 0
        self.tokens = 0
        self._hidden_cursor = False

    def _codes_for(self, style: str) -> tuple[str, str]:
        with self._console.capture() as captured:
            self._console.print(Text("\0", style=style), end="")
        before, _, after = captured.get().partition("\0")
        return before, after

    @property
    def width(self) -> int:
        return self._width or self._console.width

    # ------------------------------------------------------------------ events
    def show(self, event: Event) -> None:
        if isinstance(event, DraftProposed):
            with _ctrl_c_after():
                self._erase()
                self._write_unwritten()
                origins = event.origins or ("model",) * len(event.tokens)
                self._draw([(t, PREDICTED if o == "prediction" else PENDING) for t, o in
                            zip(self._texts.peek(event.tokens), origins)])
            self._pause()
        elif isinstance(event, TokensAccepted):
            self._unwritten.append((event.text, ACCEPTED))
        elif isinstance(event, TargetToken):
            self._target = (event.text, TARGET)
        elif isinstance(event, TextFlushed):
            with _ctrl_c_after():
                self._erase()
                self._unwritten.append((event.text, None))
                self._write_unwritten()
        elif isinstance(event, RoundVerified):
            with _ctrl_c_after():
                self._verdict(event)
            if event.drafted:
                self._pause()

    def _verdict(self, ev: RoundVerified) -> None:
        shown = min(ev.accepted, ev.emitted)
        self._texts.take(ev.drafted[:shown])
        rejected: list[Piece] = []
        if ev.emitted > shown:  # the round ended with the target's own token
            rejected = [(t, REJECTED) for t in self._texts.peek(ev.drafted[shown:])]
            self._texts.take((ev.token,))
        self.steps += 1
        self.tokens += ev.emitted
        self._erase()
        self._write_unwritten()
        target, self._target = self._target, None
        if target is not None:
            self._unwritten.append(target)  # written for real when this tail goes
        self._draw(rejected + ([target] if target else []))

    def close(self) -> None:
        """Leave only the verified text on screen (the cursor where it ends)."""
        with _ctrl_c_after():
            self._erase()
            self._write_unwritten()
            if self._hidden_cursor:
                self.out.write("\x1b[?25h")
                self._hidden_cursor = False
            self.out.flush()

    # ----------------------------------------------------------------- drawing
    def _pause(self) -> None:
        if self._pace > 0:
            self.out.flush()
            time.sleep(self._pace)

    def _flow(self, text: str, col: int) -> tuple[str, int, int, str]:
        """`text` made safe to print from column `col`: (what to write, rows the cursor
        moves down, the column it ends in (== width: waiting to wrap), the last cell)."""
        width = self.width
        out: list[str] = []
        rows = 0
        last = ""
        for char in text:
            # A tab becomes spaces to the next stop, so every cell is one we counted.
            for ch in " " * (8 - col % 8) if char == "\t" else char:
                if ch == "\n":
                    out.append(ch)
                    rows, col, last = rows + 1, 0, ""
                    continue
                if ch < " " or "\x7f" <= ch < "\xa0":
                    continue  # a control character would move the cursor behind our back
                w = get_character_cell_size(ch)
                if w == 0:
                    out.append(ch)
                    last += ch
                    continue
                if col + w > width:
                    if col < width:  # a wide character that does not fit: pad, as terminals do
                        out.append(" " * (width - col))
                    rows, col = rows + 1, 0
                out.append(ch)
                col += w
                last = ch
        return "".join(out), rows, col, last

    def _styled(self, text: str, style: str | None) -> str:
        if not style or not text:
            return text
        before, after = self._codes[style]
        return before + text + after

    def _write_unwritten(self) -> None:
        for text, style in self._unwritten:
            safe, _, col, last = self._flow(text, self._col)
            if not safe:
                continue
            self.out.write(self._styled(safe, style))
            self.printed += text
            if last:
                self._last_cell = (last, style)
            self._col = col
        self._unwritten = []

    def _draw(self, cells: list[Piece]) -> None:
        """The tail: this round's cells after the verified text, then the footer."""
        if not self._hidden_cursor:
            self.out.write("\x1b[?25l")
            self._hidden_cursor = True
        col, rows = self._col, 0
        parts: list[str] = []
        for text, style in cells:
            safe, down, col, _ = self._flow(text, col)
            parts.append(self._styled(safe, style))
            rows += down
        tps = f"{self.tokens / self.steps:.2f}" if self.steps else "—"
        footer = f"big-model steps {self.steps}  ·  tokens/step {tps}  ·  tokens {self.tokens}"
        footer = footer[: max(self.width - 1, 0)]
        parts.append("\n" + self._styled(footer, _FOOTER))
        self.out.write("".join(parts))
        self.out.flush()
        self._tail_rows = rows + 1

    def _erase(self) -> None:
        """Back to where the verified text ends, and clear everything after it."""
        if self._tail_rows is None:
            return
        up = self._tail_rows
        if self._col < self.width:
            move = "\r" + (f"\x1b[{up}A" if up else "")
            self.out.write(move + (f"\x1b[{self._col}C" if self._col else "") + "\x1b[J")
        else:
            # The text fills its last row and the cursor waits there to wrap; no move
            # can get back into that state, so clear below and rewrite the last cell.
            self.out.write("\r" + (f"\x1b[{up - 1}A" if up > 1 else "") + "\x1b[J")
            text, style = self._last_cell or (" ", None)
            w = sum(get_character_cell_size(c) for c in text)
            right = f"\x1b[{self.width - w}C" if self.width > w else ""
            self.out.write("\x1b[1A" + right + self._styled(text, style))
        self._tail_rows = None


@contextlib.contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (or SIGTERM, which the CLI turns into one) while the screen is redrawn
    takes effect once it is done: a half-drawn tail could not be found to erase."""
    caught: list[int] = []
    try:
        previous = {sig: signal.signal(sig, lambda n, _f: caught.append(n))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals go elsewhere anyway
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    if any(previous[signal.Signals(sig)] is not signal.SIG_IGN for sig in caught):
        raise KeyboardInterrupt
