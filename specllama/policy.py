"""How many tokens to draft each round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from .errors import InvalidParameterError

if TYPE_CHECKING:
    from .speculative import SpeculativeDecoder

DraftMax = int | Literal["auto", "heuristic"]
MAX_DRAFT = 64


@dataclass(frozen=True)
class RoundOutcome:
    """What one round cost and gave: the input of adaptive policies."""

    k: int  # tokens drafted (0 = plain target step)
    accepted: int
    source: Literal["model", "lookup"]
    target_s: float  # target decode time of this round (one pass of k+1 tokens)
    draft_s: float  # draft model decode time of this round (0 for lookup)


class DraftLengthPolicy(Protocol):
    def choose(self, source: str = "model") -> int:
        """Draft length for the next round from this source (0 = plain target step)."""
        ...

    def observe(self, outcome: RoundOutcome) -> None:
        """Outcome of the last round."""
        ...

    def describe(self) -> str:
        """One line for the stats: what the policy did and why."""
        ...


class FixedDraftLength:
    def __init__(self, k: int) -> None:
        self.k = k

    def choose(self, source: str = "model") -> int:
        return self.k

    def observe(self, outcome: RoundOutcome) -> None:
        pass

    def describe(self) -> str:
        return f"fixed draft length {self.k}"


class HeuristicDraftLength:
    """+2 after a fully accepted draft, -1 otherwise (llama.cpp's server heuristic)."""

    def __init__(self, k_max: int = 16, k_min: int = 1, start: int = 4) -> None:
        self.k_max, self.k_min = k_max, k_min
        self.k = max(k_min, min(start, k_max))

    def choose(self, source: str = "model") -> int:
        return self.k

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.k == 0:
            return
        step = 2 if outcome.accepted == outcome.k else -1
        self.k = max(self.k_min, min(self.k_max, self.k + step))

    def describe(self) -> str:
        return f"heuristic draft length in [{self.k_min}, {self.k_max}]"


def make_policy(draft_max: DraftMax, decoder: SpeculativeDecoder) -> DraftLengthPolicy:
    """The policy for a `draft_max` setting: an int is a fixed k (0 = target alone)."""
    if draft_max in ("auto", "heuristic"):
        return HeuristicDraftLength()
    if (
        not isinstance(draft_max, int)
        or isinstance(draft_max, bool)
        or not 0 <= draft_max <= MAX_DRAFT
    ):
        raise InvalidParameterError(
            f"draft_max must be 'auto' or an integer in [0, {MAX_DRAFT}], got {draft_max!r}"
        )
    return FixedDraftLength(draft_max)
