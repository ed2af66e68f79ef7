"""What a remote `chat` asks of the engine process between turns (cli/chat/remote.py),
besides orders: one slot's decoder, read or adjusted."""

from __future__ import annotations

from collections.abc import Sequence

from .. import SpeculativeDecoder, Stats
from ..engine.llama.kvreport import CacheReport, cache_report
from ..policy.compare import Comparison, compare_with_target

#: The ChatCalls methods an engine process answers besides orders (isolation.py).
CALLS = frozenset({"evaluated", "sync", "cache_report", "compare", "set_p_min"})


def evaluated(decoder: SpeculativeDecoder) -> dict[str, int]:
    """Tokens each model has decoded so far (chat's per-turn figures)."""
    counts = {"target": decoder.target.tokens_evaluated}
    if decoder.draft is not None:
        counts["draft"] = decoder.draft.tokens_evaluated
    return counts


class ChatCalls:
    def __init__(self, decoder: SpeculativeDecoder) -> None:
        self.decoder = decoder

    def evaluated(self) -> dict[str, int]:
        return evaluated(self.decoder)

    def sync(self, name: str, tokens: Sequence[int]) -> int:
        """One model's cache ("target" or "draft") brought to `tokens`, as Model.sync_to."""
        model = self.decoder.target if name == "target" else self.decoder.draft_model
        return model.sync_to(list(tokens)) if model is not None else 0

    def cache_report(self, history: Sequence[int]) -> CacheReport:
        return cache_report(history, self.decoder.target, self.decoder.draft_model)

    def compare(self, stats: Stats) -> Comparison:
        return compare_with_target(self.decoder, stats)

    def set_p_min(self, value: float) -> None:
        self.decoder.p_min = value
