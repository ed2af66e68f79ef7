"""Repetition penalties, pure numpy: llama.cpp's repeat_penalty and OpenAI's presence and
frequency penalties, applied to a row of logits before temperature and the filters.

The definition is llama.cpp's (`llama_sampler_penalties_apply`, src/llama-sampler.cpp):
for each token id that occurs c > 0 times in the window,

    logit = logit * repeat if logit <= 0 else logit / repeat
    logit -= c * frequency + presence

and nothing else changes. The window is the last `last_n` tokens of the text the row
follows: the prompt and the output so far (llama-server feeds every prompt token to its
sampler before generating, `init_sampler`; so do we), and under speculation the drafts
before the row as well (docs/architecture.md, "Repetition penalties"). -1: the whole
text; 0: none, the penalties off.

A row the penalties leave alone is never copied: `SamplingParams.penalties` is None then,
and the round loop checks that once per row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParameterError

#: OpenAI's range for presence_penalty and frequency_penalty.
OPENAI_RANGE = (-2.0, 2.0)


@dataclass(frozen=True)
class Penalties:
    """How a token's earlier occurrences lower its logit. The defaults are llama.cpp's:
    off, with a window of 64 tokens ready for when a penalty is set."""

    repeat: float = 1.0  # > 0; 1 = off
    last_n: int = 64  # tokens looked back on; -1 = the whole text, 0 = off
    presence: float = 0.0  # subtracted once from each token in the window
    frequency: float = 0.0  # subtracted once per occurrence in the window

    def __post_init__(self) -> None:
        validate_penalties(self)

    @property
    def active(self) -> bool:
        """Whether any row changes (llama.cpp's `is_disabled`, negated)."""
        return self.last_n != 0 and (self.repeat != 1.0 or self.presence != 0.0
                                     or self.frequency != 0.0)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def validate_penalties(p: Penalties) -> None:
    """Raise InvalidParameterError naming the first out-of-range value (by the settings'
    names: repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty)."""
    if not _is_number(p.repeat) or p.repeat <= 0:
        raise InvalidParameterError(
            f"repeat_penalty must be a number > 0 (1 = off), got {p.repeat!r}")
    if not isinstance(p.last_n, int) or isinstance(p.last_n, bool) or p.last_n < -1:
        raise InvalidParameterError(
            "repeat_last_n must be an integer >= -1 (-1 = the whole text, 0 = off), "
            f"got {p.last_n!r}")
    lo, hi = OPENAI_RANGE
    for name, value in (("presence_penalty", p.presence), ("frequency_penalty", p.frequency)):
        if not _is_number(value) or not lo <= value <= hi:
            raise InvalidParameterError(f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")


def penalty_window(history: Sequence[int], last_n: int,
                   more: Sequence[int] = ()) -> list[int]:
    """The last `last_n` tokens of `history` followed by `more` (all of them for -1, none
    for 0): the window of the row that follows them. Only the tail is read, so a long
    history costs nothing for a short window."""
    if last_n == 0:
        return []
    if last_n < 0:
        return [*history, *more]
    tail = list(more[-last_n:])
    need = last_n - len(tail)
    return [*history[-need:], *tail] if need > 0 else tail


def counted(tokens: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids of `tokens` and how often each occurs: one sort of the window
    (np.unique's own work, without its overhead: a 2,000-token window in ~90 us where
    np.unique takes ~125 and a Counter ~290)."""
    ids = np.sort(np.asarray(tokens, dtype=np.int64))
    if ids.shape[0] == 0:
        return ids, ids
    starts = np.empty(ids.shape[0], dtype=bool)
    starts[0] = True
    np.not_equal(ids[1:], ids[:-1], out=starts[1:])
    first = np.flatnonzero(starts)
    return ids[first], np.diff(first, append=ids.shape[0])


#: Where a repeat penalty under 1 leaves the largest logits: the sampler scales rows by up
#: to 1/T = 1e4 with no overflow check, so (logit - max) / T stays finite from here.
LOGIT_CAP = 1e34


def penalized(logits: np.ndarray, window_tokens: Sequence[int] | np.ndarray,
              penalties: Penalties) -> np.ndarray:
    """A new row: `logits` with llama.cpp's penalties for the tokens of `window_tokens`
    (the row itself is never written: it may be a view of llama.cpp's buffer). Only the
    ids present in the window are touched; ids past the row's end (a draft model with a
    shorter vocabulary) are skipped. -inf (a token a constraint forbids) stays -inf."""
    out = np.array(logits)
    ids, counts = counted(window_tokens)
    if ids.shape[0] and ids[-1] >= out.shape[0]:  # ids are sorted
        inside = ids < out.shape[0]
        ids, counts = ids[inside], counts[inside]
    if ids.shape[0] == 0:
        return out
    x = out[ids]
    if penalties.repeat >= 1.0:
        if penalties.repeat != 1.0:
            x = np.where(x <= 0, x * penalties.repeat, x / penalties.repeat).astype(out.dtype)
    else:
        # A penalty under ~1e-38 carries a logit past float32 (+inf, then inf - inf is NaN
        # in every sampled row: a 500), and one under ~1e-45 is 0 in float32 (-inf * 0 is
        # NaN). So float64, and a cap for those past it: a tie among them, the limit of
        # ever smaller penalties; -inf stays -inf.
        with np.errstate(over="ignore", divide="ignore"):
            x64 = x.astype(np.float64)
            x64 = np.where(x64 <= 0, x64 * penalties.repeat, x64 / penalties.repeat)
        x = np.minimum(x64, LOGIT_CAP).astype(out.dtype)
    x -= (counts * penalties.frequency + penalties.presence).astype(out.dtype)
    out[ids] = x
    return out


def penalized_after(logits: np.ndarray, history: Sequence[int], penalties: Penalties,
                    more: Sequence[int] = ()) -> np.ndarray:
    """`logits` penalized for the window of the row that follows `history` then `more`
    (the committed text, then the drafts before the row)."""
    return penalized(logits, penalty_window(history, penalties.last_n, more), penalties)
