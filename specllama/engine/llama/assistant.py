"""A Gemma 4 assistant as the draft model: a small file that reads the target's KV cache.

Gemma 4 ships "assistant" drafters (llama.cpp's `gemma4-assistant` architecture): a few
layers that keep no cache of their own. Each draft step decodes one token at the first
position the target has not decoded, p, beside a hidden state, and attends to the
target's cache: its global layers to the target's last layer, its sliding ones to the one
before (llama.cpp mirrors those cells: the assistant's context is made with `ctx_other`
set to the target's). As `common_speculative_impl_draft_mtp` in llama.cpp's
common/speculative.cpp drives it:

- the first step decodes x_p, the text's last token, with h_{p-1}, the target's hidden
  state one position back (kept as it decodes: mtp.py's `HiddenStates`);
- each further step decodes the token just drawn, at the same position p, with the
  hidden state the step before returned.

So it has no state to cut back: its `cached` says which text its drafts continue, and a
decode of tokens the target holds costs nothing. It drafts only while the target's cache
holds the text before p: never ahead while the target verifies (`--draft-threads`), and
for one sequence (not `serve --parallel`). Its rows at earlier positions are not its
predictions there, so the shadow acceptance is off for it (decoder.py).
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ContextOverflowError, DecodeError, ModelLoadError
from . import backend
from .gguf import check_gguf_file
from .heads import Head
from .model import Model
from .mtp import HiddenStates, lcx
from .views import DraftTraits, KVState, LogitsWanted

ARCH = "gemma4-assistant"
#: What the assistant's layers must share with the target's to read its cache.
_SHAPE_KEYS = ("attention.head_count_kv", "attention.key_length", "attention.key_length_swa")


class AssistantDraft(Head):
    """A Gemma 4 assistant drafting for `target` from the target's own KV cache."""

    traits = DraftTraits(
        ARCH, "a Gemma 4 assistant", ahead=False, shadow=False, own_cache=False,
        parallel=False, because="it reads the target's cache as the target writes it")

    def __init__(self, path: str | Path, target: Model) -> None:
        backend.init()
        path = self.path = check_gguf_file(Path(path), what="draft")
        self._model = None
        if lcx is None:  # pragma: no cover - an older llama-cpp-python
            raise ModelLoadError(f"{path.name}: this llama-cpp-python cannot run Gemma 4 "
                                 "assistants (0.3.36 or later can)")
        self._load_over(path, target, lambda model: self._check_fits(target))
        self.target = target
        self.hidden = HiddenStates(target)
        lcx.llama_set_embeddings_nextn(self.shared.ctx, True, True)
        self._embd = np.zeros((1, self.n_embd), dtype=np.float32)
        self.shared.batch.embd = self._embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._own: np.ndarray | None = None  # the hidden state its last step returned
        self._rows: dict[int, np.ndarray] = {}  # logits of its last decode, by row

    def _check_fits(self, target: Model) -> None:
        """llama.cpp aborts the process on an assistant whose shapes do not match its
        target's, so they are compared here first."""
        arch = target.meta("general.architecture")
        if arch != "gemma4":
            raise ModelLoadError(f"{self.path.name} is a Gemma 4 assistant; the target "
                                 f"{target.path.name} is {arch or 'not a Gemma 4 model'}")
        if self.n_embd != target.n_embd:
            raise ModelLoadError(f"{self.path.name} drafts for a model of hidden size "
                                 f"{self.n_embd}; {target.path.name} has {target.n_embd}")
        for key in _SHAPE_KEYS:
            ours, theirs = self.meta(f"{ARCH}.{key}"), target.meta(f"gemma4.{key}")
            if ours != theirs:
                raise ModelLoadError(f"{self.path.name} does not fit {target.path.name}: "
                                     f"{key} {ours} vs {theirs}")

    @property
    def placement(self) -> str:
        return f"Gemma 4 assistant over the target's cache, {self.target.placement}"

    def close(self) -> None:
        if self.shared.batch is not None:
            self.shared.batch.embd = None  # ours (numpy), not llama_batch_init's
        super().close()

    # ---------------------------------------------------------------- decoding
    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        """Take `tokens` after `cached`: those the target holds cost nothing; each one
        from the target's first undecoded position on is a draft step there."""
        if not tokens:
            return
        start = len(self.cached)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"context window full: {start} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        self.cached.extend(tokens)
        self._rows.clear()
        if logits == "none":
            return
        at = len(self.target.cached)  # every step reads the target's cache up to here
        wanted = range(len(tokens)) if logits == "all" else [len(tokens) - 1]
        # A row asked for where the target has decoded (a cost measurement) is a step
        # too: a valid q, though not a prediction of the text there.
        first = min(max(0, at - start), wanted[0])
        for i, token in enumerate(tokens[first:], first):
            h = self.hidden.at(at - 1, self.cached) if start + i == at else self._own
            self._step(token, at, h)
            if i in wanted:
                self._rows[i] = self.shared.logits(0).copy()

    def _step(self, token: int, at: int, h: np.ndarray | None) -> None:
        batch = self.shared.batch
        batch.n_tokens = 1
        batch.token[0] = token
        batch.pos[0] = at
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = True
        self._embd[0] = 0.0 if h is None else h
        t0 = time.perf_counter()
        with backend.local_watch():
            rc = self.submit(batch)
        self.decode_s += time.perf_counter() - t0
        self.decode_calls += 1
        if rc != 0:
            raise DecodeError(f"{self.path.name}: llama_decode failed with code {rc} on a "
                              "draft step (SPECLLAMA_DEBUG=1 shows llama.cpp's log)")
        self.tokens_evaluated += 1
        row = lcx.llama_get_embeddings_nextn_ith(self.shared.ctx, 0)
        self._own = np.ctypeslib.as_array(row, shape=(self.n_embd,)).copy()

    def logits_row(self, i: int) -> np.ndarray:
        rows = self._rows
        return rows[max(rows) if i == -1 else i]

    # ---------------------------------------------------------------- no state of its own
    def pos_max(self) -> int:
        return len(self.cached) - 1

    def _cut_memory(self, n: int, length: int) -> int:
        return n

    def clear(self) -> None:
        self.cached.clear()

    def save_state(self) -> KVState:
        return KVState(tuple(self.cached), b"")

    def restore(self, state: KVState) -> None:
        self.cached[:] = state.tokens

    def settle(self) -> None:
        """Nothing is ever owed."""

    def checkpoint(self, next_batch: int | None = None) -> None:
        """Nothing to keep: a cut back only shortens `cached`."""

    def warm_batch_sizes(self, sizes: Any) -> int:
        return 0
