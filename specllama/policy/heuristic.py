"""`draft_max="heuristic"`: +2 after a fully accepted draft, -1 otherwise
(llama.cpp's server heuristic; blind to costs, kept as a point of comparison)."""

from __future__ import annotations

from ..engine.drafting.base import always_more
from ..engine.loop.events import RoundVerified


class HeuristicDraftLength:
    def __init__(self, k_max: int = 16, k_min: int = 1, start: int = 4) -> None:
        self.k_max, self.k_min = k_max, k_min
        self.k = max(k_min, min(start, k_max))

    def choose(self, source: str = "model", match: int = 0) -> int:
        return self.k

    extend = staticmethod(always_more)

    def observe(self, outcome: RoundVerified) -> None:
        if outcome.k == 0:
            return
        step = 2 if outcome.m == outcome.k else -1
        self.k = max(self.k_min, min(self.k_max, self.k + step))

    def describe(self) -> str:
        return f"heuristic draft length in [{self.k_min}, {self.k_max}] (+2 all accepted, -1 else)"

    def explain(self) -> str:
        return ""

    def predicted_speedup(self) -> float | None:
        return None

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        return True
