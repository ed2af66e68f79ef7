"""What the engine reports while it generates: small frozen dataclasses.

Renderers (CLI, REPL, bench) consume these; the engine never prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .stats import Stats

# "error": an exception ended the generation (the caches are still consistent).
FinishReason = Literal["eos", "length", "stop", "context", "interrupted", "error"]


@dataclass(frozen=True)
class TokenLogprob:
    """The target's natural log-probability of one generated token, read from the verify
    pass that decided it (its distribution at temperature 1, before top-k/top-p/min-p,
    masked by a constraint), and the `top` likeliest tokens at that position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationResult:
    tokens: list[int]  # generated ids only, prompt excluded (an end-of-generation token too)
    text: str
    finish_reason: FinishReason
    stats: Stats
    prompt_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token, when asked for
    # Under a constraint: whether the output is complete by it (None: no constraint).
    constraint_met: bool | None = None


@dataclass(frozen=True)
class PromptEvaluated:
    """The prompt is in both KV caches; `reused` tokens came from an earlier call."""

    n_tokens: int
    reused: int
    seconds: float


@dataclass(frozen=True)
class DraftProposed:
    """Draft tokens waiting for the target's verdict (the seed's blue tokens)."""

    tokens: tuple[int, ...]
    source: Literal["model", "lookup"] = "model"


@dataclass(frozen=True)
class TokensAccepted:
    """Draft tokens the target accepted (green). `text` is the newly printable text."""

    tokens: tuple[int, ...]
    text: str


TargetKind = Literal["correction", "bonus", "plain"]


@dataclass(frozen=True)
class TargetToken:
    """A token the target chose itself (yellow): a correction after a rejection,
    a bonus after a fully accepted draft, or a plain step without a draft."""

    token: int
    text: str
    kind: TargetKind


@dataclass(frozen=True)
class RoundVerified:
    """One round's verdict, after its TokensAccepted/TargetToken: what live views and
    traces need to show rejected drafts too. `p`/`q` are p_i(d_i) and q_i(d_i) for each
    draft token (greedy: one-hot); p is None after the first rejection, where the
    target's row is never read. `emitted` is less than accepted + 1 when an
    end-of-generation token ended the round early."""

    drafted: tuple[int, ...]
    accepted: int
    token: int
    kind: Literal["correction", "bonus", "plain"]
    emitted: int
    p: tuple[float | None, ...]
    q: tuple[float, ...]
    source: Literal["model", "lookup"]
    draft_s: float  # inside the draft model's decode calls this round
    target_s: float  # inside the target's decode call this round
    seconds: float  # wall time of the round
    origin: str = ""  # where a lookup draft's text was seen (suffixcache.ORIGINS)


@dataclass(frozen=True)
class TextFlushed:
    """Text held back until the end (a possible stop-string prefix, a partial character)."""

    text: str


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


Event = (
    PromptEvaluated | DraftProposed | TokensAccepted | TargetToken | RoundVerified | TextFlushed
    | Finished
)
