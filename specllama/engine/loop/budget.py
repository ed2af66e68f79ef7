"""A reasoning budget: after `tokens` tokens of reasoning, the close marker is forced.

A thinking model writes its reasoning between an open and a close marker (the server
reads them off the chat template: server/reasoning.py). With a budget, once the
reasoning has run `tokens` tokens without closing, the target's row allows only the
close marker's next token until the close is written, as llama-server's reasoning
budget ends thinking; the answer follows as the model writes it.

Why speculation stays exact: whether a position is forced, and to which token, depends
only on the text before it. So row i of a verify pass is forced for committed + d_1..
d_{i-1}, the very prefix that row follows whenever its token is used, as the penalties
and the constraint's masks are (docs/architecture.md, "Repetition penalties"); a draft
of anything else meets p = 0 and is rejected. The law is the target's with the close
forced at the budget, drafted or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningBudget:
    """`close`: the close marker's tokens; `tokens`: the reasoning tokens allowed before
    it is forced (0: the close at once); `open`: the open marker's tokens, or () when
    the output starts inside the reasoning (the template wrote the open marker)."""

    close: tuple[int, ...]
    tokens: int
    open: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.close or self.tokens < 0:
            raise ValueError("a reasoning budget needs a close marker and tokens >= 0")

    def forced(self, output: Sequence[int]) -> int | None:
        """The token forced next after `output` (the generated tokens), or None: the
        reasoning has not begun, has closed, or is within its budget."""
        start = 0 if not self.open else _end_of(self.open, output, 0)
        if start is None:
            return None
        if _end_of(self.close, output, start) is not None:
            return None  # closed, by the model or by the budget
        past = len(output) - start - self.tokens
        if past < 0:
            return None
        # Forcing has written close[:past] after the budget (a close the model began on
        # its own before it does not count: the forced one follows it whole).
        if past >= len(self.close) or \
                tuple(output[start + self.tokens:]) != self.close[:past]:
            return None  # (the close would have been found: not reached)
        return self.close[past]


    def closed(self, output: Sequence[int]) -> bool:
        """Whether the reasoning has closed in `output` (nothing is forced from then on)."""
        start = 0 if not self.open else _end_of(self.open, output, 0)
        return start is not None and _end_of(self.close, output, start) is not None


def _end_of(marker: tuple[int, ...], output: Sequence[int], start: int) -> int | None:
    """The index just past the first `marker` in output[start:], or None (the search
    for its first token runs in C: a row's check costs little however long the text)."""
    n, first, tokens = len(marker), marker[0], list(output)
    i = start
    while True:
        try:
            i = tokens.index(first, i, len(tokens) - n + 1)
        except ValueError:
            return None
        if tuple(tokens[i:i + n]) == marker:
            return i + n
        i += 1
