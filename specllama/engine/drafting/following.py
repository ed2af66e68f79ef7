"""Earlier documents the text follows: replies of one shape (the same keys, the same
phrases around different values) draft their fixed parts from each other.

A lookup that copied from an earlier document starts following it (`follow`); each
round the text is walked along each followed document (`refollow`): in step while the
document has the same tokens, back in step where a token of the text ends a match with
the document a little further on (after a value of its own). Where two or more
followed documents agree on what comes next, those tokens are known (`agreed`): a draft
model in progress takes them free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .base import Origin
from .suffixcache import SuffixArchive

#: Earlier documents followed at once: those whose continuation agreed with a chain
#: drafted from them, the most recent ones.
FOLLOW = 4
#: How far ahead of where the text stands a followed document is searched, and how far
#: back a match with it is measured.
WINDOW, MATCH_BACK = 48, 16

Archives = Sequence[tuple[SuffixArchive, Origin | None]]


@dataclass(frozen=True)
class Trail:
    """Where the text stands in a document it follows: `pos`, the position there of the
    token expected next, after `run` tokens in step with it (0: out of step, the text
    is at a value of its own)."""

    pos: int
    run: int


def walk(archive: SuffixArchive, trail: Trail, text: Sequence[int], start: int) -> Trail:
    """The trail after text[start:]: in step while the document has the same tokens;
    out of step, each token is looked for ahead (within WINDOW), where it ends the
    longest match with the text (the earliest of equal ones), which puts it back in step:
    after a value of its own, `",` finds the end of the document's value, not an earlier
    key's."""
    new = text[start:]
    if not new:
        return trail
    seg, p = archive.around(trail.pos, MATCH_BACK, WINDOW + len(new))
    base, run = trail.pos - p, trail.run
    for j, t in enumerate(new):
        if run and p < len(seg) and seg[p] == t:
            p, run = p + 1, run + 1
            continue
        at, best, e = start + j, 0, p
        while t in seg[e:]:
            e = seg.index(t, e) + 1
            n = 1
            while n < MATCH_BACK and n < e and n <= at and seg[e - 1 - n] == text[at - n]:
                n += 1
            if n > best:
                best, p = n, e
        run = best
    return Trail(base + p, run)


@dataclass(frozen=True)
class Followed:
    """A followed document where the text is in step with it (`walk`): the position
    of the token it has next, and how many tokens before it agree."""

    archive: int
    doc: int
    pos: int
    length: int


class Following:
    """The documents of `archives` the text follows, the most recently followed last."""

    def __init__(self, archives: Archives) -> None:
        self.archives = archives
        self._trails: dict[tuple[int, int], Trail] = {}  # (archive, document) -> trail
        self._walked = 0  # the trails are where the text stood at this length

    def __len__(self) -> int:
        return len(self._trails)

    def follow(self, i: int, doc: int, trail: Trail) -> None:
        """Follow that document from there (the latest followed)."""
        self._trails.pop((i, doc), None)
        self._trails[(i, doc)] = trail
        if len(self._trails) > FOLLOW:
            del self._trails[next(iter(self._trails))]

    def refollow(self, tokens: Sequence[int]) -> list[Followed]:
        """Walk each followed document along the tokens committed since the last round;
        those in step with the text, most recent first."""
        L = len(tokens)
        if L < self._walked:  # another text: follow nothing from before
            self._trails.clear()
        out: list[Followed] = []
        for key, trail in reversed(self._trails.items()):
            trail = self._trails[key] = walk(self.archives[key[0]][0], trail, tokens,
                                             min(self._walked, L))
            if trail.run:
                out.append(Followed(*key, trail.pos, trail.run))
        self._walked = L
        return out

    def agreed(self, tokens: Sequence[int], k: int) -> tuple[list[int], Origin]:
        """Up to k tokens that every followed document in step with `tokens`, two at
        least, has next, and where they were seen. Changes no state, so it may run on
        tokens not committed (a draft in progress)."""
        if len(self._trails) < 2 or k <= 0:
            return [], "context"
        pool, where = [], []
        for (i, _), trail in self._trails.items():
            archive = self.archives[i][0]
            ahead = walk(archive, trail, tokens, self._walked)
            if ahead.run:
                pool.append(archive.continuation(ahead.pos, k))
                where.append((i, ahead.pos))
        if len(pool) < 2:
            return [], "context"
        n = 0
        while n < min(map(len, pool)) and all(c[n] == pool[0][n] for c in pool):
            n += 1
        if n == 0:
            return [], "context"
        return pool[0][:n], self.origin(*where[0])

    def origin(self, i: int, pos: int) -> Origin:
        """Where the text at `pos` of archive i was seen."""
        archive, origin = self.archives[i]
        return origin or archive.origin_at(pos)
