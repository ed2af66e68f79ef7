"""Draft-length policies beyond a fixed k: "auto" (cost-aware) and "heuristic".

Importing this package registers them with the engine's round loop
(`engine.loop.lengths.NAMED_POLICIES`); `specllama/__init__.py` does so.
"""

from ..engine.loop.lengths import (
    NAMED_POLICIES,
    DraftLengthPolicy,
    FixedDraftLength,
    make_policy,
)
from .auto import AutoDraftLength, AutoState
from .heuristic import HeuristicDraftLength
from .tuning import AutoTuning

NAMED_POLICIES["auto"] = AutoDraftLength.for_decoder
NAMED_POLICIES["heuristic"] = lambda decoder: HeuristicDraftLength()

__all__ = [
    "AutoDraftLength",
    "AutoState",
    "AutoTuning",
    "DraftLengthPolicy",
    "FixedDraftLength",
    "HeuristicDraftLength",
    "make_policy",
]
