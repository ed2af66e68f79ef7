"""What the engine reports while it generates: small frozen dataclasses.

Renderers (CLI, REPL, bench) consume these; the engine never prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..drafting.base import NO_WORK, ModelWork, Origin, Source
from .stats import Stats
from .textstream import Stop

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
    stop_string: str | None = None  # the stop string that ended the text (reason "stop")
    stopped_by: Stop | None = None  # whichever stop ended it: a string, or a rule


@dataclass(frozen=True)
class PromptEvaluated:
    """The prompt is in both KV caches; `reused` tokens came from an earlier call."""

    n_tokens: int
    reused: int
    seconds: float


@dataclass(frozen=True)
class PromptProgress:
    """`done` tokens of a long prompt are in the target's cache, of `n_tokens` (sent
    between its steps only: a prompt of one step goes in without one)."""

    done: int
    n_tokens: int


@dataclass(frozen=True)
class DraftProposed:
    """Draft tokens waiting for the target's verdict (the seed's blue tokens)."""

    tokens: tuple[int, ...]
    source: Source = "model"
    #: Where each token came from (a view colours a prediction's drafts apart).
    origins: tuple[Origin, ...] = ()


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
    """One round, the one record of it: what live views and traces show (rejected drafts
    too), what `Stats` counts and what the draft-length policy learns from.

    `drafted` are the tokens verified after `last`, forced ones first, each with its
    origin; `accepted` of them were accepted (forced ones included). `p`/`q` are
    p_i(d_i) and q_i(d_i) for each (greedy: one-hot); p is None after the first
    rejection, where the target's row is never read. `emitted` is less than accepted + 1
    when an end of generation, max_tokens or a stop string ended the round early."""

    drafted: tuple[int, ...]
    origins: tuple[Origin, ...]
    accepted: int
    token: int
    kind: TargetKind
    emitted: int
    p: tuple[float | None, ...]
    q: tuple[float, ...]
    source: Source
    draft_s: float  # inside the draft model's decode calls this round
    target_s: float  # inside the target's decode call this round
    seconds: float  # wall time of the round
    #: the drafter's confidence at each token after the forced ones (empty: not read)
    confidences: tuple[float, ...] = ()
    work: ModelWork = NO_WORK  # what the draft model did
    #: committed tokens the draft model's cache lacks after this round, beyond the newest
    behind: int = 0
    forced: int = 0  # leading drafts a constraint forced (no source drafted them)
    #: tokens of other requests verified in the same target batch (`serve --parallel`),
    #: and how many requests they were
    others: int = 0
    companions: int = 0

    @property
    def k(self) -> int:
        """Tokens drafted by a source (0: a plain target step, but for forced ones)."""
        return len(self.drafted) - self.forced

    @property
    def m(self) -> int:
        """Of those k, the ones accepted."""
        return max(0, self.accepted - self.forced)

    @property
    def own_s(self) -> float:
        """The round's time outside llama.cpp's decodes."""
        return self.seconds - self.target_s - self.draft_s

    @property
    def origin(self) -> str:
        """Where a lookup draft's text was seen ("" for a model's draft)."""
        if self.source != "lookup" or self.k == 0:
            return ""
        return self.origins[self.forced]

    def record(self, n: int, drafted_text: list[str], token_text: str | None
               ) -> dict[str, object]:
        """Round `n` as a trace keeps it (JSON): the `specllama-trace/1` format that
        `--trace` writes and the serve page downloads."""
        return {"round": n, "source": self.source, "origin": self.origin,
                "origins": list(self.origins), "drafted": list(self.drafted),
                "drafted_text": drafted_text, "accepted": self.accepted,
                "token": self.token, "token_text": token_text, "kind": self.kind,
                "emitted": self.emitted, "p": list(self.p), "q": list(self.q),
                "draft_s": self.draft_s, "target_s": self.target_s, "seconds": self.seconds}


@dataclass(frozen=True)
class TextFlushed:
    """Text held back until the end (a possible stop-string prefix, a partial character)."""

    text: str


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


Event = (
    PromptProgress | PromptEvaluated | DraftProposed | TokensAccepted | TargetToken
    | RoundVerified | TextFlushed | Finished
)
