"""Incremental detokenization with stop strings.

Tokens arrive one at a time; the text released for printing never splits a
multi-byte character and never shows a prefix of a stop string that may still
complete.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .linestops import Deadline, DeadlineWatch, Indent, IndentWatch


@dataclass(frozen=True)
class Repeat:
    """A stop rule: the text ends where a block (`opening` … `closing`) begins that
    repeats, character for character, one already written (a tool call made twice in one
    turn). Like a stop string, it cuts the output and leaves the law before the cut."""

    opening: str
    closing: str


#: What ends the text: a stop string, a repeated block, or an editor's rule (linestops.py).
Stop = str | Repeat | Indent | Deadline


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stops: Sequence[Stop] = ()) -> None:
        self._piece = piece
        self._stops = [s for s in stops if isinstance(s, str) and s]
        self._repeat = next((s for s in stops if isinstance(s, Repeat)), None)
        self._indent = next((IndentWatch(s) for s in stops if isinstance(s, Indent)), None)
        self._deadline = next((DeadlineWatch(s) for s in stops if isinstance(s, Deadline)),
                              None)
        # Nothing to look for: text goes out as it comes (the usual case, on every round).
        self._plain = not self._stops and not any((self._repeat, self._indent, self._deadline))
        self._blocks: set[str] = set()  # the blocks written so far
        self._scan = 0  # where in the text the next block may open
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text that might be the start of a stop string
        self.text = ""  # everything released so far
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text
        self.ended_by: Stop | None = None  # whichever stop ended it

    def begin(self) -> None:
        """The generation begins (its prompt is in the caches): a deadline counts from now."""
        if self._deadline is not None:
            self._deadline.begin()

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
        if self._indent is not None and (cut := self._indent.cut(rest)) >= 0:
            rest, self.stopped, self.ended_by = rest[:cut], True, self._indent.rule
        self.text += rest
        return rest

    def _release(self, candidate: str) -> str:
        if self._plain:
            self.text += candidate
            return candidate
        found: list[tuple[int, Stop]] = [
            (i, s) for s in self._stops if (i := candidate.find(s)) >= 0]
        repeat, keep = self._repeated(candidate)
        if repeat >= 0 and self._repeat is not None:
            found.append((repeat, self._repeat))
        found += self._rules(candidate)
        if found:
            cut, self.ended_by = min(found, key=lambda f: f[0])
            self.matched = self.ended_by if isinstance(self.ended_by, str) else None
            self.stopped = True
            self._held = ""
            out = candidate[:cut]
            self.text += out
            return out
        hold = len(candidate) - keep
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(candidate)), hold, -1):
                if candidate.endswith(stop[:n]):
                    hold = n
                    break
        out = candidate[: len(candidate) - hold]
        self._held = candidate[len(candidate) - hold :]
        self.text += out
        if self._indent is not None:
            self._indent.advance(out)
        return out

    def _rules(self, candidate: str) -> list[tuple[int, Stop]]:
        """Where the editors' rules end `candidate` (linestops.py), if they do."""
        found: list[tuple[int, Stop]] = []
        for watch in (self._indent, self._deadline):
            if watch is not None and (cut := watch.cut(candidate)) >= 0:
                found.append((cut, watch.rule))
        return found

    def _repeated(self, candidate: str) -> tuple[int, int]:
        """Where in `candidate` a block repeating an earlier one begins (-1: none), and
        how much of it may go out now: not a block still open once one has been written
        (it may turn out a repeat), nor what may be a block's opening."""
        rule = self._repeat
        if rule is None:
            return -1, len(candidate)
        base, text = len(self.text), self.text + candidate
        while (i := text.find(rule.opening, self._scan)) >= 0:
            j = text.find(rule.closing, i + len(rule.opening))
            if j < 0:
                return -1, max(0, i - base) if self._blocks else len(candidate)
            block = text[i:j + len(rule.closing)]
            if block in self._blocks:
                return max(0, i - base), len(candidate)
            self._blocks.add(block)
            self._scan = j + len(rule.closing)
        if self._blocks:
            for n in range(min(len(rule.opening) - 1, len(candidate)), 0, -1):
                if candidate.endswith(rule.opening[:n]):
                    return -1, len(candidate) - n
        return -1, len(candidate)


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
