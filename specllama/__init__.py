"""specllama: exact speculative decoding for GGUF models on top of llama.cpp.

    from specllama import SpeculativeDecoder, SamplingParams
    dec = SpeculativeDecoder.load(target="t.gguf", draft="d.gguf", n_ctx=2048)
    res = dec.generate("Hello", max_tokens=64, sampling=SamplingParams(seed=1), draft_max=4)
"""

from .errors import (
    ConfigError,
    ContextOverflowError,
    DraftDerivationError,
    IncompatiblePairError,
    InvalidParameterError,
    ModelLoadError,
    SpecLlamaError,
)
from .events import (
    DraftProposed,
    Event,
    Finished,
    PromptEvaluated,
    RoundVerified,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from .sampling import SamplingParams
from .speculative import GenerationResult, SpeculativeDecoder
from .stats import Stats

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ContextOverflowError",
    "DraftDerivationError",
    "DraftProposed",
    "Event",
    "Finished",
    "GenerationResult",
    "IncompatiblePairError",
    "InvalidParameterError",
    "ModelLoadError",
    "PromptEvaluated",
    "RoundVerified",
    "SamplingParams",
    "SpecLlamaError",
    "SpeculativeDecoder",
    "Stats",
    "TargetToken",
    "TextFlushed",
    "TokensAccepted",
]
