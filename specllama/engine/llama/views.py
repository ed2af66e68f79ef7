"""What the round loop and the drafters see of a model: the rows a decode reads
(`LogitsWanted`), what a draft model declares of itself (`DraftTraits`), a draft model and
one sequence of a loaded model as protocols (`DraftModel`, `ModelView`), and a KV cache
copied out (`KVState`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from .context import Context
from .rewind import Rewinder

LogitsWanted = Literal["none", "last", "all"]
#: Which vocabulary a draft model drafts in: the target's; a subset of the target's ids
#: (its q is zero outside it: EAGLE3's `d2t`); or its own tokenizer's, mapped to target ids
#: through the tokens both spell alike (drafting/crossvocab.py).
Vocab = Literal["target", "subset", "mapped"]


@dataclass(frozen=True)
class DraftTraits:
    """What the rest of the code needs to know about a kind of draft model, declared by
    the kind itself (drafting/kinds.py lists the kinds), so nothing asks for its class."""

    kind: str  # the registry's name for it: "model", "mtp", "gemma4-assistant", ...
    title: str  # what it is, in words, for errors: "a Gemma 4 assistant"
    drafts_as: Literal["model", "mtp"] = "model"  # the `--drafters` name that drives it
    ahead: bool = True  # it can draft on idle cores while the target verifies
    shadow: bool = True  # its row at an earlier position predicts that position
    own_cache: bool = True  # it keeps a cache of its own, cut back with the target's
    parallel: bool = True  # it can serve `serve --parallel` slots
    vocabulary: Vocab = "target"
    #: Why it cannot do what it cannot (one clause, for the one-line refusals).
    because: str = ""


class DraftModel(Protocol):
    """A draft model as the round loop drives it, in target ids: a `Model` of the
    target's family, the target's MTP layers, a head over the target's states, or a
    cross-vocabulary view (drafting/kinds.py lists them)."""

    path: Path
    cached: list[int]
    traits: DraftTraits

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
    def close(self) -> None: ...
    def set_prompt(self, prompt: list[int], own: list[int] | None) -> None: ...
    def own_mass(self) -> float: ...
    def vocabulary_note(self) -> str: ...


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
