"""An EAGLE3 head as the draft model: one decoder layer over three of the target's layers.

EAGLE3 (Li et al. 2025) drafts from what the target computed, not from text alone. For each
position P the target decodes, three of its layers' inputs (low, middle, high: the file's
`eagle3.target_layers`) are concatenated and fused by the head's `fc` into g_P, the width
of its one decoder layer (llama.cpp's encoder pass over `eagle3` files). As
`common_speculative_impl_draft_eagle3` in llama.cpp's common/speculative.cpp drives it:

- the head's KV cache at position P holds the pair (x_{P+1}, g_P): the *next* token's
  embedding beside the target's fused state here, and its logits there predict x_{P+2};
- a chained draft step has no target state yet: it feeds the head's own pre-norm output
  from the step before in g's place.

So with `cached` = x_0..x_n (what its drafts continue, as for any draft model), token x_p
sits at KV position p - 1 (x_0 needs none), decoded beside g_{p-1}: the target's where the
target decoded x_{p-1} there, else the head's own from its row at p - 2. As for MTP layers
(mtp.py), positions decoded with its own state are drafts: once the target has verified
them they are decoded again with the target's (`sync_to` keeps only those).

Its output head covers a smaller vocabulary (32k of Llama 3's 128k), mapped to target ids
by the file's `d2t`; llama.cpp writes its logits into the target's vocabulary and -inf
everywhere else, so q is zero outside it and the round loop samples a target id as from
any draft. Exactness needs nothing more: p/q acceptance only asks that each draft token be
really drawn from q, and a token q cannot draw is one the residual max(0, p - q) = p keeps
whole (docs/architecture.md, "Drafts over a subset of the vocabulary").

llama-cpp-python 0.3.36 binds neither `llama_model_target_layer_ids` nor
`llama_set_embeddings_layer_inp`; libllama exports them under their C++ names, bound here
as its `llama_cpp_ext` binds the MTP calls.
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from . import backend
from .backend import lc
from .gguf import check_gguf_file
from .heads import Head
from .model import Model
from .mtp import lcx
from .views import DraftTraits, KVState, LogitsWanted

ARCH = "eagle3"


def _bind(names: Sequence[str], argtypes: list[Any], restype: Any) -> Any:
    """A libllama function by the first of its exported names (None: this build lacks it)."""
    lib = getattr(lcx, "_lib", None)  # (llama_cpp_ext binds the same library)
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    return None


_ctx, _model = ctypes.c_void_p, ctypes.c_void_p
_layer_ids = _bind(("llama_model_target_layer_ids",
                    "_Z28llama_model_target_layer_idsPK11llama_model"),
                   [_model], ctypes.POINTER(ctypes.c_int32))
_layer_ids_n = _bind(("llama_model_target_layer_ids_n",
                      "_Z30llama_model_target_layer_ids_nPK11llama_model"), [_model],
                     ctypes.c_uint32)
_set_layer_inp = _bind(("llama_set_embeddings_layer_inp",
                        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
                       [_ctx, ctypes.c_uint32, ctypes.c_bool], None)
_get_layer_inp = _bind(("llama_get_embeddings_layer_inp",
                        "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
                       [_ctx, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float))


def available() -> bool:
    """Whether this llama.cpp build can run EAGLE3 heads."""
    return None not in (_layer_ids, _layer_ids_n, _set_layer_inp, _get_layer_inp) \
        and lcx is not None


class FusedStates:
    """g_P for every position P the target decoded: its three layers' inputs there, fused
    by the head's `fc` (one encoder pass per target decode, kept as it decodes)."""

    def __init__(self, target: Model, head: Eagle3Draft, layers: list[int]) -> None:
        self.target, self.head, self.layers = target, head, layers
        self.rows = np.zeros((target.n_ctx, head.n_embd), dtype=np.float32)
        n_layer = int(lc.llama_model_n_layer(target.shared.model))
        for lid in layers:  # the final layer's "input" is the state before the output norm
            if lid < n_layer:
                _set_layer_inp(target.shared.ctx, lid, True)
            else:
                lcx.llama_set_embeddings_nextn(target.shared.ctx, True, False)
        self._n_layer = n_layer
        width = len(layers) * target.n_embd
        self._features = np.zeros((head.n_batch, width), dtype=np.float32)
        self._batch = lc.llama_batch_init(head.n_batch, width, 1)
        target.on_decoded = self._keep

    def close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self.target.on_decoded == self._keep:
            self.target.on_decoded = None

    def _keep(self, start: int, n: int) -> None:
        t, d = self.target, self.target.n_embd
        for i in range(0, n, self.head.n_batch):
            m = min(self.head.n_batch, n - i)
            for k, lid in enumerate(self.layers):
                ptr = _get_layer_inp(t.shared.ctx, lid) if lid < self._n_layer else \
                    lcx.llama_get_embeddings_nextn(t.shared.ctx)
                rows = np.ctypeslib.as_array(ptr, shape=(t.batch_row(0) + n, d))
                self._features[:m, k * d:(k + 1) * d] = rows[t.batch_row(0) + i:][:m]
            self.rows[start + i:start + i + m] = self.head.encode(self._features[:m],
                                                                   self._batch)

    def at(self, pos: int, tokens: list[int]) -> np.ndarray | None:
        """g at `pos` if the target decoded there the token `tokens` has there."""
        t = self.target.cached
        if 0 <= pos < len(t) and pos < len(tokens) and t[pos] == tokens[pos]:
            return self.rows[pos]
        return None


class Eagle3Draft(Head):
    """An EAGLE3 head drafting for `target` from the target's fused hidden states."""

    # Its fused states come from the target's decodes, and its encoder runs on its own
    # context as the target decodes: not beside the target (ahead), nor for other slots.
    traits = DraftTraits(
        ARCH, "an EAGLE3 head", ahead=False, shadow=False, parallel=False,
        vocabulary="subset", because="it fuses the states of one target context as the "
        "target decodes them")

    def __init__(self, path: str | Path, target: Model) -> None:
        backend.init()
        path = self.path = check_gguf_file(Path(path), what="draft")
        self._model = None
        if not available():  # pragma: no cover - an older llama-cpp-python
            raise ModelLoadError(f"{path.name}: this llama-cpp-python cannot run EAGLE3 "
                                 "heads (0.3.36 or later can)")
        layers = self._load_over(path, target, lambda model: self._check_fits(model, target))
        self.target = target
        lcx.llama_set_embeddings_nextn(self.shared.ctx, True, True)  # its g and pre-norm rows
        self._embd = np.zeros((self.n_batch, self.n_embd), dtype=np.float32)
        self.shared.batch.embd = self._embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.fused = FusedStates(target, self, layers)
        self._own: dict[int, np.ndarray] = {}  # its pre-norm output at the rows it read
        self._from_target: list[bool] = []  # per token of `cached`: decoded with the target's g
        self._lead = self._rows = 0  # the last decode: x_0 (no row of its own), others

    def _check_fits(self, model: Any, target: Model) -> list[int]:
        """The head's three layers and widths against the target's: llama.cpp aborts the
        process on a layer the target does not have."""
        n = int(_layer_ids_n(model))
        ids = _layer_ids(model)
        layers = [int(ids[i]) for i in range(n)]
        n_layer = int(lc.llama_model_n_layer(target.shared.model))
        hidden = self.meta(f"{ARCH}.target_hidden_size")
        if hidden is not None and int(hidden) != target.n_embd:
            raise ModelLoadError(f"{self.path.name} drafts for a model of hidden size "
                                 f"{hidden}; {target.path.name} has {target.n_embd}")
        if n != 3 or not all(0 <= lid <= n_layer for lid in layers):
            raise ModelLoadError(f"{self.path.name} fuses layers {layers} of its target; "
                                 f"{target.path.name} has {n_layer}")
        return layers

    @property
    def placement(self) -> str:
        return f"EAGLE3 head over the target's states, {self.target.placement}"

    def close(self) -> None:
        if self.shared.batch is not None:
            self.shared.batch.embd = None  # ours (numpy), not llama_batch_init's
        self.fused.close()
        super().close()

    # ---------------------------------------------------------------- the encoder
    def encode(self, features: np.ndarray, batch: Any) -> np.ndarray:
        """g rows for rows of target features: the head's `fc` (llama.cpp's encoder
        pass over the file, so a quantized `fc` reads as llama.cpp reads it)."""
        n = len(features)
        ctypes.memmove(batch.embd, features.ctypes.data, features.nbytes)
        batch.n_tokens = n
        # The encoder reads no positions, but llama.cpp wants them to follow the cache's.
        after = int(lc.llama_memory_seq_pos_max(self.shared.mem, 0)) + 1
        for i in range(n):
            batch.pos[i] = after + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        t0 = time.perf_counter()
        with backend.local_watch():
            rc = int(lc.llama_encode(self.shared.ctx, batch))
        self.decode_s += time.perf_counter() - t0
        if rc != 0:
            raise ModelLoadError(f"{self.path.name}: its encoder failed with code {rc} "
                                 "(SPECLLAMA_DEBUG=1 shows llama.cpp's log)")
        rows = np.ctypeslib.as_array(lcx.llama_get_embeddings_nextn(self.shared.ctx),
                                     shape=(n, self.n_embd))
        return rows.copy()

    # ---------------------------------------------------------------- decoding
    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        """x_0 has no position of its own: it joins `cached` and its row (asked for
        only of a one-token text) is uniform, a valid q that predicts nothing.

        llama.cpp's EAGLE3 graph computes every row and hands out the first n_outputs
        of them, whichever rows were asked for: so a batch asks for all its rows or for
        its last one alone (a longer text: all but the last first, without rows)."""
        lead = 0
        if tokens and not self.cached:
            self.cached.append(tokens[0])
            self._from_target[:] = [True]
            tokens, lead = tokens[1:], 1
        self._lead, self._rows = lead, len(tokens)
        if not tokens:
            return
        if logits == "none" or len(tokens) == 1 or logits == "all":
            super().decode(tokens, logits)
        elif len(tokens) <= self.n_batch:
            super().decode(tokens, "all")
        else:
            super().decode(tokens[:-1], "none")
            super().decode(tokens[-1:], "last")
        self._lead, self._rows = lead, len(tokens)  # (a long text's chunks came through here)
        if logits == "none":
            return
        self._own.clear()
        first = len(self.cached) - len(tokens)
        rows = range(len(tokens)) if logits == "all" else [len(tokens) - 1]
        for i in rows:  # its own state where it read logits: what a chained step feeds
            ptr = lcx.llama_get_embeddings_nextn_ith(self.shared.ctx,
                                                     i if logits == "all" else -1)
            self._own[first + i] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def logits_row(self, i: int) -> np.ndarray:
        """Row i of the caller's last decode (x_0's: uniform)."""
        if i < 0:
            i += self._lead + self._rows
        if i < self._lead:
            return np.zeros(self.n_vocab, dtype=np.float32)
        j = i - self._lead
        return super().logits_row(-1 if j == self._rows - 1 else j)

    def fill(self, batch: Any, at: int, tokens: list[int], start: int,
             logits: LogitsWanted) -> None:
        """Token x_p at KV position p - 1, beside g_{p-1}: the target's where it decoded
        that text, else the head's own from the row before (a draft step)."""
        super().fill(batch, at, tokens, start, logits)
        del self._from_target[start:]
        for i in range(len(tokens)):
            pos = start + i
            batch.pos[at + i] = pos - 1
            g = self.fused.at(pos - 1, self.cached)
            self._from_target.append(g is not None)
            if g is None:
                g = self._own.get(pos - 1)
            self._embd[at + i] = 0.0 if g is None else g

    def sync_to(self, tokens: list[int]) -> int:
        """Keep only what was decoded from the target's states: the draft steps after
        it are decoded again, with the target's, once it has verified them."""
        firm = next((i for i, ok in enumerate(self._from_target) if not ok),
                    len(self._from_target))
        return super().sync_to(list(tokens[:firm]))

    # ---------------------------------------------------------------- one position behind
    def pos_max(self) -> int:
        """The last token's position in the text (its KV cell is one behind)."""
        held = int(lc.llama_memory_seq_pos_max(self.shared.mem, self.seq))
        return held + 1 if held >= 0 or not self.cached else 0

    def _cut_memory(self, n: int, length: int) -> int:
        del self._from_target[n:]
        if n == 0:
            return self.rewinder.cut(0, length)
        kept = self.rewinder.cut(n - 1, length - 1)  # (the cells of tokens 1..n-1)
        return kept + 1 if kept >= 0 else kept

    def clear(self) -> None:
        super().clear()
        self._from_target.clear()
        self._own.clear()

    def warm_batch_sizes(self, sizes: Any) -> int:
        return 0

    # ---------------------------------------------------------------- the prompt cache
    def save_state(self) -> KVState:
        """Its KV cache, and what a restored target will not recompute: the fused states
        of the positions the target holds, and which of its own were decoded from them
        (server/promptcache.py copies the target's cache at the same moment)."""
        state = super().save_state()
        rows = self.fused.rows[:len(self.target.cached)]
        flags = bytes(self._from_target)
        tail = struct.pack("<QQ", len(rows), len(flags))
        return KVState(state.tokens, state.data + rows.tobytes() + flags + tail)

    def restore(self, state: KVState) -> None:
        n_rows, n_flags = struct.unpack("<QQ", state.data[-16:])
        kv_end = len(state.data) - 16 - n_flags - n_rows * self.n_embd * 4
        super().restore(KVState(state.tokens, state.data[:kv_end]))
        rows = np.frombuffer(state.data, np.float32, n_rows * self.n_embd, kv_end)
        self.fused.rows[:n_rows] = rows.reshape(n_rows, self.n_embd)
        self._from_target[:] = [bool(b) for b in state.data[-16 - n_flags:-16]]
