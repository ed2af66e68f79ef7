"""The context's own n-gram index: where the last few tokens occurred before.

When the output repeats the input (rewriting code, quoting a document, answering from
retrieved text), the best guess for what follows the last few tokens is what followed
them the last time they appeared. `NgramIndex` keeps, for every n in [n_min, n_max], a
dict from each n-gram of the text to the position right after its latest occurrence;
looking up the last n tokens (longest n first) is then a handful of dict probes, and each
committed token adds n_max - n_min + 1 entries: the index never rescans the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import InvalidParameterError
from .suffixcache import MATCH_MAX

#: Default n-gram lengths searched, longest first. Matches of one or two tokens
#: are mostly common words and punctuation, whose continuation is a guess that
#: costs a verification; the shortest match that drafts is 3 tokens long.
NGRAM_MIN = 3
NGRAM_MAX = 8
# A match found at n_max is measured further back, up to MATCH_MAX tokens.


class NgramIndex:
    """Latest-occurrence n-gram index over a growing token sequence.

    `tables[n - n_min]` maps an n-gram (by the hash of its tuple of ids, which
    keeps the tables small) to the position c of the token that followed its
    latest occurrence, i.e. `tokens[c - n:c]` is that n-gram and `tokens[c]`
    exists. A lookup checks the tokens at c, so a hash collision can cost a
    match but never produce a wrong one (and would not affect exactness anyway).
    The n-gram at the very end of the sequence has no follower yet, so it is
    registered only when the next token arrives: a lookup of the current suffix
    therefore finds an *earlier* occurrence.
    """

    def __init__(
        self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX, match_max: int = MATCH_MAX
    ) -> None:
        if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
            raise InvalidParameterError(
                f"lookup n-gram lengths must satisfy 1 <= n_min <= n_max, got {n_min}, {n_max}"
            )
        self.n_min, self.n_max = n_min, n_max
        self.match_max = max(n_max, match_max)
        self._match: tuple[int, tuple[int, int] | None] | None = None  # (len, match()) cache
        self.tokens: list[int] = []
        self.tables: list[dict[int, int]] = [{} for _ in range(n_min, n_max + 1)]
        # Per order, follower c -> the follower of the previous occurrence of its n-gram.
        self.prev: list[dict[int, int]] = [{} for _ in range(n_min, n_max + 1)]
        self.insertions = 0  # n-gram entries written, ever (tests check the index is incremental)
        self.rebuilds = 0  # times the sequence changed under the index and it started over

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self) -> None:
        self.tokens = []
        self._match = None
        for table in (*self.tables, *self.prev):
            table.clear()

    def extend(self, new: Sequence[int]) -> None:
        """Append tokens; only the n-grams they complete are indexed."""
        if not new:
            return
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        self._index(start, len(self.tokens))

    def _index(self, start: int, end: int) -> None:
        """Register every n-gram whose follower position c lies in [start, end); the
        occurrence it replaces as the latest is chained behind it (`occurrences`)."""
        toks = self.tokens
        for n, table, prev in zip(range(self.n_min, self.n_max + 1), self.tables, self.prev):
            first = max(start, n)  # followers c >= n: the n-gram tokens[c-n:c] fits
            if first >= end:
                continue
            if end - first <= 16:  # a round's few new tokens: the plainest loop is fastest
                for c in range(first, end):
                    key = hash(tuple(toks[c - n : c]))
                    before = table.get(key)
                    if before is not None:
                        prev[c] = before
                    table[key] = c
                self.insertions += end - first
                continue
            # A prompt: zip of n shifted slices = the n-grams starting at c - n, in order
            keys = map(hash, zip(*(toks[first - n + j : end - n + j] for j in range(n))))
            for c, key in zip(range(first, end), keys):
                before = table.get(key)
                if before is not None:
                    prev[c] = before
                table[key] = c
            self.insertions += end - first

    def sync(self, committed: Sequence[int]) -> None:
        """Make the index cover exactly `committed`.

        The round loop only ever appends to its committed list, so the common
        case checks a short tail and indexes the new tokens. If the sequence
        changed under the index (a reused strategy, a shorter list), the index
        starts over from `committed`; that is O(len) once, never per round.
        """
        L = len(self.tokens)
        if len(committed) >= L:
            tail = max(0, L - 8)
            if list(committed[tail:L]) == self.tokens[tail:]:
                self.extend(committed[L:])
                return
        self.rebuilds += 1
        self.clear()
        self.extend(committed)

    def match(self) -> tuple[int, int] | None:
        """(c, n): c the position after the latest earlier occurrence of the
        longest matching suffix of n_min..n_max tokens, n how many tokens before
        c and before the end agree (measured up to match_max when the n_max-gram
        matched); None when no suffix of n_min tokens occurred before."""
        L = len(self.tokens)
        if self._match is None or self._match[0] != L:
            self._match = (L, self.find(self.tokens))
        return self._match[1]

    def find(self, tail: Sequence[int]) -> tuple[int, int] | None:
        """`match` for any text ending in `tail`: the indexed text holds no more of it
        than it holds itself (a draft in progress continues the committed text)."""
        toks = self.tokens
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            suffix = list(tail[len(tail) - n :])
            c = self.tables[n - self.n_min].get(hash(tuple(suffix)))
            if c is not None and toks[c - n : c] == suffix:
                if n == self.n_max:
                    limit = min(self.match_max, c, len(tail))
                    while n < limit and toks[c - n - 1] == tail[len(tail) - n - 1]:
                        n += 1
                return c, n
        return None

    def occurrences(self, n: int, limit: int) -> list[int]:
        """The followers of the latest (at most `limit`) earlier occurrences of the last
        n tokens, latest first."""
        toks = self.tokens
        L = len(toks)
        if not self.n_min <= n <= min(self.n_max, L):
            return []
        suffix, prev = toks[L - n :], self.prev[n - self.n_min]
        c = self.tables[n - self.n_min].get(hash(tuple(suffix)))
        out: list[int] = []
        while c is not None and len(out) < limit:
            if toks[c - n : c] == suffix:  # a hash collision is skipped
                out.append(c)
            c = prev.get(c)
        return out

    def continuation(self, c: int, k: int) -> list[int]:
        """k tokens from follower c: where they run into the end of the text, the
        period L - c repeats (what the matched text predicts)."""
        toks = self.tokens
        L = len(toks)
        out = toks[c : min(c + k, L)]
        period = L - c
        while len(out) < k:  # only when c + k > L: out holds one period, repeat it
            out.append(out[len(out) - period])
        return out
