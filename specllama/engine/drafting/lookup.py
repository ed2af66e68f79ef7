"""Prompt lookup: drafts copied from the context itself, with no draft model.

When the output repeats the input (rewriting code, quoting a document,
answering from retrieved text), the best guess for what follows the last few
tokens is what followed them the last time they appeared. `NgramIndex` keeps,
for every n in [n_min, n_max], a dict from each n-gram of the context to the
position right after its latest occurrence; looking up the last n tokens
(longest n first) is then a handful of dict probes, and each committed token
adds n_max - n_min + 1 entries: the index never rescans the context.

How much to trust a match grows with its length: `LookupDraft` drafts at most
n - n_min + 1 tokens after a match of n tokens (one token after the shortest
match; a match at n_max is extended backwards token by token to measure it).
On a CPU, where verifying k+1 tokens costs several single steps, this keeps
spurious short matches (common words) cheap and lets real copying run long.

Exactness: a lookup draft is a deterministic function of the committed tokens,
so its proposal distribution q puts all mass on the proposed token
(`Draft.qs[i] is None`); the acceptance rule then accepts d with probability
p(d) and resamples a rejection from p with d removed, which is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError
from .constraint import Constraint
from .drafts import ChooseK, Draft, DraftStrategy, Extend, ModelDraft, always_more
from .sampling import SamplingParams
from .suffixcache import MATCH_MAX, Origin, SuffixArchive

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
        toks = self.tokens
        L = len(toks)
        if self._match is not None and self._match[0] == L:
            return self._match[1]
        found = None
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            suffix = toks[L - n :]
            c = self.tables[n - self.n_min].get(hash(tuple(suffix)))
            if c is not None and toks[c - n : c] == suffix:
                if n == self.n_max:
                    limit = min(self.match_max, c)
                    while n < limit and toks[c - n - 1] == toks[L - n - 1]:
                        n += 1
                found = (c, n)
                break
        self._match = (L, found)
        return found

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

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest matching suffix last time.

        The continuation may run into the current suffix itself (a repeating
        pattern of period L - c); it then keeps repeating that period, which is
        what the matched text predicts, so the proposal always has k tokens.
        """
        if k <= 0:
            return []
        found = self.match()
        if found is None:
            return []
        return self.continuation(found[0], k)


#: Occurrences pooled at most (the context's latest first, then the archives'): their
#: continuations' counts give each drafted token its probability.
POOL = 16
#: Earlier documents followed at once: those whose continuation agreed with a chain
#: drafted from them, the most recent ones.
FOLLOW = 4
#: How far ahead of where the text stands a followed document is searched, and how far
#: back a match with it is measured.
WINDOW, MATCH_BACK = 48, 16


@dataclass(frozen=True)
class _Trail:
    """Where the text stands in a document it follows: `pos`, the position there of the
    token expected next, after `run` tokens in step with it (0: out of step, the text
    is at a value of its own)."""

    pos: int
    run: int


def _walk(archive: SuffixArchive, trail: _Trail, text: Sequence[int], start: int) -> _Trail:
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
    return _Trail(base + p, run)


@dataclass(frozen=True)
class _Followed:
    """A followed document where the text is in step with it (`_walk`): the position
    of the token it has next, and how many tokens before it agree."""

    archive: int
    doc: int
    pos: int
    length: int


@dataclass(frozen=True)
class Chain:
    """A lookup continuation: each token with the share of the pooled occurrences that
    agree with it, given the tokens before it (the cache's own probability), and
    where the text it was copied from was seen."""

    tokens: list[int]
    probs: list[float]
    origin: Origin


def likeliest_chain(continuations: Sequence[Sequence[int]], k: int) -> tuple[
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


class LookupDraft:
    """The lookup draft strategy: the context's own n-gram index (`NgramIndex`) and
    any `SuffixArchive`s (earlier calls, a persisted cache, a corpus), q = None.

    The longest match over all of them sets how far to trust the draft (a match of n
    tokens drafts at most n - n_min + 1 with `cap_by_match`); the occurrences that
    match at least that far (up to n_max) are pooled, and the draft is their
    likeliest common continuation, each token with its share of the pool
    (`Chain.probs`), which the policy's `extend` may cut at (as a model draft at its
    confidence).
    """

    source = "lookup"

    def __init__(
        self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX, *, cap_by_match: bool = True,
        archives: Sequence[tuple[SuffixArchive, Origin | None]] = (),
    ) -> None:
        """archives: each with the origin its drafts are counted under (None: each
        document's own, as the archive recorded it)."""
        self.index = NgramIndex(n_min, n_max)
        self.cap_by_match = cap_by_match
        self.archives = tuple(archives)
        self._found: tuple[int, int, list[tuple[int, list[int]]], list[_Followed]] | None = None
        # Documents the text follows: (archive, document) -> where it stands there, the
        # most recently followed last.
        self._following: dict[tuple[int, int], _Trail] = {}
        self._walked = 0  # the trails are where the text stood at this length

    def _search(self, committed: Sequence[int]) -> tuple[
            int, list[tuple[int, list[int]]], list[_Followed]]:
        """(the longest match over all sources, each archive's positions matching at
        least min(that, n_max), the followed documents' hits), cached for the committed
        length."""
        self.index.sync(committed)
        L = len(self.index)
        if self._found is not None and self._found[0] == L:
            return self._found[1], self._found[2], self._found[3]
        own = self.index.match()
        best = own[1] if own is not None else 0
        hits: list[tuple[int, list[tuple[int, int]]]] = []
        followed: list[_Followed] = []
        if self.archives:
            tail = self.index.tokens[-MATCH_MAX:]
            for i, (archive, _) in enumerate(self.archives):
                found = archive.candidates(tail)
                if found:
                    best = max(best, max(n for _, n in found))
                    hits.append((i, found))
            followed = self._refollow(self.index.tokens)
            if best >= self.index.n_max:
                followed = []  # copying: the match says more than following
        pooled = min(best, self.index.n_max)
        archived = [(i, [p for p, n in found if n >= pooled]) for i, found in hits]
        self._found = (L, best, archived, followed)
        return best, archived, followed

    def has_match(self, committed: Sequence[int]) -> bool:
        best, _, followed = self._search(committed)
        return best > 0 or bool(followed)

    def following(self) -> bool:
        """Whether earlier documents are followed (the text stood in step with them)."""
        return len(self._following) >= 2

    def follows(self) -> bool:
        """Whether the current lookup follows earlier documents (after has_match)."""
        return self._found is not None and bool(self._found[3])

    def match_length(self) -> int:
        """How many tokens the current match spans (0 without one; after has_match); a
        followed document's longest where one is followed."""
        if self._found is None:
            return 0
        followed = self._found[3]
        return max(f.length for f in followed) if followed else self._found[1]

    def chain(self, committed: Sequence[int], k: int) -> Chain | None:
        """The lookup continuation of `committed` (at most k tokens; None without a match)."""
        best, archived, followed = self._search(committed)
        if k <= 0:
            return None
        if followed:
            return self._follow_chain(followed, k)
        if best == 0:
            return None
        if self.cap_by_match:
            k = min(k, best - self.index.n_min + 1)
        ix = self.index
        pool: list[list[int]] = [ix.continuation(c, k) for c in
                                 ix.occurrences(min(best, ix.n_max), POOL)]
        where: list[tuple[int, int]] = [(-1, 0)] * len(pool)
        for i, positions in archived:
            for p in positions[: POOL - len(pool)]:
                pool.append(self.archives[i][0].continuation(p, k))
                where.append((i, p))
        tokens, probs, first = likeliest_chain(pool, k)
        if not tokens:
            return None
        for (i, p), cont in zip(where, pool):
            if i >= 0 and cont[:1] == tokens[:1]:
                self._follow(i, self.archives[i][0].document_at(p), _Trail(p, best))
        i, p = where[first]
        if i < 0:
            return Chain(tokens, probs, "context")
        archive, origin = self.archives[i]
        archive.touch(p)
        return Chain(tokens, probs, origin or archive.origin_at(p))

    def _follow(self, i: int, doc: int, trail: _Trail) -> None:
        """Follow that document from there (the latest followed)."""
        self._following.pop((i, doc), None)
        self._following[(i, doc)] = trail
        if len(self._following) > FOLLOW:
            del self._following[next(iter(self._following))]

    def _refollow(self, tokens: list[int]) -> list[_Followed]:
        """Walk each followed document along the tokens committed since the last round;
        those in step with the text, most recent first."""
        L = len(tokens)
        if L < self._walked:  # another text: follow nothing from before
            self._following.clear()
        out: list[_Followed] = []
        for key, trail in reversed(self._following.items()):
            trail = self._following[key] = _walk(self.archives[key[0]][0], trail, tokens,
                                                 min(self._walked, L))
            if trail.run:
                out.append(_Followed(*key, trail.pos, trail.run))
        self._walked = L
        return out

    def agreed(self, tokens: Sequence[int], k: int) -> tuple[list[int], str]:
        """Up to k tokens that every followed document in step with `tokens`, two at
        least, has next, and where they were seen: after a model draft in progress, the
        fixed parts of a reply of one shape, which the draft model then need not draft
        (`ModelDraft.splice`). Changes no state, so it may run on tokens not committed."""
        if len(self._following) < 2 or k <= 0:
            return [], ""
        pool, where = [], []
        for (i, _), trail in self._following.items():
            archive = self.archives[i][0]
            ahead = _walk(archive, trail, tokens, self._walked)
            if ahead.run:
                pool.append(archive.continuation(ahead.pos, k))
                where.append((i, ahead.pos))
        if len(pool) < 2:
            return [], ""
        n = 0
        while n < min(map(len, pool)) and all(c[n] == pool[0][n] for c in pool):
            n += 1
        if n == 0:
            return [], ""
        archive, origin = self.archives[where[0][0]]
        return pool[0][:n], origin or archive.origin_at(where[0][1])

    def _follow_chain(self, followed: list[_Followed], k: int) -> Chain | None:
        """The likeliest common continuation of the followed documents from where the
        text stands in each: a reply of one shape drafts its fixed parts from earlier
        replies, each token with its share of agreeing documents (the values differ)."""
        pool = [self.archives[f.archive][0].continuation(f.pos, k) for f in followed]
        tokens, probs, first = likeliest_chain(pool, k)
        if not tokens:
            return None
        archive, origin = self.archives[followed[first].archive]
        archive.touch(followed[first].pos)
        return Chain(tokens, probs, origin or archive.origin_at(followed[first].pos))

    def propose(
        self,
        committed: list[int],
        choose_k: ChooseK,
        params: SamplingParams,
        rng: np.random.Generator,
        extend: Extend = always_more,
        constraint: Constraint | None = None,
    ) -> Draft:
        if not self.has_match(committed):
            return Draft()
        chain = self.chain(committed, choose_k("lookup", self.match_length()))
        return _lookup_draft(chain, extend, constraint)

    def settle(self, committed: list[int]) -> None:
        self.index.sync(committed)


def _lookup_draft(chain: Chain | None, extend: Extend, constraint: Constraint | None) -> Draft:
    """A lookup chain, cut where the policy's `extend` says its next token is not worth
    verifying at its probability, or where a constraint stops allowing it: a token it
    forbids has p = 0, so verifying it would be a step spent for nothing."""
    if chain is None:
        return Draft()
    n = len(chain.tokens)
    for j, prob in enumerate(chain.probs):
        step = extend(j, prob)
        if step != "more":
            n = j if step == "stop" else j + 1
            break
    tokens = chain.tokens[:n]
    if constraint is not None:
        tokens = tokens[: constraint.fits(tokens)]
        constraint.advance(tokens)
    if not tokens:
        return Draft()
    return Draft(tokens, [None] * len(tokens), "lookup", confidences=chain.probs[: len(tokens)],
                 origin=chain.origin)


class HybridDraft:
    """Lookup when the context has a match, the draft model otherwise.

    Each round: if the last tokens occurred before and the policy allows a
    lookup draft now (`choose_k("lookup", match) > 0`), propose the lookup
    continuation; else ask the model strategy (which asks `choose_k("model", 0)`).
    The policy sees the source of every round, so it learns what each source is
    worth on this machine and this text and can turn either off (k = 0). Where the
    text follows earlier replies (`LookupDraft.follows`) and the model drafted the last
    time it was asked, the model is asked first, with what those replies agree on
    spliced into its draft (`ModelDraft.splice`): it draws the values, the format comes
    free.

    The draft model's cache: `ModelDraft.propose` syncs it to `committed`
    itself, so rounds without a model draft leave it as it was, a prefix of
    committed[:-1] that catches up (one batch) the next time it drafts.
    """

    def __init__(self, lookup: LookupDraft, model: DraftStrategy | None) -> None:
        self.lookup = lookup
        self.model = model
        self._model_drafted = False  # did the model draft in the round now settling?
        # Did the model draft the last time it was asked (the policy had it on; yes
        # before it is first asked)? Asking it first while it is off would only count
        # towards its probes.
        self._model_on = True

    def propose(
        self,
        committed: list[int],
        choose_k: ChooseK,
        params: SamplingParams,
        rng: np.random.Generator,
        extend: Extend = always_more,
        constraint: Constraint | None = None,
    ) -> Draft:
        self._model_drafted = False
        if self.lookup.has_match(committed):
            if self.lookup.follows() and self.model is not None and self._model_on:
                # Following earlier replies: the model drafts, their agreed fixed parts
                # spliced in free; their chain alone where the model is not worth asking.
                draft = self._model(committed, choose_k, params, rng, extend, constraint)
                if draft.tokens or draft.rows:
                    return draft
            k = choose_k("lookup", self.lookup.match_length())
            if k > 0:
                draft = _lookup_draft(self.lookup.chain(committed, k), extend, constraint)
                if draft.tokens:
                    return draft
        if self.model is None:
            return Draft()
        return self._model(committed, choose_k, params, rng, extend, constraint)

    def _model(self, committed: list[int], choose_k: ChooseK, params: SamplingParams,
               rng: np.random.Generator, extend: Extend, constraint: Constraint | None
               ) -> Draft:
        model = self.model
        assert model is not None
        self._model_drafted = True
        if isinstance(model, ModelDraft) and self.lookup.following():
            model.splice = self.lookup.agreed
        try:
            draft = model.propose(committed, choose_k, params, rng, extend, constraint)
        finally:
            if isinstance(model, ModelDraft):
                model.splice = None
        self._model_on = bool(draft.tokens or draft.rows)
        return draft

    def settle(self, committed: list[int]) -> None:
        self.lookup.settle(committed)
        if self._model_drafted and self.model is not None:
            # Only a round in which the model drafted can leave its cache beyond
            # committed[:-1]; otherwise it already is a prefix of it.
            self.model.settle(committed)
        self._model_drafted = False
