"""Counters and timings of one generation, and the figures derived from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .events import RoundVerified


@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_reused: int = 0
    tokens: int = 0  # generated tokens (what the user got)
    target_steps: int = 0  # target verification passes, plain steps included
    drafted: int = 0
    accepted: int = 0
    # Tokens a constraint forced into drafts (not in drafted/accepted: no source drafted
    # them), and how many of them the target accepted.
    forced: int = 0
    forced_accepted: int = 0
    mask_s: float = 0.0  # time computing a constraint's token masks
    # Lookup drafts by where their text was seen (suffixcache.ORIGINS): tokens drafted
    # and accepted.
    origin_drafted: dict[str, int] = field(default_factory=dict)
    origin_accepted: dict[str, int] = field(default_factory=dict)
    # Of those, tokens spliced into model drafts from earlier replies the text follows.
    spliced: int = 0
    spliced_accepted: int = 0
    # Model drafts drawn ahead, while the target verified the round before, and accepted.
    ahead: int = 0
    ahead_accepted: int = 0
    # At draft position i+1: drafts proposed, reached (every earlier draft accepted),
    # and accepted. accepted_at / reached_at is the conditional acceptance rate there.
    drafted_at: list[int] = field(default_factory=list)
    reached_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    draft_lengths: dict[int, int] = field(default_factory=dict)  # k -> rounds that used it
    prompt_s: float = 0.0  # wall time evaluating the prompt
    generate_s: float = 0.0  # wall time of the generation rounds
    rounds_s: float = 0.0  # of which inside the rounds (the rest: the caller's, printing)
    plain_rounds: int = 0  # rounds without a draft: what the target alone does too,
    plain_own_s: float = 0.0  # and their time outside llama.cpp's decodes
    draft_s: float = 0.0  # inside the draft model's llama_decode during generation
    target_s: float = 0.0  # inside the target's llama_decode during generation
    policy_note: str = ""  # why the draft length was what it was, for the user: one line
    policy_detail: str = ""  # the reasoning behind it (--json, --verbose)
    # The speedup over the target alone that auto's cost model expected of the rounds
    # it chose (None for fixed draft lengths): set beside the measured one, it shows
    # whether the model of this machine holds.
    predicted_speedup: float | None = None
    target_at: str = "local CPU"  # where the target's layers run (Model.placement)
    # How recurrent caches dropped rejected drafts (llama/rewind.py): "" for KV caches.
    rewind: str = ""

    def record(self, r: RoundVerified) -> None:
        """One round: its drafts by source and origin, what it put into the output, and
        its time (outside llama.cpp's decodes too, for rounds without a draft)."""
        k, m, f = r.k, r.m, r.forced
        self.target_steps += 1
        self.rounds_s += r.seconds
        self.forced += f
        self.forced_accepted += min(f, r.accepted)
        if k == 0 and f == 0:
            self.plain_rounds += 1
            self.plain_own_s += r.own_s
        self.draft_lengths[k] = self.draft_lengths.get(k, 0) + 1
        self.drafted += k
        self.accepted += m
        for i, origin in enumerate(r.origins[f:]):
            if origin in ("forced", "model"):
                continue
            took = int(i < m)
            self.origin_drafted[origin] = self.origin_drafted.get(origin, 0) + 1
            self.origin_accepted[origin] = self.origin_accepted.get(origin, 0) + took
            if r.source == "model" and origin != "mtp":  # spliced from earlier replies
                self.spliced += 1
                self.spliced_accepted += took
        if r.work.ahead:
            self.ahead += r.work.ahead
            self.ahead_accepted += min(r.work.ahead, m)
        self.tokens += r.emitted
        self._grow(k)
        for i in range(k):
            self.drafted_at[i] += 1
            if i <= m:
                self.reached_at[i] += 1
            if i < m:
                self.accepted_at[i] += 1

    def _grow(self, k: int) -> None:
        while len(self.drafted_at) < k:
            self.drafted_at.append(0)
            self.reached_at.append(0)
            self.accepted_at.append(0)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.target_steps if self.target_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Generation time spent outside llama.cpp decode calls: our own cost."""
        return max(0.0, self.generate_s - self.draft_s - self.target_s)

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | drafts 1..i-1 accepted): the per-position alpha."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached_at)]

    @property
    def mean_draft_length(self) -> float:
        rounds = sum(self.draft_lengths.values())
        return sum(k * n for k, n in self.draft_lengths.items()) / rounds if rounds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["draft_lengths"] = {str(k): v for k, v in sorted(self.draft_lengths.items())}
        for name in (
            "acceptance_rate",
            "tokens_per_step",
            "tokens_per_s",
            "overhead_s",
            "overhead_share",
            "acceptance_by_position",
            "mean_draft_length",
        ):
            out[name] = getattr(self, name)
        return out

    def merge(self, other: Stats) -> None:
        """Add another generation's counts (session totals in the REPL)."""
        for name in ("prompt_tokens", "prompt_reused", "tokens", "target_steps", "drafted",
                     "accepted", "forced", "forced_accepted", "spliced", "spliced_accepted",
                     "ahead", "ahead_accepted",
                     "mask_s", "prompt_s",
                     "generate_s", "draft_s", "target_s", "rounds_s", "plain_rounds",
                     "plain_own_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.target_at = other.target_at
        self.rewind = other.rewind
        self._grow(len(other.drafted_at))
        for i, (d, r, a) in enumerate(zip(other.drafted_at, other.reached_at, other.accepted_at)):
            self.drafted_at[i] += d
            self.reached_at[i] += r
            self.accepted_at[i] += a
        for k, n in other.draft_lengths.items():
            self.draft_lengths[k] = self.draft_lengths.get(k, 0) + n
        for mine, theirs in ((self.origin_drafted, other.origin_drafted),
                             (self.origin_accepted, other.origin_accepted)):
            for origin, n in theirs.items():
                mine[origin] = mine.get(origin, 0) + n
