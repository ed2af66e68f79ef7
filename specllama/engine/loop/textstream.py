"""Incremental detokenization with stop strings.

Tokens arrive one at a time; the text released for printing never splits a
multi-byte character and never shows a prefix of a stop string that may still
complete.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stops: Sequence[str] = ()) -> None:
        self._piece = piece
        self._stops = [s for s in stops if s]
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text that might be the start of a stop string
        self.text = ""  # everything released so far
        self.stopped = False

    def feed(self, tokens: Sequence[int]) -> str:
        """Add tokens; return the newly releasable text."""
        if self.stopped:
            return ""
        new = self._utf8.decode(b"".join(self._piece(t) for t in tokens))
        return self._release(self._held + new)

    def flush(self) -> str:
        """End of generation: release what was held back."""
        if self.stopped:
            return ""
        rest = self._held + self._utf8.decode(b"", final=True)
        self._held = ""
        self.text += rest
        return rest

    def _release(self, candidate: str) -> str:
        if not self._stops:
            self._held = ""
            self.text += candidate
            return candidate
        cut = min((i for i in (candidate.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            out = candidate[:cut]
            self.text += out
            return out
        hold = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(candidate)), hold, -1):
                if candidate.endswith(stop[:n]):
                    hold = n
                    break
        out = candidate[: len(candidate) - hold]
        self._held = candidate[len(candidate) - hold :]
        self.text += out
        return out


class TokenTexts:
    """Each token's own share of the text, for views that show tokens one by one: a
    character split across tokens shows with the token that completes it."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, tokens: Sequence[int]) -> list[str]:
        """Texts of tokens that are now part of the output."""
        return [self._utf8.decode(self._piece(t)) for t in tokens]

    def peek(self, tokens: Sequence[int]) -> list[str]:
        """Texts of tokens that may follow (drafts), leaving the output as it was."""
        state = self._utf8.getstate()
        out = self.take(tokens)
        self._utf8.setstate(state)
        return out

    def reset(self) -> None:
        self._utf8.reset()
