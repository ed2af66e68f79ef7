"""Draft strategies: who proposes the tokens the target verifies.

Every strategy returns the proposed tokens together with the distribution q
each was really drawn from (None = all mass on that token), which is what the
acceptance rule needs to stay exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from ..errors import InvalidParameterError
from .constraint import Constraint, masked
from .lengths import DraftStep, always_more
from .llama import DraftModel
from .sampling import (
    SamplingParams,
    confidence,
    first_draft_acceptance,
    probabilities,
    sample,
)
from .settings import DRAFT_MODES, DraftMode

#: At most this many rows of a catch-up are read for `Draft.shadow` (each row read costs
#: the draft's output layer and a softmax; the latest tokens tell most about now).
SHADOW_ROWS = 64


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    qs: list[np.ndarray | None] = field(default_factory=list)
    source: Literal["model", "lookup"] = "model"
    #: First-draft acceptance the draft model showed while catching up on tokens the
    #: target decoded alone (see `first_draft_acceptance`): what paused rounds teach.
    shadow: list[float] = field(default_factory=list)
    #: Draft model decode time of the steps after the first: k - 1 single tokens, each
    #: right after the last (what a draft step costs in the loop, apart from waking up).
    steps_s: float = 0.0
    #: Committed tokens before `last` the draft model decoded first, in the same batch
    #: (0 when its cache was up to date; 1 after a fully accepted round).
    caught_up: int = 0
    #: The draft model's confidence at each drafted token (`sampling.confidence`); for
    #: a lookup draft, the share of the pooled occurrences that agreed (`Chain.probs`).
    confidences: list[float] = field(default_factory=list)
    #: Rows the draft model read: len(tokens), plus one when it read a row and drew
    #: nothing from it (cut by p_min or by the policy).
    rows: int = 0
    #: Leading tokens a constraint forced (no source drafted them; q all on them).
    forced: int = 0
    #: Where a lookup draft's text was seen (`suffixcache.ORIGINS`); "" for a model's.
    origin: str = ""
    #: Where a model draft's splice added tokens (not drawn from the model: q all on
    #: them; `ModelDraft.splice`), and where their text was seen.
    spliced: list[int] = field(default_factory=list)
    spliced_origin: str = ""


#: (draft row j, the draft model's confidence there) -> what to do: DraftLengthPolicy.extend
Extend = Callable[[int, float], DraftStep]



#: (source name, match length of a lookup draft or 0) -> the draft length the policy
#: allows now
ChooseK = Callable[[str, int], int]


class DraftStrategy(Protocol):
    def propose(
        self,
        committed: list[int],
        choose_k: ChooseK,
        params: SamplingParams,
        rng: np.random.Generator,
        extend: Extend = always_more,
        constraint: Constraint | None = None,
    ) -> Draft:
        """Up to choose_k(source, match) tokens that may follow `committed`; an empty Draft
        when k is 0 (then nothing is decoded at all). A model draft asks `extend` at each
        row whether to go on. Under a constraint every proposed token is one it allows
        (a model draws from its masked q), consumed into its chain."""
        ...

    def settle(self, committed: list[int]) -> None:
        """The round is over: drop whatever state went beyond `committed`."""
        ...


class ModelDraft:
    """A small model samples the draft one token at a time from its own q.

    `p_min` stops a draft early when the draft's most likely next token has less
    than that probability. The decision depends on q alone, never on which token
    is then drawn, so the acceptance rule stays exact.

    A draft ends after a token that ends generation (`ends`): nothing after it is used.

    `target_p` maps positions of the history the target decoded alone (no draft) to
    p(token) of the token it drew there. When the draft catches up on such positions it
    reads its logits there too and reports, in `Draft.shadow`, whether it would have
    guessed them: a measure of acceptance that costs no target time.
    """

    def __init__(self, model: DraftModel, p_min: float = 0.0,
                 target_p: Mapping[int, float] | None = None,
                 ends: Callable[[int], bool] = lambda token: False) -> None:
        self.model = model
        self.p_min = p_min
        self.target_p: Mapping[int, float] = target_p if target_p is not None else {}
        # The target's end of generation: nothing after such a token is ever used, so the
        # draft stops there (a cut after a drawn token leaves each q_i as it was: exact).
        self.ends = ends
        self._drafted = False  # the model decoded since the last settle()
        # (tokens so far, at most n) -> tokens known to come next and where they were
        # seen, drafted free (q all on each) after a drawn one: a deterministic function
        # of the text, as a lookup is.
        self.splice: Callable[[list[int], int], tuple[list[int], str]] | None = None

    def propose(
        self,
        committed: list[int],
        choose_k: ChooseK,
        params: SamplingParams,
        rng: np.random.Generator,
        extend: Extend = always_more,
        constraint: Constraint | None = None,
    ) -> Draft:
        k = choose_k("model", 0)
        if k <= 0:
            return Draft()
        m = self.model
        self._drafted = True
        # Keep what the cache shares with `committed`, but never `last` itself:
        # its logits are q_1, so it must be decoded now.
        kept = m.sync_to(committed)
        if kept == len(committed):
            m.truncate(kept - 1)
            kept -= 1
        draft = Draft(caught_up=len(committed) - 1 - kept)
        self._catch_up(committed, kept, params, draft)
        if not m.can_draft():
            return draft  # a cross-vocabulary draft lost the text: the target goes alone
        steps_from = m.decode_s
        # A policy with a stop rule reads the draft's confidence; greedy that costs a
        # softmax over the vocabulary (0.2-0.3 ms a row here), so only then.
        reads = extend is not always_more
        for _ in range(k):
            i = len(draft.tokens)
            logits = m.logits_row(-1)
            if constraint is not None:
                logits = masked(logits, constraint.allowed())
            draft.rows += 1
            # Whether to draw token i depends on q_i alone (its top probability), never
            # on the token drawn: a stop decided by the draw would bias what is verified.
            q = None if params.greedy else probabilities(logits, params)
            sure = confidence(logits, params, q) if reads or q is not None else 1.0
            if sure < self.p_min and q is not None:
                break
            step = extend(i, sure)
            if step == "stop":
                break
            token = int(np.argmax(logits)) if q is None else sample(q, rng)
            draft.tokens.append(token)
            draft.qs.append(q)
            if constraint is not None:
                constraint.advance([token])
            if reads:
                draft.confidences.append(sure)
            if step == "last" or i + 1 >= k or self.ends(token):
                break
            free = self._spliced(committed, draft, k, constraint, reads)
            m.decode([token, *free], "last")
            if len(draft.tokens) >= k:
                break  # the splice filled the draft: its last row is not read
        draft.steps_s = m.decode_s - steps_from
        return draft

    def _spliced(self, committed: list[int], draft: Draft, k: int,
                 constraint: Constraint | None, reads: bool) -> list[int]:
        """Append what `splice` says comes next (within k and the constraint) to the
        draft; the tokens appended."""
        if self.splice is None:
            return []
        free, origin = self.splice(committed + draft.tokens, k - len(draft.tokens))
        if constraint is not None and free:
            free = free[: constraint.fits(free)]
            constraint.advance(free)
        if free:
            draft.spliced += range(len(draft.tokens), len(draft.tokens) + len(free))
            draft.spliced_origin = origin
        draft.tokens += free
        draft.qs += [None] * len(free)
        if reads:
            draft.confidences += [1.0] * len(free)
        return free

    def _catch_up(self, committed: list[int], kept: int, params: SamplingParams,
                  draft: Draft) -> None:
        """Decode committed[kept:]; where it holds tokens the target drew alone, read the
        rows that predicted them (the last SHADOW_ROWS at most) into draft.shadow."""
        n = len(committed)
        first = max(kept, n - SHADOW_ROWS)
        alone = [j for j in range(first + 1, n) if j in self.target_p]
        if not alone:
            self.model.decode(committed[kept:], "last")
            return
        self.model.decode(committed[kept:first], "none")
        self.model.decode(committed[first:], "all")
        chances = (first_draft_acceptance(self.model.logits_row(j - first - 1), committed[j],
                                          self.target_p[j], params, self.p_min)
                   for j in alone)
        draft.shadow = [c for c in chances if c is not None]

    def settle(self, committed: list[int]) -> None:
        # A round without a draft leaves the cache a prefix of committed[:-1] already.
        if self._drafted:
            self.model.sync_to(committed[:-1])
            self._drafted = False


#: The draft mode where there is a draft model: lookup costs no draft-model time, so text
#: that repeats its context (summaries, code edits, quotes) is drafted for almost nothing and
#: the draft model fills in elsewhere. Measured (Intel Xeon, 2 threads, built-in prompts,
#: greedy): 1.09x the target alone with the default pair, whose model draft never pays
#: (1.00x as "model"), and 1.26x with smollm2-f32 (1.03x); at T = 0.8 1.00x and 1.03x
#: (0.99x and 1.00x as "model").
DEFAULT_DRAFT_MODE: DraftMode = "hybrid"


def check_draft_mode(mode: object, has_draft_model: bool | None = None) -> None:
    """Raise InvalidParameterError unless `mode` is one of DRAFT_MODES and, where it is
    known whether there is a draft model, one that can draft without it ("lookup")
    when there is none: the command line, /set and the API share this one rule."""
    if mode not in DRAFT_MODES:
        raise InvalidParameterError(
            f"draft mode must be one of {', '.join(DRAFT_MODES)}; got {mode!r}"
        )
    if has_draft_model is False and mode in ("model", "hybrid"):
        raise InvalidParameterError(
            f"draft mode {mode} needs a draft model, but this pair has none "
            "(it drafts by lookup)"
        )
