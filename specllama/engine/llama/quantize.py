"""Requantizing a GGUF file through llama.cpp (a self-draft derived from its target)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from ...errors import DraftDerivationError
from . import backend
from .backend import lc

LLAMA_CPP_VERSION = str(getattr(lc, "__version__", "?"))

QUANT_TYPES: dict[str, int] = {
    "F32": lc.LLAMA_FTYPE_ALL_F32,  # the bandwidth-bound stand-in for a big target (bench/)
    "F16": lc.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q6_K": lc.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q5_1": lc.LLAMA_FTYPE_MOSTLY_Q5_1,
    "Q5_0": lc.LLAMA_FTYPE_MOSTLY_Q5_0,
    "Q4_1": lc.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q4_K_M": lc.LLAMA_FTYPE_MOSTLY_Q4_K_M,  # what laptop models ship as (synthetic targets)
    "Q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
    "IQ4_NL": lc.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}


def quantize(src: Path, dst: Path, ftype: str, n_threads: int | None = None) -> None:
    """Requantize a GGUF file (e.g. a Q4_0 self-draft from a Q4_1 target)."""
    if ftype not in QUANT_TYPES:
        raise DraftDerivationError(
            f"unknown quantization {ftype!r}; choose one of {', '.join(QUANT_TYPES)}"
        )
    backend.init()
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[ftype]
    params.nthread = n_threads or 0
    params.allow_requantize = True
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise DraftDerivationError(
            f"{src}: requantizing to {ftype} failed ({backend.last_log_error()})"
        )
