"""Tokens a constraint forces: where it allows one continuation only (`{"name": "`, a
closing bracket), llguidance computes its tokens without any model. They join the draft
first, q all on each, so they cost verification, never drafting; the chain's other
drafters continue after them."""

from __future__ import annotations

from collections.abc import Sequence

from ..constraint import Constraint
from .base import Ask, Draft, Start


class ForcedDrafter:
    name = "forced"
    decode_s = 0.0
    behind = 0

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint

    def begin(self, start: Start) -> None:
        pass

    def draft(self, ask: Ask) -> Draft:
        forced = self.constraint.forced(ask.room)
        self.constraint.advance(forced)
        draft = Draft(source="lookup")
        draft.add(forced, [None] * len(forced), "forced")
        return draft

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        pass  # the round loop settles the constraint itself: it masks the target's rows

    def end(self, committed: Sequence[int]) -> None:
        pass
