"""Drafts from the request's own prediction of its output (OpenAI's Predicted Outputs: the
file being edited, sent beside the request that edits it).

While the output is in step with the prediction, the prediction's next tokens are the
draft. Where the output leaves it (an edit) and later rejoins it, drafting picks up again
at the matching place: the last few tokens of the output found in the prediction, the
occurrence at or after the place the output left preferred (code repeats its lines, and
an edit rejoins the file after itself), else the nearest one before it. Alignment is on
the text, never on positions: an insertion or a deletion moves every later position.
Where the output spells the prediction's text in other tokens (the prediction was
tokenized on its own: a SentencePiece tokenizer adds a space before its first word, and
the model may split a word its own way), its bytes are followed too, and where they
reach a boundary of the prediction's tokens the output is back in step there.

A drafter of its own, not the lookup's machinery with the prediction as one more
archive: a lookup drafts from the *latest* occurrence of the last >= 3 tokens and caps a
draft by the match's length, so it could neither draft the prediction's opening (nothing
generated yet to match) nor pick the right copy of a repeated line by where the output
stands in the file; and a prediction belongs to one request and joins every chain first,
where the lookup's archives are the decoder's. It shares what exactness and pricing rest
on: its proposals are deterministic given the text so far (q None: all mass on each
token), cut by a lookup's rule (`lookup_draft`) and priced by the policy as a lookup.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .base import Ask, Draft, Start
from .lookup import Continuation, lookup_draft
from .ngram import NGRAM_MAX, NGRAM_MIN
from .suffixcache import MATCH_MAX

#: The evidence of the alignment at the output's start, as the policy prices it: the
#: client's word that the output begins as the prediction does counts as a match of a
#: full n-gram window (a lookup's "long" match: copying).
AT_START = NGRAM_MAX
#: Occurrences of a match weighed on each side of where the output left the prediction:
#: a passage repeated a thousand times costs a realignment no more than this.
NEAR = 16


@dataclass(frozen=True)
class Prediction:
    """A request's prediction of its output in target tokens. `added_space`: the
    tokenizer wrote a space before its first word that its text lacks (SentencePiece
    does): the output may begin with it or without, so the first token is the target's
    own, and the output's text decides where it stands."""

    tokens: tuple[int, ...]
    added_space: bool = False


@dataclass(frozen=True)
class Place:
    """Where the output stands in the prediction: `pos`, the position of the token
    expected next (None: out of step), after `evidence` tokens in step with it (the
    policy's `match`); `left`, where the output last left it; `text`, out of step, the
    byte of the prediction's text the output's text has reached since (None: it differs)."""

    pos: int | None
    evidence: int = 0
    left: int = 0
    text: int | None = None


class PredictionIndex:
    """The prediction's tokens and text, and for each of its n-grams of n_min and of n_max
    tokens the positions that follow its occurrences, ascending (two orders, as the
    suffix cache keeps: a match's length in between is measured, not indexed; a 20,000
    token prediction is indexed in ~0.07 s)."""

    def __init__(self, prediction: Prediction, piece: Callable[[int], bytes] | None = None,
                 n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX) -> None:
        """piece: a token's bytes (the target's); None: tokens alone are followed."""
        self.tokens = toks = list(prediction.tokens)
        self.added_space = prediction.added_space
        self.piece = piece
        self.n_min, self.n_max = n_min, n_max
        self.after: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for n in {n_min, n_max}:
            table: dict[tuple[int, ...], list[int]] = {}
            for c in range(n, len(toks)):  # followed by a token: something to draft
                table.setdefault(tuple(toks[c - n : c]), []).append(c)
            self.after[n] = table
        pieces = [piece(t) for t in toks] if piece is not None else []
        self.text = b"".join(pieces)
        self.offsets = [0]  # where each token's bytes begin in `text`
        for p in pieces:
            self.offsets.append(self.offsets[-1] + len(p))
        #: the token that begins at each offset (the first, where pieces are empty)
        self.at_offset: dict[int, int] = {}
        for i, offset in enumerate(self.offsets[:-1]):
            self.at_offset.setdefault(offset, i)

    def __len__(self) -> int:
        return len(self.tokens)

    def walk(self, place: Place, new: Sequence[int]) -> Place:
        """The place after `new` tokens: in step while each is the prediction's next;
        out of step, back in step where the output's text reaches a token boundary of
        the prediction's, the same bytes all the way."""
        pos, evidence, left, text = place.pos, place.evidence, place.left, place.text
        toks = self.tokens
        for t in new:
            if pos is not None:
                if pos < len(toks) and toks[pos] == t:
                    pos, evidence = pos + 1, evidence + 1
                    continue
                left, text = pos, self._leaving(pos, t)
                pos = None
            if text is None or self.piece is None:
                return Place(None, 0, left)
            piece = self.piece(t)
            if not self.text.startswith(piece, text):
                return Place(None, 0, left)
            text, evidence = text + len(piece), evidence + 1
            pos = self.at_offset.get(text)  # a boundary: back in step
        return Place(pos, evidence, left, None if pos is not None else text)

    def _leaving(self, pos: int, token: int) -> int | None:
        """Where the output's text is followed from, leaving the prediction at `pos` with
        `token`: the space a tokenizer added before the first word is optional."""
        if pos >= len(self.tokens) or self.piece is None:
            return None
        if pos == 0 and self.added_space and not self.text.startswith(self.piece(token)):
            return 1
        return self.offsets[pos]

    def find(self, output: Sequence[int], left: int) -> Place:
        """Back in step where the end of `output` occurs in the prediction: a full
        window's match anywhere, else one of n_min tokens or more near `left`; of those,
        the occurrences whose match runs furthest back (a repeated passage's right copy
        is the one whose match runs back past the repetition), then the first that
        begins at or after `left`, else the last before it."""
        for n, longest in ((self.n_max, MATCH_MAX), (self.n_min, self.n_max - 1)):
            after = self.after[n].get(tuple(output[len(output) - n :])) \
                if len(output) >= n else None
            if not after:
                continue
            i = bisect.bisect_left(after, left + n)  # the first to begin at `left` or later
            evidence, near = self._furthest(after[max(0, i - NEAR) : i + NEAR], output, n,
                                            longest)
            i = bisect.bisect_left(near, left + evidence)  # the whole match after `left`
            return Place(near[i] if i < len(near) else near[-1], evidence, left)
        return Place(None, 0, left)

    def _furthest(self, after: list[int], output: Sequence[int], n: int,
                  longest: int) -> tuple[int, list[int]]:
        """Of the occurrences followed by `after` (matching the last n tokens of
        `output`), those whose match runs furthest back (up to `longest` tokens), and
        that length."""
        toks, end = self.tokens, len(output)
        lengths = []
        for c in after:
            m = n
            while m < longest and m < c and m < end and toks[c - m - 1] == output[end - m - 1]:
                m += 1
            lengths.append(m)
        best = max(lengths)
        return best, [c for c, m in zip(after, lengths) if m == best]


class PredictionDrafter:
    """Drafts the prediction's tokens from where the output stands in it."""

    name = "prediction"
    decode_s = 0.0
    behind = 0

    def __init__(self, prediction: Prediction,
                 piece: Callable[[int], bytes] | None = None) -> None:
        """piece: a token's bytes, to follow the output's text where its tokens differ."""
        self.index = PredictionIndex(prediction, piece)
        self.place = Place(0, AT_START)
        self._start = 0  # where the output begins in the committed text
        self._seen = 0  # the committed tokens `place` accounts for

    def begin(self, start: Start) -> None:
        self.place = Place(0, AT_START)
        self._start = self._seen = len(start.prompt)

    def draft(self, ask: Ask) -> Draft:
        place = self._after(ask.context)
        if place.pos is None or place.pos >= len(self.index):
            return Draft()
        if len(ask.context) == self._start and self.index.added_space:
            return Draft()  # the first token is the target's own (Prediction)
        k = ask.choose("lookup", place.evidence)
        tokens = self.index.tokens[place.pos : place.pos + k]
        return lookup_draft(Continuation(tokens, [1.0] * len(tokens), "prediction"), ask)

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        self.place = self._after(committed)
        self._seen = len(committed)

    def end(self, committed: Sequence[int]) -> None:
        pass  # nothing in flight, no cache: the next generation begins afresh

    def _after(self, text: Sequence[int]) -> Place:
        """The place after `text`: the committed text, and in a draft any tokens a
        constraint forced after it."""
        place = self.index.walk(self.place, text[self._seen :])
        if place.pos is None and place.text is None:
            place = self.index.find(text[self._start :], place.left)
        return place
