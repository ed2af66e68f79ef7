"""specllama: exact speculative decoding for GGUF models on top of llama.cpp.

    from specllama import SpeculativeDecoder, SamplingParams
    dec = SpeculativeDecoder.load(target="t.gguf", draft="d.gguf", n_ctx=2048)
    res = dec.generate("Hello", max_tokens=64, sampling=SamplingParams(seed=1), draft_max=4)
    res = dec.generate("A user as JSON:", constraint=ConstraintSpec.json_schema(schema))

The layers (docs/architecture.md): engine/ (llama.cpp, sampling, the round loop),
policy/ (draft lengths), models/ (models.toml, model sources), cli/.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

from . import policy as _policy  # noqa: F401  (registers "auto" and "heuristic")
from .engine.constraint import ConstraintSpec
from .engine.decoder import GenerationResult, GenerationStream, SpeculativeDecoder
from .engine.drafting.chain import Drafters
from .engine.loop.budget import ReasoningBudget
from .engine.loop.events import (
    DraftProposed,
    Event,
    Finished,
    PromptEvaluated,
    PromptProgress,
    RoundVerified,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from .engine.loop.linestops import Deadline, Indent
from .engine.loop.stats import Stats
from .engine.loop.textstream import Repeat
from .engine.penalties import Penalties
from .engine.sampling import SamplingParams
from .errors import (
    ConfigError,
    ConstraintError,
    ContextOverflowError,
    DraftDerivationError,
    IncompatiblePairError,
    InvalidParameterError,
    ModelLoadError,
    SpecLlamaError,
)

try:
    # pyproject.toml holds the version; the installed metadata carries it here.
    __version__ = _installed_version("specllama")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ConfigError",
    "ConstraintError",
    "ConstraintSpec",
    "ContextOverflowError",
    "Deadline",
    "DraftDerivationError",
    "Drafters",
    "DraftProposed",
    "Event",
    "Finished",
    "Repeat",
    "GenerationResult",
    "GenerationStream",
    "Indent",
    "IncompatiblePairError",
    "InvalidParameterError",
    "ModelLoadError",
    "Penalties",
    "PromptEvaluated",
    "PromptProgress",
    "ReasoningBudget",
    "RoundVerified",
    "SamplingParams",
    "SpecLlamaError",
    "SpeculativeDecoder",
    "Stats",
    "TargetToken",
    "TextFlushed",
    "TokensAccepted",
]
