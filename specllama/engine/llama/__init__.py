"""The llama.cpp boundary: the only code that imports `llama_cpp`.

`Vocabulary` (a tokenizer and chat template), `Model` (a GGUF with its own KV cache,
batched decode, zero-copy logits rows, cutting the cache back), `quantize`, and the
process-wide side in `backend` (log, start-up, RPC devices, fatal errors). Also what
checks a pair as llama.cpp would (`compat`) and what reports the caches (`kvreport`).
"""

from .model import Model
from .quantize import LLAMA_CPP_VERSION, QUANT_TYPES, quantize
from .views import DraftModel, DraftTraits, KVState, LogitsWanted, ModelView
from .vocab import FimTokens, Vocabulary

__all__ = ["LLAMA_CPP_VERSION", "QUANT_TYPES", "DraftModel", "DraftTraits", "FimTokens", "KVState",
           "LogitsWanted", "Model", "ModelView", "Vocabulary", "quantize"]
