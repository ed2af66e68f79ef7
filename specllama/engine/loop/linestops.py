"""The stops code editors ask llama-server for (its `process_token`): `Indent` (the
request's n_indent) and `Deadline` (t_max_predict_ms). Like stop strings they cut the
text and nothing else: what the target draws, the drafts and their verdicts are the
same with them as without, so speculation stays exact (loop/textstream.py applies them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# What llama-server counts as indentation: one column each.
_BLANKS = " \t"


@dataclass(frozen=True)
class Indent:
    """The text ends where a line after its first begins less indented than `columns`:
    before that line's first character other than a space or tab (so its indentation
    stays, as llama-server leaves it). A blank line counts as indented 0, as there."""

    columns: int


@dataclass(frozen=True)
class Deadline:
    """Once `ms` milliseconds have passed since the generation began (its prompt in the
    caches), the text ends after the next newline that arrives."""

    ms: int


class IndentWatch:
    """Where arriving text breaks an `Indent` rule. The first line is never judged: the
    completion goes on the line the cursor is on."""

    def __init__(self, rule: Indent) -> None:
        self.rule = rule
        # The indentation so far of a line not yet judged; None while none is.
        self._col: int | None = None

    def cut(self, text: str) -> int:
        """Where in `text` (which follows what `advance` has seen) the text ends; -1:
        nowhere yet."""
        return self._scan(text)[0]

    def advance(self, text: str) -> None:
        """`text` went out: later text continues it."""
        self._col = self._scan(text)[1]

    def _scan(self, text: str) -> tuple[int, int | None]:
        col = self._col
        for i, ch in enumerate(text):
            if col is not None:
                if ch in _BLANKS:
                    col += 1
                    continue
                if col < self.rule.columns:
                    return i, col
                col = None
            if ch == "\n":
                col = 0
        return -1, col


class DeadlineWatch:
    """Where arriving text ends under a `Deadline` rule."""

    def __init__(self, rule: Deadline) -> None:
        self.rule = rule
        self.start = time.perf_counter()

    def begin(self) -> None:
        """The generation begins now (llama-server's clock starts after the prompt)."""
        self.start = time.perf_counter()

    def cut(self, text: str) -> int:
        """Just after the first newline of `text` once the time is up; -1 otherwise."""
        if (time.perf_counter() - self.start) * 1000 <= self.rule.ms:
            return -1
        i = text.find("\n")
        return -1 if i < 0 else i + 1
