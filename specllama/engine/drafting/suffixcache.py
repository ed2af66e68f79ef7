"""Token text seen before this call, indexed for lookup drafts: earlier outputs of this
process (chat turns, server requests), a persisted cache of them, a user's corpus.

`SuffixArchive` holds documents of token ids end to end, a separator (-1) between two,
and per n-gram order a sorted array of (hash of the n-gram, position after it), in a
few segments of doubling size (a new document is one small segment; two of like size
are merged), so adding a document costs a sort of its own size, amortised, and a
lookup is one binary search per segment, after a table of flags has said whether any
segment holds the n-gram at all (most rounds of new text end there). Only two orders
are kept: `LONG` finds real copying at once; `SHORT` gives the latest occurrences of
the last tokens, whose match lengths are then measured backwards (vectorised), so any
length in between is known without a table per length. 16 bytes a token per order, 4
for the token itself.

A lookup returns candidates (the position after each occurrence, and how many tokens
before it agree with the context); `engine.lookup` pools them with the context's own
and drafts their likeliest common continuation. Exactness does not depend on any of
this: a lookup draft is a deterministic function of the committed tokens (q one-hot).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: Where a lookup draft's text was seen: this call's context, earlier calls of this
#: process, the persisted cache of earlier processes, the user's corpus.
Origin = Literal["context", "session", "persisted", "corpus"]
ORIGINS: tuple[Origin, ...] = ("context", "session", "persisted", "corpus")

#: The two orders indexed: the shortest match worth a lookup (as in the context's own
#: index), and one that finds real copying among many short matches at once.
SHORT, LONG = 3, 10
#: Occurrences read per segment and order, and in all: the latest ones (recent text
#: predicts best; each is measured in Python).
PER_SEGMENT = 16
HITS = 32
#: Match lengths are measured up to this many tokens.
MATCH_MAX = 64

#: Segment sizes grow this much from one to the next (fewer segments, fewer binary
#: searches a lookup; a token is sorted again about MERGE / 2 times per level).
MERGE = 8
_SEEN_MASK = (1 << 22) - 1  # 4 MiB of flags per order
_MUL = np.uint64(0x100000001B3)  # the FNV-1 prime: a multiplier that mixes 64 bits
_MASK = (1 << 64) - 1


def key_of(gram: Sequence[int]) -> int:
    """The hash `ngram_keys` gives the same n-gram (Python ints, wrapped to 64 bits)."""
    h = 0
    for t in gram:
        h = (h * 0x100000001B3 + t) & _MASK
    return h


def ngram_keys(tokens: np.ndarray, n: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, positions) of every n-gram of `tokens` that is followed by a token:
    position c (plus `offset`) is the one after the n-gram tokens[c-n:c]. N-grams that
    span a separator, or are followed by one, are left out."""
    count = len(tokens) - n
    if count <= 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    t = tokens.astype(np.uint64)  # -1 wraps, but such windows are dropped below
    h = np.zeros(count, np.uint64)
    for j in range(n):
        h = h * _MUL + t[j : j + count]
    bad = np.concatenate(([0], np.cumsum(tokens < 0)))
    # a window [s, s + n] (the follower included) holds no separator
    ok = bad[n + 1 : n + 1 + count] - bad[:count] == 0
    return h[ok], np.arange(n, n + count, dtype=np.int64)[ok] + offset


@dataclass(frozen=True)
class Segment:
    keys: np.ndarray  # sorted
    pos: np.ndarray  # ascending within equal keys, so the latest occurrences come last

    @classmethod
    def build(cls, keys: np.ndarray, pos: np.ndarray) -> Segment:
        order = np.lexsort((pos, keys))
        return cls(keys[order], pos[order])

    def __len__(self) -> int:
        return len(self.keys)


class SuffixArchive:
    """Documents of token ids, each of one origin, indexed for lookups; at most
    `max_tokens` of them, the least recently used documents evicted first."""

    def __init__(self, max_tokens: int | None = None) -> None:
        self.max_tokens = max_tokens
        self._reset()

    def _reset(self) -> None:
        self._tokens = np.full(1024, -1, np.int32)
        self.size = 0  # tokens in use, separators included
        self.starts: list[int] = []  # where each document begins
        self.origins: list[Origin] = []
        self.used: list[float] = []  # when a document last gave a draft (or was added)
        self.segments: dict[int, list[Segment]] = {SHORT: [], LONG: []}
        # Per order, whether any n-gram hashed to each slot: most lookups of text never
        # seen end here.
        self._seen = {n: np.zeros(_SEEN_MASK + 1, np.bool_) for n in self.segments}

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens[: self.size]

    @property
    def n_documents(self) -> int:
        return len(self.starts)

    @property
    def n_tokens(self) -> int:
        """Tokens held, separators not counted."""
        return self.size - len(self.starts)

    def add(self, doc: Sequence[int] | np.ndarray, origin: Origin,
            used: float | None = None) -> None:
        """Append a document (ids >= 0) and index it."""
        self.add_many([(doc, origin, used)])

    def add_many(self, docs: Sequence[tuple[Sequence[int] | np.ndarray, Origin, float | None]]
                 ) -> None:
        """Append documents (tokens, origin, last use or None: now) and index them as one
        segment: a loaded cache or a corpus costs one sort, not one merge per document."""
        start = self.size
        for doc, origin, used in docs:
            tokens = np.asarray(doc, dtype=np.int32)
            if len(tokens) == 0:
                continue
            end = self.size + len(tokens) + 1
            if end > len(self._tokens):
                grown = np.full(max(end, 2 * len(self._tokens)), -1, np.int32)
                grown[: self.size] = self._tokens[: self.size]
                self._tokens = grown
            self._tokens[self.size : end - 1] = tokens
            self._tokens[end - 1] = -1
            self.starts.append(self.size)
            self.origins.append(origin)
            self.used.append(time.time() if used is None else used)
            self.size = end
        if self.size > start:
            self._index(start, self.size)
        if self.max_tokens is not None and self.n_tokens > self.max_tokens:
            self._evict()

    def _index(self, start: int, end: int) -> None:
        window = self._tokens[start:end]
        for n, segments in self.segments.items():
            keys, pos = ngram_keys(window, n, start)
            if len(keys) == 0:
                continue
            self._seen[n][keys & np.uint64(_SEEN_MASK)] = True
            segments.append(Segment.build(keys, pos))
            # Merge while the newest is at least 1/MERGE of the one before it: the sizes
            # then grow MERGE-fold, log_MERGE(n) segments, each searched every lookup.
            while len(segments) > 1 and MERGE * len(segments[-1]) >= len(segments[-2]):
                b, a = segments.pop(), segments.pop()
                segments.append(Segment.build(np.concatenate((a.keys, b.keys)),
                                              np.concatenate((a.pos, b.pos))))

    def _evict(self) -> None:
        """Keep what `recent` keeps, and index it again."""
        assert self.max_tokens is not None
        docs = self.documents()
        self._reset()
        self.add_many(recent(docs, self.max_tokens))

    def documents(self) -> list[Document]:
        """Each document's tokens, origin and last use, oldest first."""
        ends = [*self.starts[1:], self.size]
        return [(self._tokens[s : e - 1].copy(), o, u)
                for s, e, o, u in zip(self.starts, ends, self.origins, self.used)]

    def candidates(self, tail: Sequence[int]) -> list[tuple[int, int]]:
        """(position, length) of each place the last tokens of `tail` occurred before:
        the position after the occurrence, and how many tokens agree there (at least
        SHORT); the latest PER_SEGMENT per segment, newest first, of the LONG order where
        it matches, else of the SHORT one. This runs every round: plain Python where
        numpy's per-call cost would dominate."""
        for n in (LONG, SHORT):
            if len(tail) < n:
                continue
            key = key_of(tail[-n:])
            if not self._seen[n][key & _SEEN_MASK]:
                continue  # no segment holds it: no binary search at all
            key64 = np.uint64(key)
            hits: list[int] = []
            for segment in reversed(self.segments[n]):  # the newest text first
                keys = segment.keys
                lo = int(keys.searchsorted(key64))
                if lo < len(keys) and keys[lo] == key64:
                    hi = int(keys.searchsorted(key64, "right"))
                    hits += segment.pos[max(lo, hi - PER_SEGMENT) : hi][::-1].tolist()
                    if len(hits) >= HITS:
                        break
            if hits:
                return self._measured(hits, tail)
        return []

    def _measured(self, hits: list[int], tail: Sequence[int]) -> list[tuple[int, int]]:
        """The hits with their match lengths (< SHORT: a hash collision, dropped)."""
        depth = min(MATCH_MAX, len(tail))
        want = list(tail[-depth:])
        out = []
        for p in hits:
            before = self._tokens[max(0, p - depth) : p].tolist()
            if len(before) == depth and before == want:
                out.append((p, depth))  # copying: all agree (one comparison, in C)
                continue
            n = 0
            for a, b in zip(reversed(before), reversed(want)):
                if a != b:
                    break
                n += 1
            if n >= SHORT:
                out.append((p, n))
        return out

    def around(self, pos: int, back: int, ahead: int) -> tuple[list[int], int]:
        """Up to `back` tokens before `pos` and `ahead` from it, within its document, and
        where `pos` falls in that list."""
        lo = max(0, pos - back)
        out = self._tokens[lo : min(pos + ahead, self.size)].tolist()
        cut = pos - lo
        if -1 in out[cut:]:
            out = out[: out.index(-1, cut)]
        if -1 in out[:cut]:
            start = cut - out[:cut][::-1].index(-1)
            out, cut = out[start:], cut - start
        return out, cut

    def continuation(self, pos: int, k: int) -> list[int]:
        """Up to k tokens from `pos`, to the end of its document."""
        out = self._tokens[pos : min(pos + k, self.size)].tolist()
        return out[: out.index(-1)] if -1 in out else out

    def document_at(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos) - 1

    def origin_at(self, pos: int) -> Origin:
        return self.origins[self.document_at(pos)]

    def touch(self, pos: int) -> None:
        """The document at `pos` gave a draft: it is the last to be evicted."""
        self.used[self.document_at(pos)] = time.time()


Document = tuple[np.ndarray, Origin, float]


def recent(docs: Sequence[Document], max_tokens: int) -> list[Document]:
    """The most recently used documents that fit in 3/4 of `max_tokens` (so the rebuild,
    linear in what is kept, comes rarely), in their order."""
    budget = max_tokens * 3 // 4
    keep: list[int] = []
    for i in sorted(range(len(docs)), key=lambda i: -docs[i][2]):
        if len(docs[i][0]) <= budget:
            budget -= len(docs[i][0])
            keep.append(i)
    return [docs[i] for i in sorted(keep)]
