"""Lookup drafts: copied from text seen before, with no draft model.

The context's own n-gram index (`NgramIndex`) and any `SuffixArchive`s (earlier calls, a
persisted cache, a corpus) are searched for the last tokens. How much to trust a match
grows with its length: a match of n tokens drafts at most n - n_min + 1 tokens (one
after the shortest match; a match at n_max is measured further back). On a CPU, where
verifying k+1 tokens costs several single steps, this keeps spurious short matches
(common words) cheap and lets real copying run long. The occurrences that match are
pooled and the draft is their likeliest common continuation, each token with its share
of the pool (`Continuation.probs`), which the policy's `extend` may cut at.

Exactness: a lookup draft is a deterministic function of the committed tokens, so its
proposal distribution q puts all mass on the proposed token (q None); the acceptance
rule then accepts d with probability p(d) and resamples a rejection from p with d
removed, which is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .base import Ask, Draft, DraftStep, Origin, Start
from .following import Archives, Followed, Following, Trail
from .ngram import NGRAM_MAX, NGRAM_MIN, NgramIndex
from .suffixcache import MATCH_MAX

#: Occurrences pooled at most (the context's latest first, then the archives'): their
#: continuations' counts give each drafted token its probability.
POOL = 16


@dataclass(frozen=True)
class Continuation:
    """A lookup continuation: each token with the share of the pooled occurrences that
    agree with it, given the tokens before it (the cache's own probability), and
    where the text it was copied from was seen."""

    tokens: list[int]
    probs: list[float]
    origin: Origin


def likeliest_continuation(continuations: Sequence[Sequence[int]], k: int) -> tuple[
        list[int], list[float], int]:
    """The likeliest continuation of k tokens at most: at each step the token most of
    the continuations still agreeing have next (a tie goes to the earliest given), its
    probability that count over them; and the first continuation agreeing to the end."""
    if len(continuations) == 1 or all(c == continuations[0] for c in continuations[1:]):
        first = list(continuations[0][:k]) if continuations else []
        return first, [1.0] * len(first), 0  # one text copied: the usual case, at once
    alive = list(range(len(continuations)))
    tokens: list[int] = []
    probs: list[float] = []
    for j in range(k):
        counts: dict[int, int] = {}
        for i in alive:
            seq = continuations[i]
            if j < len(seq):
                counts[seq[j]] = counts.get(seq[j], 0) + 1
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)
        tokens.append(token)
        probs.append(counts[token] / len(alive))
        alive = [i for i in alive if j < len(continuations[i]) and continuations[i][j] == token]
    return tokens, probs, (alive[0] if alive else 0)


class Fed(Protocol):
    """A drafter this lookup feeds (a draft model in hybrid drafting)."""

    drafting: bool


@dataclass(frozen=True)
class _Found:
    """One search, for a text of `length` tokens: the longest match over all sources,
    each archive's positions matching at least min(that, n_max), the followed hits."""

    length: int
    best: int
    archived: list[tuple[int, list[int]]]
    followed: list[Followed]


class LookupDrafter:
    """Drafts the likeliest continuation of the last tokens' earlier occurrences."""

    name = "lookup"
    decode_s = 0.0
    behind = 0

    def __init__(
        self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX, *, cap_by_match: bool = True,
        archives: Archives = (),
    ) -> None:
        """archives: each with the origin its drafts are counted under (None: each
        document's own, as the archive recorded it)."""
        self.index = NgramIndex(n_min, n_max)
        self.cap_by_match = cap_by_match
        self.archives = tuple(archives)
        self.following = Following(self.archives)
        #: The draft model this lookup feeds, if any: while the text follows earlier
        #: documents and that model drafts, the turn is its (their agreed parts are
        #: spliced into its draft, `agreed`), not the lookup's.
        self.feeds: Fed | None = None
        self._found: _Found | None = None

    # ------------------------------------------------------------ the drafter
    def begin(self, start: Start) -> None:
        self.index.sync(start.prompt)

    def draft(self, ask: Ask) -> Draft:
        if not self.has_match(ask.context):
            return Draft()
        if self.feeds is not None and self.feeds.drafting and self.follows():
            return Draft()
        chain = self.continuation(ask.context, ask.choose("lookup", self.match_length()))
        return lookup_draft(chain, ask)

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        self.index.sync(committed)

    def end(self, committed: Sequence[int]) -> None:
        pass  # nothing in flight; the next call's index syncs to its own text

    # ------------------------------------------------------------ the search
    def _search(self, committed: Sequence[int]) -> _Found:
        """The search for `committed`, cached for its length."""
        self.index.sync(committed)
        L = len(self.index)
        if self._found is not None and self._found.length == L:
            return self._found
        own = self.index.match()
        best = own[1] if own is not None else 0
        hits: list[tuple[int, list[tuple[int, int]]]] = []
        followed: list[Followed] = []
        if self.archives:
            tail = self.index.tokens[-MATCH_MAX:]
            for i, (archive, _) in enumerate(self.archives):
                found = archive.candidates(tail)
                if found:
                    best = max(best, max(n for _, n in found))
                    hits.append((i, found))
            followed = self.following.refollow(self.index.tokens)
            if best >= self.index.n_max:
                followed = []  # copying: the match says more than following
        pooled = min(best, self.index.n_max)
        archived = [(i, [p for p, n in found if n >= pooled]) for i, found in hits]
        self._found = _Found(L, best, archived, followed)
        return self._found

    def has_match(self, committed: Sequence[int]) -> bool:
        found = self._search(committed)
        return found.best > 0 or bool(found.followed)

    def follows(self) -> bool:
        """Whether the current lookup follows earlier documents (after has_match)."""
        return self._found is not None and bool(self._found.followed)

    def match_length(self) -> int:
        """How many tokens the current match spans (0 without one; after has_match); a
        followed document's longest where one is followed."""
        if self._found is None:
            return 0
        followed = self._found.followed
        return max(f.length for f in followed) if followed else self._found.best

    def continuation(self, committed: Sequence[int], k: int) -> Continuation | None:
        """The lookup continuation of `committed` (at most k tokens; None without a match)."""
        found = self._search(committed)
        if k <= 0:
            return None
        if found.followed:
            return self._follow(found.followed, k)
        if found.best == 0:
            return None
        if self.cap_by_match:
            k = min(k, found.best - self.index.n_min + 1)
        ix = self.index
        pool: list[list[int]] = [ix.continuation(c, k) for c in
                                 ix.occurrences(min(found.best, ix.n_max), POOL)]
        where: list[tuple[int, int]] = [(-1, 0)] * len(pool)
        for i, positions in found.archived:
            for p in positions[: POOL - len(pool)]:
                pool.append(self.archives[i][0].continuation(p, k))
                where.append((i, p))
        tokens, probs, first = likeliest_continuation(pool, k)
        if not tokens:
            return None
        for (i, p), cont in zip(where, pool):
            if i >= 0 and cont[:1] == tokens[:1]:
                self.following.follow(i, self.archives[i][0].document_at(p),
                                      Trail(p, found.best))
        i, p = where[first]
        if i < 0:
            return Continuation(tokens, probs, "context")
        self.archives[i][0].touch(p)
        return Continuation(tokens, probs, self.following.origin(i, p))

    def _follow(self, followed: list[Followed], k: int) -> Continuation | None:
        """The likeliest common continuation of the followed documents from where the
        text stands in each: a reply of one shape drafts its fixed parts from earlier
        replies, each token with its share of agreeing documents (the values differ)."""
        pool = [self.archives[f.archive][0].continuation(f.pos, k) for f in followed]
        tokens, probs, first = likeliest_continuation(pool, k)
        if not tokens:
            return None
        f = followed[first]
        self.archives[f.archive][0].touch(f.pos)
        return Continuation(tokens, probs, self.following.origin(f.archive, f.pos))

    # ------------------------------------------------------------ feeding a model
    def splices(self) -> bool:
        """Whether `agreed` may give anything: two documents followed at least."""
        return len(self.following) >= 2

    def agreed(self, tokens: Sequence[int], k: int) -> tuple[list[int], Origin]:
        """Up to k tokens that every followed document in step with `tokens` has next
        (two at least), and where they were seen: the fixed parts of a reply of one
        shape, which a draft model in progress need not draft."""
        return self.following.agreed(tokens, k)

    def peek(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier occurrence of the end of
        `context` (the committed text and a draft in progress), in this call's context
        or the archives; changes no state."""
        if k <= 0:
            return []
        best, out = 0, []
        own = self.index.find(context)
        if own is not None:
            best, out = own[1], self.index.continuation(own[0], k)
        tail = list(context[-MATCH_MAX:])
        for archive, _ in self.archives:
            for p, n in archive.candidates(tail):
                if n > best:
                    best, out = n, archive.continuation(p, k)
        if self.cap_by_match and best:
            k = min(k, best - self.index.n_min + 1)
        return out[:k]


def lookup_draft(chain: Continuation | None, ask: Ask) -> Draft:
    """A lookup chain, cut where the policy's `extend` says its next token is not worth
    verifying at its probability, or where a constraint stops allowing it: a token it
    forbids has p = 0, so verifying it would be a step spent for nothing."""
    if chain is None:
        return Draft()
    n = len(chain.tokens)
    for j, prob in enumerate(chain.probs):
        step: DraftStep = ask.lengths.extend(j, prob)
        if step != "more":
            n = j if step == "stop" else j + 1
            break
    tokens = chain.tokens[:n]
    c = ask.constraint
    if c is not None:
        tokens = tokens[: c.fits(tokens)]
        c.advance(tokens)
    if not tokens:
        return Draft()
    draft = Draft(source="lookup", confidences=chain.probs[: len(tokens)])
    draft.add(tokens, [None] * len(tokens), chain.origin)
    return draft
