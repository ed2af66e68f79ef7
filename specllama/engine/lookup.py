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

import numpy as np

from ..errors import InvalidParameterError
from .constraint import Constraint
from .drafts import ChooseK, Draft, DraftStrategy, Extend, always_more
from .sampling import SamplingParams

#: Default n-gram lengths searched, longest first. Matches of one or two tokens
#: are mostly common words and punctuation, whose continuation is a guess that
#: costs a verification; the shortest match that drafts is 3 tokens long.
NGRAM_MIN = 3
NGRAM_MAX = 8
#: A match found at n_max is measured further back, up to this many tokens.
MATCH_MAX = 64


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
        self.insertions = 0  # n-gram entries written, ever (tests check the index is incremental)
        self.rebuilds = 0  # times the sequence changed under the index and it started over

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self) -> None:
        self.tokens = []
        self._match = None
        for table in self.tables:
            table.clear()

    def extend(self, new: Sequence[int]) -> None:
        """Append tokens; only the n-grams they complete are indexed."""
        if not new:
            return
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        self._index(start, len(self.tokens))

    def _index(self, start: int, end: int) -> None:
        """Register every n-gram whose follower position c lies in [start, end)."""
        toks = self.tokens
        for n, table in zip(range(self.n_min, self.n_max + 1), self.tables):
            first = max(start, n)  # followers c >= n: the n-gram tokens[c-n:c] fits
            if first >= end:
                continue
            if end - first <= 16:  # a round's few new tokens: plain loop, least overhead
                for c in range(first, end):
                    table[hash(tuple(toks[c - n : c]))] = c
            else:
                # A prompt: zip of n shifted slices = the n-grams starting at c - n, in
                # order; later (more recent) occurrences overwrite earlier ones.
                grams = zip(*(toks[first - n + j : end - n + j] for j in range(n)))
                table.update(zip(map(hash, grams), range(first, end)))
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
        c, _ = found
        toks = self.tokens
        L = len(toks)
        out = toks[c : min(c + k, L)]
        period = L - c
        while len(out) < k:  # only when c + k > L: out holds one period, repeat it
            out.append(out[len(out) - period])
        return out


class LookupDraft:
    """The prompt-lookup draft strategy: drafts from `NgramIndex`, q = None.

    `cap_by_match`: after a match of n tokens draft at most n - n_min + 1 (see the
    module docstring); False drafts whatever the policy allows.
    """

    source = "lookup"

    def __init__(
        self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX, *, cap_by_match: bool = True
    ) -> None:
        self.index = NgramIndex(n_min, n_max)
        self.cap_by_match = cap_by_match

    def has_match(self, committed: Sequence[int]) -> bool:
        self.index.sync(committed)
        return self.index.match() is not None

    def match_length(self) -> int:
        """How many tokens the current match spans (0 without one; after has_match)."""
        found = self.index.match()
        return found[1] if found is not None else 0

    def find(self, committed: Sequence[int], k: int) -> list[int]:
        """The lookup continuation of `committed` (at most k tokens; [] without a match)."""
        self.index.sync(committed)
        found = self.index.match()
        if found is None:
            return []
        if self.cap_by_match:
            k = min(k, found[1] - self.index.n_min + 1)
        return self.index.propose(k)

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
        tokens = self.find(committed, choose_k("lookup", self.match_length()))
        return _lookup_draft(tokens, constraint)

    def settle(self, committed: list[int]) -> None:
        self.index.sync(committed)


def _lookup_draft(tokens: list[int], constraint: Constraint | None) -> Draft:
    """A lookup continuation, cut where a constraint stops allowing it: a token it
    forbids has p = 0, so verifying it would be a step spent for nothing."""
    if constraint is not None:
        tokens = tokens[: constraint.fits(tokens)]
        constraint.advance(tokens)
    return Draft(tokens, [None] * len(tokens), "lookup") if tokens else Draft()


class HybridDraft:
    """Lookup when the context has a match, the draft model otherwise.

    Each round: if the last tokens occurred before and the policy allows a
    lookup draft now (`choose_k("lookup", match) > 0`), propose the lookup
    continuation; else ask the model strategy (which asks `choose_k("model", 0)`).
    The policy sees the source of every round, so it learns what each source is
    worth on this machine and this text and can turn either off (k = 0).

    The draft model's cache: `ModelDraft.propose` syncs it to `committed`
    itself, so rounds without a model draft leave it as it was, a prefix of
    committed[:-1] that catches up (one batch) the next time it drafts.
    """

    def __init__(self, lookup: LookupDraft, model: DraftStrategy | None) -> None:
        self.lookup = lookup
        self.model = model
        self._model_drafted = False  # did the model draft in the round now settling?

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
            k = choose_k("lookup", self.lookup.match_length())
            if k > 0:
                draft = _lookup_draft(self.lookup.find(committed, k), constraint)
                if draft.tokens:
                    return draft
        if self.model is None:
            return Draft()
        self._model_drafted = True
        return self.model.propose(committed, choose_k, params, rng, extend, constraint)

    def settle(self, committed: list[int]) -> None:
        self.lookup.settle(committed)
        if self._model_drafted and self.model is not None:
            # Only a round in which the model drafted can leave its cache beyond
            # committed[:-1]; otherwise it already is a prefix of it.
            self.model.settle(committed)
        self._model_drafted = False
