"""What the views of one llama.cpp context share, held by reference.

A `Model` drives sequence 0 of a context over a GGUF's weights; under `serve --parallel`
a `SeqView` drives each other sequence of the same context (batched.py); a target's MTP
layers draft through a context of their own over the same weights (mtp.py). Each of these
views keeps only its own sequence's state (its cached tokens, its rewinder, its counters)
and reaches the rest through one `Context`: the handles, the reusable batch, the sizes
and the threads, so that what one view changes there every other view sees.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from . import backend
from .backend import lc


class Context:
    """One llama.cpp context of n_seq sequences of n_ctx tokens each, over the weights
    `model`, and its reusable batch of n_batch rows. Closed by the view that made it."""

    def __init__(self, model: Any, ctx: Any, *, path: Path, n_ctx: int, n_batch: int,
                 n_seq: int, n_threads: int, n_vocab: int, rpc: tuple[str, ...] = ()) -> None:
        self.model = model  # the weights' handle (freed by the Model that loaded them)
        self.ctx: Any = ctx
        self.path = path
        self.n_ctx, self.n_batch, self.n_seq = n_ctx, n_batch, n_seq
        self.n_threads = n_threads
        self.rpc = rpc  # HOST:PORT of the RPC servers its layers run on
        self.mem = lc.llama_get_memory(ctx)
        self.batch: Any = lc.llama_batch_init(n_batch, 0, 1)
        self.n_vocab = n_vocab
        self._row_type = ctypes.c_float * n_vocab
        self._address = ctypes.cast(ctx, ctypes.c_void_p).value
        self._fast_logits = backend.logits_address()
        self.warm_sizes: set[int] = set()  # batch sizes rpc.warm_batch_sizes has decoded

    @classmethod
    def create(cls, model: Any, path: Path, *, n_ctx: int, n_batch: int, n_seq: int,
               n_threads: int, n_vocab: int, spares: bool, snapshots: int,
               rpc: tuple[str, ...], reads: Any = None) -> Context:
        """A context of n_seq sequences of n_ctx tokens, batches of n_batch, on the
        loaded weights; spares: a recurrent state's checkpoints (rewind.py) take a spare
        sequence each, and llama.cpp keeps `snapshots` states per token. reads: the
        context whose KV cache this one attends to (a Gemma 4 assistant's target)."""
        cparams = lc.llama_context_default_params()
        if reads is not None:
            cparams.ctx_other = reads
        cparams.n_ctx = n_ctx * n_seq
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq * (2 if spares else 1)
        # One KV buffer for every sequence: a batch of several sequences is then one
        # ubatch (separate buffers split it into equal per-sequence slices), and a
        # checkpoint shares cells rather than copying them.
        cparams.kv_unified = cparams.n_seq_max > 1
        # Recurrent states kept per token for a rollback (llama.cpp grants them to some archs)
        cparams.n_rs_seq = snapshots if spares else 0
        # A sliding-window cache keeps every cell: a rollback past the window then never
        # finds pruned cells missing (llama.cpp's default; stated, as we rely on it).
        cparams.swa_full = True
        cparams.n_threads = cparams.n_threads_batch = n_threads
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelLoadError(f"{path}: could not create a context of {n_ctx} tokens "
                                 f"({backend.last_log_error()})")
        return cls(model, ctx, path=path, n_ctx=int(lc.llama_n_ctx(ctx)) // n_seq,
                   n_batch=n_batch, n_seq=n_seq, n_threads=n_threads, n_vocab=n_vocab, rpc=rpc)

    def submit(self, batch: Any) -> int:
        """llama_decode of a filled batch (waiting for remote devices to finish)."""
        if not self.rpc:
            return int(lc.llama_decode(self.ctx, batch))
        with backend.stall_watch(", ".join(self.rpc)):
            rc = int(lc.llama_decode(self.ctx, batch))
            if rc == 0:
                # Remote devices compute asynchronously: wait here, so decode_s (the
                # stats, auto's costs) holds the real cost rather than the next read.
                lc.llama_synchronize(self.ctx)
        return rc

    def logits(self, row: int) -> np.ndarray:
        """Zero-copy view of the logits of a row of the last batch; valid until the next."""
        if self._fast_logits is not None:
            address = self._fast_logits(self._address, row)
            if not address:
                raise IndexError(f"no logits for row {row} of the last decode")
            found: Any = self._row_type.from_address(address)  # a ctypes array: a buffer
            return np.frombuffer(found, dtype=np.float32)
        ptr = lc.llama_get_logits_ith(self.ctx, row)  # pragma: no cover - no private handle
        if not ptr:
            raise IndexError(f"no logits for row {row} of the last decode")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = max(1, int(n_threads))
        lc.llama_set_n_threads(self.ctx, self.n_threads, self.n_threads)

    def close(self) -> None:
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx is not None:
            lc.llama_free(self.ctx)
            self.ctx = None
