"""What every draft source implements, and what one round's draft is.

A drafter proposes tokens that may follow the text; the target verifies them. Like
llama.cpp's `common/speculative.cpp`, each source has three verbs:

- `begin(start)`: a generation begins (its prompt; whether the caches carry over);
- `draft(ask)`: up to `ask.room` tokens that may follow `ask.context`, each with the
  distribution q it was really drawn from (None: all mass on it, a deterministic
  proposal), which is what keeps the acceptance rule exact;
- `accept(committed, alone_p)`: the round is over; keep whatever state agrees with the
  committed text and drop the rest;
- `end(committed)`: the generation is over (finished, closed, interrupted): stop any
  work in flight and leave every cache a prefix of the text.

`DraftChain` (chain.py) asks its drafters in order; the round loop knows only the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from ..constraint import Constraint
from ..sampling import SamplingParams

#: Where a drafted token came from: a constraint forced it, the draft model drew it, a
#: lookup copied it from text seen in this call's context, earlier calls of this process,
#: the persisted cache of earlier processes or the user's corpus, or it was copied from
#: the request's own prediction of its output (prediction.py).
Origin = Literal["forced", "model", "mtp", "context", "session", "persisted", "corpus",
                 "prediction"]
#: What a round is priced as: a draft model's draft (draft steps) or a lookup (none).
Source = Literal["model", "lookup"]
#: What a drafter does at draft row j, once it has read the row: "stop" (token j is not
#: drawn), "last" (draw token j and end the draft with it) or "more" (draw it and go on).
DraftStep = Literal["stop", "last", "more"]


def always_more(j: int, confidence: float) -> DraftStep:
    """`Lengths.extend` of a policy whose drafts run to the k it chose."""
    return "more"


class Lengths(Protocol):
    """How long drafts are: what a drafter asks the draft-length policy."""

    def choose(self, source: str = "model", match: int = 0) -> int:
        """Draft length for this round from `source` (0: none); `match`: how many tokens
        a lookup's match spans (its evidence)."""
        ...

    def extend(self, j: int, confidence: float) -> DraftStep:
        """At row j (0-based) of a draft: go on or stop. `confidence` is the draft
        model's top probability there (a lookup's share of agreeing occurrences), so
        the length depends on the draft's distributions alone, never on a token drawn."""
        ...

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        """Whether `source` may be asked to draft in this call at all, a draft model
        `behind` tokens short of the prompt (False: it catches up when it first drafts)."""
        ...


@dataclass(frozen=True)
class ModelWork:
    """What a draft model did for one round, as the policy prices it."""

    #: Rows of its own it read: the tokens it drew, plus one where it read a row and drew
    #: nothing from it (a step decoded for nothing).
    rows: int = 0
    #: Decode time of its steps after the first (what a draft step costs, apart from
    #: waking up and catching up).
    steps_s: float = 0.0
    #: Committed tokens before `last` it decoded first, in the same batch.
    caught_up: int = 0
    #: First-draft acceptance it showed, catching up, on tokens the target drew alone
    #: (`sampling.first_draft_acceptance`): what paused rounds teach.
    shadow: tuple[float, ...] = ()
    #: Tokens of the draft it drew ahead, while the target verified the last round
    #: (drafting/ahead.py): they cost this round no draft step.
    ahead: int = 0


#: What a round without a draft model's work carries (compared by identity: per round).
NO_WORK = ModelWork()


@dataclass
class Draft:
    """The tokens the target verifies after `last`, the q each was drawn from (None: all
    mass on it) and each one's origin; for the policy, the source the round is priced as,
    the confidence at each token after the forced ones (empty where unread) and what a
    draft model did."""

    tokens: list[int] = field(default_factory=list)
    qs: list[np.ndarray | None] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)
    source: Source = "model"
    confidences: list[float] = field(default_factory=list)
    work: ModelWork = NO_WORK

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def forced(self) -> int:
        """Leading tokens a constraint forced."""
        n = 0
        while n < len(self.origins) and self.origins[n] == "forced":
            n += 1
        return n

    def add(self, tokens: Sequence[int], qs: Sequence[np.ndarray | None],
            origin: Origin) -> None:
        self.tokens += tokens
        self.qs += qs
        self.origins += [origin] * len(tokens)

    def extend(self, part: Draft) -> None:
        """This draft, continued by the chain's next drafter: the round is priced as that
        drafter's."""
        self.source = part.source
        if part.work is not NO_WORK:
            self.work = part.work
        if part.tokens:
            self.tokens += part.tokens
            self.qs += part.qs
            self.origins += part.origins
            self.confidences += part.confidences


@dataclass(frozen=True)
class Ask:
    """One request for a draft: continue `context` (the committed text, then what earlier
    drafters of the chain proposed this round) by at most `room` tokens."""

    context: Sequence[int]
    room: int
    lengths: Lengths
    params: SamplingParams
    rng: np.random.Generator
    #: What the output must follow: every proposed token is one it allows, consumed
    #: into its chain (a model draws from its masked q).
    constraint: Constraint | None = None

    def choose(self, source: str, match: int = 0) -> int:
        """The policy's draft length for `source`, within the room left."""
        return min(self.lengths.choose(source, match), self.room)

    def after(self, draft: Draft) -> Ask:
        """This request, continued after `draft`'s tokens."""
        if not draft.tokens:
            return self
        return Ask([*self.context, *draft.tokens], self.room - len(draft.tokens),
                   self.lengths, self.params, self.rng, self.constraint)


@dataclass(frozen=True)
class Start:
    """A generation begins: `prompt` is in the target's cache but for its last token;
    `keep_cache`: what the caches hold of it may be reused (else they start empty)."""

    prompt: Sequence[int]
    keep_cache: bool
    lengths: Lengths


class Drafter(Protocol):
    #: What `--drafters` calls it.
    name: str

    @property
    def decode_s(self) -> float:
        """Seconds inside its model's decodes, ever (0 for a lookup)."""
        ...

    @property
    def behind(self) -> int:
        """Committed tokens before the newest that its model's cache lacks (0 without)."""
        ...

    def begin(self, start: Start) -> None: ...

    def draft(self, ask: Ask) -> Draft: ...

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        """The round is over and `committed` is the text; `alone_p`: where the round
        drafted nothing, p of the token the target drew alone (its last)."""
        ...

    def end(self, committed: Sequence[int]) -> None:
        """The generation is over, however it ended: work in flight stops and every
        cache is cut back to a prefix of committed[:-1]."""
        ...
