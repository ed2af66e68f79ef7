"""Do the KV caches hold what the token history says? One report for chat's /debug-cache,
the server's /health and the tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import DraftModel, Model


@dataclass(frozen=True)
class CacheReport:
    """Token counts of the history and of each cache. Consistent: each cache holds a prefix
    of the history and llama.cpp agrees on its length (the invariant between requests)."""

    history: int
    target: int
    draft: int | None  # None: no draft model
    consistent: bool

    def as_dict(self) -> dict[str, int | bool]:
        """For JSON and `key=value` lines; no "draft" key without a draft model."""
        out: dict[str, int | bool] = {"history": self.history, "target": self.target}
        if self.draft is not None:
            out["draft"] = self.draft
        out["consistent"] = self.consistent
        return out


def cache_report(history: Sequence[int], target: Model,
                 draft: DraftModel | None) -> CacheReport:
    """Check `target` and `draft` (when there is one) against the committed `history`."""
    models = [target] if draft is None else [target, draft]
    return CacheReport(
        history=len(history),
        target=len(target.cached),
        draft=None if draft is None else len(draft.cached),
        consistent=all(_holds_prefix(m, history) for m in models),
    )


def _holds_prefix(model: Model | DraftModel, history: Sequence[int]) -> bool:
    n = len(model.cached)
    return model.cached == list(history[:n]) and model.pos_max() + 1 == n
