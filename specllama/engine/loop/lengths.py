"""How many tokens to draft each round, as the round loop sees it.

The engine defines the interface and the fixed draft length; the adaptive
policies ("auto", "heuristic") live in `specllama.policy`, which registers them
in `NAMED_POLICIES` when imported (the engine never imports the layer above).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from .llama import Model
from .settings import validate_setting

Source = Literal["model", "lookup"]
#: What a draft model does at draft row j, once it has read the row: "stop" (draft nothing
#: more: token j is not drawn), "last" (draw token j and end the draft with it) or "more"
#: (draw it and decode it, to read row j + 1).
DraftStep = Literal["stop", "last", "more"]


def always_more(j: int, confidence: float) -> DraftStep:
    """`DraftLengthPolicy.extend` of a policy whose drafts run to the k it chose."""
    return "more"


@dataclass(frozen=True)
class RoundOutcome:
    """What one round cost and gave: the input of adaptive policies."""

    k: int  # tokens drafted (0 = plain target step), after `forced`
    accepted: int  # of those k
    source: Source
    target_s: float  # target decode time of this round (one pass of k+1 tokens)
    draft_s: float  # draft model decode time of this round (0 for lookup)
    seconds: float = 0.0  # wall time of the round (0: not measured)
    #: First-draft acceptance the draft model showed on tokens the target drew alone in
    #: earlier rounds, read while it caught up this round (`Draft.shadow`).
    shadow: tuple[float, ...] = ()
    #: Of draft_s, the k - 1 draft steps after a round's first (`Draft.steps_s`).
    draft_steps_s: float = 0.0
    #: Committed tokens the draft model's cache lacks after this round, beyond the newest
    #: (0 with no draft model): what its next draft decodes in one batch with the newest.
    draft_behind: int = 0
    #: Of those, the ones this round's model draft caught up on (`Draft.caught_up`).
    draft_caught_up: int = 0
    #: The draft model's confidence at each drafted token (`Draft.confidences`).
    confidences: tuple[float, ...] = ()
    #: Rows of its own the draft model read (`Draft.rows`): k, or k + 1 when a row was
    #: read and the draft ended there (a step decoded for nothing).
    draft_rows: int = 0
    #: Tokens a constraint forced at the start of the draft, verified in the same pass
    #: (the batch held forced + k + 1 tokens).
    forced: int = 0


class DraftLengthPolicy(Protocol):
    def choose(self, source: str = "model", match: int = 0) -> int:
        """Draft length for the next round from this source (0 = plain target step);
        `match`: how many tokens a lookup draft's match spans (its evidence)."""
        ...

    def extend(self, j: int, confidence: float) -> DraftStep:
        """At row j (0-based) of a model draft of at most the chosen k: go on or stop.
        `confidence` is the draft model's probability of its likeliest token there, so
        the draft length depends on the draft's distributions alone (which keeps the
        acceptance rule exact), never on the token then drawn."""
        ...

    def observe(self, outcome: RoundOutcome) -> None:
        """Outcome of the last round."""
        ...

    def describe(self) -> str:
        """One plain line for the stats: what the policy did and why."""
        ...

    def explain(self) -> str:
        """The reasoning behind `describe` (costs, rates, what was weighed), for
        --json and --verbose; "" where the line says it all."""
        ...

    def predicted_speedup(self) -> float | None:
        """The speedup over the target alone a cost model expected of this call's
        rounds (None: the policy has no cost model)."""
        ...

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        """Whether this call may ask `source` for a draft at all, the draft model
        `behind` tokens short of the prompt. False lets the round loop leave its share of
        the prompt for later: a draft model catches up on its own the first time it
        drafts."""
        ...


class FixedDraftLength:
    def __init__(self, k: int) -> None:
        self.k = k

    def choose(self, source: str = "model", match: int = 0) -> int:
        return self.k

    extend = staticmethod(always_more)

    def observe(self, outcome: RoundOutcome) -> None:
        pass

    def describe(self) -> str:
        return "target alone (draft length 0)" if self.k == 0 else f"fixed draft length {self.k}"

    def explain(self) -> str:
        return ""

    def predicted_speedup(self) -> float | None:
        return None

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        return self.k > 0


class PolicyHost(Protocol):
    """What a policy may read of the decoder it serves (SpeculativeDecoder is one)."""

    target: Model
    draft: Model | None
    #: What policies keep across the decoder's calls (auto: the measured costs).
    policy_state: dict[str, object]


PolicyFactory = Callable[[PolicyHost], DraftLengthPolicy]
#: draft_max words -> the policy of one generation call (filled by specllama.policy).
NAMED_POLICIES: dict[str, PolicyFactory] = {}

DraftMax = int | str | DraftLengthPolicy


def make_policy(draft_max: DraftMax, decoder: PolicyHost) -> DraftLengthPolicy:
    """An int is a fixed k (0 = target alone), "auto" the cost-aware policy,
    "heuristic" +2/-1; a policy object is used as it is."""
    if not isinstance(draft_max, (int, str)) and hasattr(draft_max, "choose"):
        return draft_max
    value = validate_setting("draft_max", draft_max)
    if isinstance(value, str):
        return NAMED_POLICIES[value](decoder)
    return FixedDraftLength(value)
