"""The body of llama-server's POST /infill (its tools/server/README.md), as code editors'
plugins send it (llama.vim, llama.vscode): the code before and after the cursor, files
for context, and /completion's fields where specllama has them (the legacy completions'
request, schema.py, with its refusals).

`samplers` is honoured as llama.cpp reads it: the samplers named run and the others do
not (no "temperature": the distribution at temperature 1). llama.cpp's "infill" sampler
is accepted and not run (docs/apis.md): specllama draws from the target's distribution
after the samplers it has, exactly; the answer's generation_settings say which ran.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ...engine.sampling import SamplingParams
from ..apierror import APIError
from ..schema import CompletionRequest

MAX_EXTRA = 1024  # input_extra's chunks (llama.vim keeps 16 at most by default)
MAX_SAMPLERS = 32
MAX_RESPONSE_FIELDS = 256

#: specllama's samplers, in the order it applies them (docs/apis.md).
OURS = ("penalties", "temperature", "top_k", "top_p", "min_p")
#: llama.cpp's samplers that change nothing while their switch is off (a switch on is
#: refused by name, schema.py's UNSUPPORTED), and the one accepted without being run.
OFF_HERE = ("dry", "typ_p", "xtc", "top_n_sigma")
NOT_RUN = ("infill",)


class ExtraChunk(BaseModel):
    """A file's text for context; llama-server names one without a filename "tmp"."""

    model_config = ConfigDict(extra="ignore")
    filename: str = "tmp"
    text: str


class InfillRequest(CompletionRequest):
    model: str = ""  # optional, as llama-server reads it: "" is the model served
    input_prefix: str
    input_suffix: str
    input_extra: Annotated[list[ExtraChunk], Field(max_length=MAX_EXTRA)] = []
    prompt: str = ""  # the text at the cursor, after the prefix (server/fim.py)
    samplers: Annotated[list[str], Field(max_length=MAX_SAMPLERS)] | None = None
    # The answer's fields to send, "a/b" for b inside a, flattened as llama-server does.
    response_fields: Annotated[list[str], Field(max_length=MAX_RESPONSE_FIELDS)] | None = None
    return_tokens: bool = False
    limits: ClassVar[dict[str, int]] = {**CompletionRequest.limits, "input_extra": MAX_EXTRA,
                                        "samplers": MAX_SAMPLERS,
                                        "response_fields": MAX_RESPONSE_FIELDS}
    honours: ClassVar[frozenset[str]] = CompletionRequest.honours | {"samplers"}

    def samplers_run(self) -> tuple[str, ...]:
        """specllama's samplers this request runs, in their order; a 400 naming
        `samplers` for one it does not know."""
        if self.samplers is None:
            return OURS
        unknown = [s for s in self.samplers if s not in (*OURS, *OFF_HERE, *NOT_RUN)]
        if unknown:
            raise APIError(400, f"samplers: {unknown[0]!r} is not a sampler this server "
                           f"knows; it runs {', '.join(OURS)} (in that order), accepts "
                           f"{', '.join(OFF_HERE)} off and infill unrun",
                           param="samplers", code="unsupported_parameter")
        return tuple(s for s in OURS if s in self.samplers)


def sampled_by(run: tuple[str, ...], s: SamplingParams) -> SamplingParams:
    """`s` with the samplers not in `run` off, as llama.cpp leaves a sampler out."""
    return SamplingParams(
        temperature=s.temperature if "temperature" in run else 1.0,
        top_k=s.top_k if "top_k" in run else 0,
        top_p=s.top_p if "top_p" in run else 1.0,
        min_p=s.min_p if "min_p" in run else 0.0,
        seed=s.seed,
        penalties=s.penalties if "penalties" in run else None)
