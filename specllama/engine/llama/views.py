"""What the round loop and the drafters see of a model: the rows a decode reads
(`LogitsWanted`), a draft model and one sequence of a loaded model as protocols
(`DraftModel`, `ModelView`), and a KV cache copied out (`KVState`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from .context import Context
from .rewind import Rewinder

LogitsWanted = Literal["none", "last", "all"]


class DraftModel(Protocol):
    """A draft model as the round loop drives it, in target ids: a `Model` of the
    target's family, or a cross-vocabulary view (engine/crossvocab.py)."""

    path: Path
    cached: list[int]
    #: "mtp" where the draft is the target's own MTP layers (mtp.py)
    drafts_as: str

    @property
    def decode_s(self) -> float: ...
    @property
    def tokens_evaluated(self) -> int: ...
    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None: ...
    def logits_row(self, i: int) -> np.ndarray: ...
    def sync_to(self, tokens: list[int]) -> int: ...
    def truncate(self, n: int) -> None: ...
    def checkpoint(self, next_batch: int | None = None) -> None: ...
    def clear(self) -> None: ...
    def pos_max(self) -> int: ...
    def can_draft(self) -> bool: ...
    def set_threads(self, n_threads: int) -> None: ...
    @property
    def n_threads(self) -> int: ...


class ModelView(DraftModel, Protocol):
    """One sequence of a loaded model as the round loop and the drafters drive it: a
    whole `Model` (sequence 0), a `SeqView` (sequence s of a context shared under
    --parallel: batched.py) or an `MtpDraft` (the target's MTP layers: mtp.py). Each
    holds its own sequence's state; what the views of a context share is `shared`."""

    shared: Context
    seq: int
    rewinder: Rewinder
    n_batch: int  # the most tokens one of its llama_decode calls takes
    prompt_step: int  # the round loop's steps through a prompt
    others: int  # tokens of other sequences in its last decode

    @property
    def companions(self) -> int: ...
    @property
    def placement(self) -> str: ...
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class KVState:
    """One model's KV cache as bytes, and the tokens it holds (position = index)."""

    tokens: tuple[int, ...]
    data: bytes
