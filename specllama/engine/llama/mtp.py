"""A target's own MTP ("nextn") layers as its draft model: no second file.

Qwen3.5, GLM, DeepSeek and MiMo ship a block trained to predict the token after next from
the target's last hidden state. llama.cpp runs it in a context of its own over the same
weights (`LLAMA_CONTEXT_TYPE_MTP`), as `common_speculative_impl_draft_mtp` in its
common/speculative.cpp does:

- the target keeps, for every token it decodes, its hidden state before the output norm
  (`llama_set_embeddings_nextn(ctx, True, masked=False)`);
- the MTP context decodes token x_p at position p together with h_{p-1}, the target's
  hidden state one position back, and its logits there predict x_{p+1};
- a chained draft step has no target state yet: it feeds the MTP block's own state from
  the row before.

Here that context is a `Model` over the target's weights, so the round loop drives it as
any draft model: `ModelDrafter` samples each draft from its q and the acceptance rule
stays exact at every temperature. Positions it decoded with its own state are drafts: once
the target has verified them, they are decoded again with the target's state (`sync_to`
keeps only what was decoded from the target), which is what llama.cpp does too.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from . import backend
from .backend import lc
from .context import Context
from .model import Model
from .rewind import Rewinder
from .views import DraftTraits, LogitsWanted

lcx: Any
try:  # the nextn calls live in llama-cpp-python's C++ extension bindings (0.3.36 on)
    from llama_cpp import llama_cpp_ext as lcx
except ImportError:  # pragma: no cover - an older llama-cpp-python
    lcx = None


def has_mtp(model: Model) -> bool:
    """Whether the target's file has MTP layers this llama.cpp can draft with."""
    return model.n_nextn > 0 and lcx is not None


class HiddenStates:
    """The target's hidden state at each position it decoded, kept as it decodes."""

    def __init__(self, target: Model) -> None:
        self.target = target
        self.rows = np.zeros((target.n_ctx, target.n_embd), dtype=np.float32)
        lcx.llama_set_embeddings_nextn(target.shared.ctx, True, False)
        target.on_decoded = self._keep

    def _keep(self, start: int, n: int) -> None:
        t = self.target
        first = t.batch_row(0)  # unmasked rows lie densely by batch position
        rows = np.ctypeslib.as_array(lcx.llama_get_embeddings_nextn(t.shared.ctx),
                                     shape=(first + n, t.n_embd))
        self.rows[start:start + n] = rows[first:]

    def at(self, pos: int, tokens: list[int]) -> np.ndarray | None:
        """h at `pos` if the target decoded there the token `tokens` has there."""
        t = self.target.cached
        if 0 <= pos < len(t) and pos < len(tokens) and t[pos] == tokens[pos]:
            return self.rows[pos]
        return None


class MtpDraft(Model):
    """The MTP context over a target's weights, drafting in the target's ids."""

    traits = DraftTraits("mtp", "the target's MTP layers", drafts_as="mtp")

    def __init__(self, target: Model,
                 runner: Callable[[Callable[[], int]], int] | None = None) -> None:
        """runner: where its decodes run (`serve --parallel`: the batcher's thread, so
        they take turns with the target's batches rather than contend for the cores)."""
        if not has_mtp(target):
            raise ModelLoadError(f"{target.path.name} has no MTP (nextn) layers to draft "
                                 "with; give a draft model, or draft by lookup")
        self.target = target
        self.runner = runner
        self.hidden = HiddenStates(target)
        ctx = self._mtp_context(target)
        self._adopt(target.shared.model)  # the vocabulary: the target's weights'
        shared = Context(target.shared.model, ctx, path=target.path, n_ctx=target.n_ctx,
                         n_batch=target.n_batch, n_seq=1, n_threads=target.n_threads,
                         n_vocab=target.n_vocab, rpc=target.rpc)
        self._view(shared, 0, Rewinder(shared.mem, 0, -1, "trim", 0))
        lcx.llama_set_embeddings_nextn(ctx, True, True)
        self._embd = np.zeros((self.n_batch, self.n_embd), dtype=np.float32)
        shared.batch.embd = self._embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._own: dict[int, np.ndarray] = {}  # its own h at the rows of its last decode
        self._from_target: list[bool] = []  # per position: decoded with the target's h

    def _mtp_context(self, target: Model) -> Any:
        cparams = lc.llama_context_default_params()
        cparams.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = cparams.n_ubatch = target.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = target.n_threads
        ctx = lc.llama_init_from_model(target.shared.model, cparams)
        if not ctx:
            raise ModelLoadError(f"{target.path.name}: could not create its MTP context "
                                 f"({backend.last_log_error()})")
        return ctx

    def close(self) -> None:
        """The weights are the target's: only the context and the batch go."""
        if self.shared.batch is not None:
            self.shared.batch.embd = None  # ours (numpy), not llama_batch_init's
        self.shared.close()

    def submit(self, batch: Any) -> int:
        ctx = self.shared.ctx
        if self.runner is None:
            return int(lc.llama_decode(ctx, batch))
        return self.runner(lambda: int(lc.llama_decode(ctx, batch)))

    def fill(self, batch: Any, at: int, tokens: list[int], start: int,
             logits: LogitsWanted) -> None:
        """Tokens as any model's, and beside each the state one position back: the
        target's where it decoded that text, else this block's own (a draft step)."""
        super().fill(batch, at, tokens, start, logits)
        del self._from_target[start:]
        for i in range(len(tokens)):
            pos = start + i
            h = self.hidden.at(pos - 1, self.cached) if pos > 0 else None
            self._from_target.append(h is not None or pos == 0)
            if h is None:
                h = self._own.get(pos - 1)
            self._embd[at + i] = 0.0 if h is None else h

    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        start = len(self.cached)
        super().decode(tokens, logits)
        rows = range(len(tokens)) if logits == "all" else [len(tokens) - 1] \
            if logits == "last" else []
        self._own.clear()
        for i in rows:  # its own state where it read logits: what a chained step feeds
            ptr = lcx.llama_get_embeddings_nextn_ith(self.shared.ctx, i)
            self._own[start + i] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def sync_to(self, tokens: list[int]) -> int:
        """Keep only what was decoded from the target's states: the draft steps after
        it are decoded again, with the target's, once it has verified them."""
        firm = next((i for i, ok in enumerate(self._from_target) if not ok),
                    len(self._from_target))
        return super().sync_to(list(tokens[:firm]))

    @property
    def placement(self) -> str:
        """Where it runs, told apart from the file as a whole model (auto's cost cache
        keys on it: the MTP step is not the model's step)."""
        return f"MTP layers, {self.target.placement}"
