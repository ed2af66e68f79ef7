"""How many tokens to draft each round, as the round loop sees it.

The engine defines the interface and the fixed draft length; the adaptive
policies ("auto", "heuristic") live in `specllama.policy`, which registers them
in `NAMED_POLICIES` when imported (the engine never imports the layer above).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..drafting.base import Lengths, always_more
from ..llama import Model
from ..settings import validate_setting
from .events import RoundVerified


class DraftLengthPolicy(Lengths, Protocol):
    """How long drafts are (what drafters ask: `Lengths`), and what the round loop tells
    the policy and asks it for the stats."""

    def observe(self, outcome: RoundVerified) -> None:
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


class FixedDraftLength:
    def __init__(self, k: int) -> None:
        self.k = k

    def choose(self, source: str = "model", match: int = 0) -> int:
        return self.k

    extend = staticmethod(always_more)

    def observe(self, outcome: RoundVerified) -> None:
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
