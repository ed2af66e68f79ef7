"""One GGUF model through llama.cpp's low-level API (llama-cpp-python's `_internals.py`
in spirit).

A `Model` is one GGUF file with its own context (KV cache) and a reusable batch (a
`Context`: context.py, which its views share). It tracks which tokens its sequence of
the KV cache holds (`cached`), decodes new tokens at the end of that sequence, hands
out logits rows as zero-copy numpy views, and cuts the cache back.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ContextOverflowError, DecodeError, KVCacheError, ModelLoadError
from . import backend
from . import rpc as rpc_net
from .backend import lc  # llama_cpp, imported there with the fix for a broken install
from .context import Context
from .gguf import check_gguf_file
from .rewind import SNAPSHOTS, Rewind, Rewinder, memory_kind
from .views import DraftTraits, KVState, LogitsWanted
from .vocab import Vocabulary

# llama.cpp's CPU threads spin while they wait for each other: faster on an idle machine, ruinous
# when another process takes a core; hence the default thread count of loading.py rather than
# another wait policy (docs/lab/2026-12-local-generation.md, "A busy machine: threads and waiting").

class Model(Vocabulary):
    """One GGUF model with its own KV cache, driven token by token: sequence 0 of the
    context it loads, which its views (a SeqView, an MtpDraft) share by reference."""

    #: As a draft: a second GGUF of the target's family (drafting/kinds.py).
    traits = DraftTraits("model", "a draft model")
    companions = 0  # other requests in progress (a SeqView's: batched.py)

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_batch: int = 512,
        rpc: Sequence[str] = (),
        n_seq: int = 1,
        snapshots: int = SNAPSHOTS,
    ) -> None:
        """rpc: HOST:PORT of RPC servers; the model's layers (and its KV cache) go
        there instead of this machine's CPU. n_seq: sequences the context holds at once,
        each up to n_ctx tokens (`serve --parallel`: batched.py); this object drives
        sequence 0. snapshots: per-token recurrent states llama.cpp keeps (rewind.py;
        0 forces checkpoint copies, for the ablation in bench/hybrid.py)."""
        backend.init()
        path = Path(path)
        self._model = None  # the weights' handle (Vocabulary's); None once freed
        check_gguf_file(path, what="model")
        endpoints = tuple(rpc_net.check_endpoint(e) for e in rpc)
        model = self._load_model(path, endpoints)
        try:
            shared = Context.create(
                model, path, n_ctx=n_ctx, n_batch=max(1, min(n_batch, n_ctx)),
                n_seq=max(1, n_seq), n_threads=n_threads or max(1, os.cpu_count() or 1),
                n_vocab=self.n_vocab, spares=self.memory_kind != "transformer",
                snapshots=snapshots, rpc=endpoints)
        except BaseException:
            Vocabulary.close(self)
            raise
        # How a cut back runs (rewind.py); recurrent checkpoints go to spare sequences n_seq..
        n_rs = int(lc.llama_n_rs_seq(shared.ctx))
        best: Rewind = "trim" if self.memory_kind == "transformer" else \
            "snapshot" if n_rs > 0 else "copy"
        spare = -1 if best == "trim" else shared.n_seq
        self._view(shared, 0, Rewinder(shared.mem, 0, spare, best, n_rs))
        if endpoints:
            rpc_net.keep_alive(list(endpoints))

    def _view(self, shared: Context, seq: int, rewinder: Rewinder) -> None:
        """This object's own state, and nothing else: sequence `seq` of `shared` (held by
        reference), holding no tokens yet. Every view (a Model, a SeqView, an MtpDraft)
        starts here, once it has adopted the weights' vocabulary (`_adopt`)."""
        self.path = shared.path
        self.shared = shared
        self.seq = seq  # the sequence id this object decodes into
        self.rewinder = rewinder
        # Cuts of a long input: decode's own llama_decode calls, and the round loop's steps
        self.n_batch = self.prompt_step = shared.n_batch
        self.cached: list[int] = []  # token ids held by the KV cache, position = index
        #: The last `owed` tokens of `cached` are not in the memory yet: a recurrent state
        #: taken back to a checkpoint decodes them with the next batch (one decode, not two).
        self.owed = 0
        self._skip = 0  # rows of the last decode before the caller's (the owed tokens)
        self.decode_s = 0.0  # wall time inside llama_decode
        self.tokens_evaluated = 0  # every token ever decoded (prefix-reuse tests count these)
        self.decode_calls = 0
        #: called with (start, n) after each decode lands (mtp.py keeps hidden states)
        self.on_decoded: Callable[[int, int], None] | None = None
        self.others = 0  # tokens of other sequences in the last decode (batched.py)

    def _load_model(self, path: Path, rpc: tuple[str, ...]) -> Any:
        """Load the weights (onto the RPC servers when there are any) and adopt them."""
        mparams = lc.llama_model_default_params()
        # MTP layers (about one layer) load always: an MTP context (mtp.py) on a model
        # loaded without them aborts the process.
        mparams.load_mtp = True
        if backend.amx_built_in():
            mparams.use_extra_bufts = False
        if rpc:
            self._devices = backend.rpc_devices(rpc)  # kept alive with the model
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            mparams.n_gpu_layers = -1  # every layer (and the output layer) on them
        model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise ModelLoadError(
                f"{path}: llama.cpp could not load it ({backend.last_log_error()}); "
                "the file may be truncated or of an unsupported architecture"
            )
        self._adopt(model)
        return model

    def _adopt(self, model: Any) -> None:
        """The vocabulary, and what the weights say of themselves."""
        super()._adopt(model)
        self.n_nextn = int(lc.llama_model_n_layer_nextn(model))
        self.n_embd = int(lc.llama_model_n_embd_out(model))
        self.memory_kind = memory_kind(model)
        # A token this model lacks (a pair's vocabularies may differ by up to 128 ids at
        # the end) is read as a stand-in: it costs acceptance, never exactness.
        newline = int(lc.llama_vocab_nl(self._vocab))
        self._stand_in = newline if 0 <= newline < self.n_vocab else 0

    # What every view of the context shares: read there, never copied
    @property
    def n_ctx(self) -> int:
        return self.shared.n_ctx

    @property
    def n_seq(self) -> int:
        return self.shared.n_seq

    @property
    def n_threads(self) -> int:
        return self.shared.n_threads

    @property
    def rpc(self) -> tuple[str, ...]:
        return self.shared.rpc

    def set_threads(self, n_threads: int) -> None:
        """Decode with n_threads from now on (chosen once the load has shown how busy
        the machine is)."""
        self.shared.set_threads(n_threads)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        self.shared.close()
        super().close()

    @property
    def placement(self) -> str:
        """Where the layers run: 'local CPU' or 'rpc HOST:PORT, ...'."""
        return f"rpc {', '.join(self.rpc)}" if self.rpc else "local CPU"

    # --------------------------------------------------------------- decoding
    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        """Append `tokens` to the KV cache; afterwards `logits_row(i)` reads row i of
        this call (i counted within `tokens`; only rows asked for exist)."""
        if not tokens:
            return
        skip = 0
        if self.owed:
            if logits == "all" and self.owed + len(tokens) > self.n_batch:
                self.settle()
            else:
                tokens, skip = self._owed_first(tokens)
        start = len(self.cached)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"context window full: {start} + {len(tokens)} tokens > n_ctx {self.n_ctx}"
            )
        # Long inputs (prompts) go in chunks of n_batch; only the final chunk can carry logits.
        if len(tokens) > self.n_batch:
            if logits == "all":
                raise ValueError("logits for every row need len(tokens) <= n_batch")
            cut = len(tokens) - (len(tokens) - 1) % self.n_batch - 1
            for i in range(0, cut, self.n_batch):
                self.decode(tokens[i : i + self.n_batch], "none")
            self.decode(tokens[cut:], logits)
            return
        # Record first: if anything interrupts us, the recovery path trusts the
        # smaller of this list and the cache's real end (pos_max).
        self._skip = skip
        self.cached.extend(tokens)
        rc, seconds = self._run(tokens, logits, start)
        self.decode_s += seconds
        self.decode_calls += 1
        if rc != 0:
            self.rewinder.failed()
            self._cut(start)
            if rc == 1:
                raise ContextOverflowError(
                    f"{self.path.name}: no room in the KV cache for {len(tokens)} more tokens"
                )
            raise DecodeError(f"{self.path.name}: llama_decode failed with code {rc} on "
                              f"{len(tokens)} tokens (SPECLLAMA_DEBUG=1 shows llama.cpp's log)")
        self.rewinder.decoded(start, start + len(tokens))
        self.tokens_evaluated += len(tokens)
        if self.on_decoded is not None:
            self.on_decoded(start, len(tokens))

    def _owed_first(self, tokens: list[int]) -> tuple[list[int], int]:
        """The owed tokens, taken out of `cached`, then `tokens`: decoded as one batch whose
        first rows (how many: returned) carry no logits; `logits_row` counts from the
        caller's first token."""
        owed, self.owed = self.owed, 0
        again = self.cached[-owed:]
        del self.cached[-owed:]
        return again + tokens, owed

    def settle(self) -> None:
        """Decode the owed tokens now (before the state is copied out, or a batch too
        wide to take them)."""
        if self.owed:
            self.decode(self._owed_first([])[0], "none")

    def _run(self, tokens: list[int], logits: LogitsWanted, start: int) -> tuple[int, float]:
        """One llama_decode of `tokens` at positions from `start`: its return code and
        the seconds it took."""
        batch = self.shared.batch
        batch.n_tokens = len(tokens)
        self.fill(batch, 0, tokens, start, logits)
        t0 = time.perf_counter()
        with backend.local_watch():  # (an engine process's: a hung decode ends it)
            rc = self.submit(batch)
        return rc, time.perf_counter() - t0

    def fill(self, batch: Any, at: int, tokens: list[int], start: int,
             logits: LogitsWanted) -> None:
        """Write `tokens` (positions from `start`, this object's sequence) into rows
        at.. of a llama_batch."""
        want_all = logits == "all"
        skip = self._skip
        for i, tok in enumerate(tokens):
            j = at + i
            batch.token[j] = tok if tok < self.n_vocab else self._stand_in
            batch.pos[j] = start + i
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = self.seq
            batch.logits[j] = want_all and i >= skip
        if logits == "last":
            batch.logits[at + len(tokens) - 1] = True

    def submit(self, batch: Any) -> int:
        """llama_decode of a filled batch (waiting for remote devices to finish)."""
        return self.shared.submit(batch)

    def warm_batch_sizes(self, sizes: Sequence[int]) -> int:
        """On RPC devices, decode each batch size once, untimed (rpc.warm_batch_sizes)."""
        return rpc_net.warm_batch_sizes(self, sizes)

    def logits_row(self, i: int) -> np.ndarray:
        """Zero-copy view of the logits of row i of the last decode (counted from the
        caller's first token); valid until the next one."""
        return self.shared.logits(self.batch_row(i + self._skip if i >= 0 else i))

    def batch_row(self, i: int) -> int:
        """Row i of this object's last decode as a row of the batch that carried it."""
        return i

    def can_draft(self) -> bool:
        """A model can always draft from its cache (a cross-vocabulary view may not)."""
        return True

    # What a draft in the target's own vocabulary says of it (views.DraftModel)
    def set_prompt(self, prompt: list[int], own: list[int] | None) -> None:
        """It reads the target's tokens as they are: nothing to do."""

    def own_mass(self) -> float:
        return 1.0

    def vocabulary_note(self) -> str:
        return "vocabularies match"

    def pos_max(self) -> int:
        """Highest position the KV cache holds (-1 when empty), owed tokens counted."""
        return int(lc.llama_memory_seq_pos_max(self.shared.mem, self.seq)) + self.owed

    def pos_min(self) -> int:
        """Lowest position it holds (above 0 where a sliding window pruned cells)."""
        return int(lc.llama_memory_seq_pos_min(self.shared.mem, self.seq))

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens, drop the rest (trusting `cached`: a cache
        an interrupt may have left mid-update is sync_to's to repair)."""
        if n < len(self.cached):
            self._cut(n)

    def checkpoint(self, next_batch: int | None = None) -> None:
        """The state here may be wanted back: a recurrent model keeps a copy unless its
        own snapshots will do (next_batch: the size of the one batch that follows, when
        a cut keeps at least its first token). Nothing for a KV cache (rewind.py)."""
        self._settle_before(next_batch)
        after = None if next_batch is None else next_batch + self.owed
        self.rewinder.checkpoint(len(self.cached) - self.owed, after)

    def _settle_before(self, next_batch: int | None) -> None:
        """A checkpoint copies the state before the owed tokens, so a cut behind the next
        batch owes them again: they ride along at most as many as that batch holds (with
        a rejection every round they grew without end)."""
        if self.owed and (next_batch is None or self.owed > next_batch):
            self.settle()

    def _cut(self, n: int, *, lazy: bool = False) -> int:
        """Drop positions n.. by the cheapest exact path (rewind.py). A recurrent state
        may have to go back further: the tokens between are owed, decoded with the next
        batch, or with `lazy` left to the caller. Returns the tokens the cache then holds."""
        held = len(self.cached) - self.owed  # what the memory holds
        if n >= held:  # only owed tokens go
            del self.cached[n:]
            self.owed = n - held
            return n
        self.owed = 0
        kept = self._cut_memory(n, held)
        if kept < 0:
            del self.cached[held:]
            raise KVCacheError(
                f"{self.path.name}: llama.cpp could not drop cached tokens from position {n}; "
                "stopping rather than continuing with a cache that holds what it should not"
            )
        del self.cached[n if not lazy else kept:]
        if not lazy:
            self.owed = n - kept  # (0 but for a state taken back further)
            self.rewinder.counts.redecoded_tokens += self.owed
        return len(self.cached)

    def _cut_memory(self, n: int, length: int) -> int:
        return self.rewinder.cut(n, length)

    def clear(self) -> None:
        self.rewinder.forget()
        self.owed = 0
        if self.n_seq == 1:
            lc.llama_memory_clear(self.shared.mem, True)
        else:
            lc.llama_memory_seq_rm(self.shared.mem, self.seq, -1, -1)
        self.cached.clear()

    def save_state(self) -> KVState:
        """A copy of the KV cache and the tokens it holds (llama.cpp's sequence state),
        for `restore` later, after other prompts have passed through."""
        self.settle()
        size = int(lc.llama_state_seq_get_size(self.shared.ctx, self.seq))
        buf = (ctypes.c_uint8 * size)()
        written = int(lc.llama_state_seq_get_data(self.shared.ctx, buf, size, self.seq))
        if written == 0 and self.cached:
            raise KVCacheError(f"{self.path.name}: llama.cpp could not copy its KV cache")
        return KVState(tuple(self.cached), bytes(buf)[:written])

    def restore(self, state: KVState) -> None:
        """Put back a `save_state` copy in place of what the cache holds."""
        self.clear()
        if not state.tokens:
            return
        buf = (ctypes.c_uint8 * len(state.data)).from_buffer_copy(state.data)
        if not lc.llama_state_seq_set_data(self.shared.ctx, buf, len(state.data), self.seq):
            self.clear()  # llama.cpp may have read part of it
            raise KVCacheError(f"{self.path.name}: llama.cpp could not restore a saved KV cache")
        self.cached[:] = state.tokens

    def sync_to(self, tokens: list[int]) -> int:
        """Make the cache a prefix of `tokens`, keeping the longest common prefix it
        already holds (also repairs a cache left mid-update by an interrupt).
        Returns the number of tokens kept."""
        real_end = self.pos_max() + 1
        limit = min(len(self.cached), len(tokens), real_end)
        cached = self.cached
        if cached[:limit] == list(tokens[:limit]):  # the usual case, at C speed
            keep = limit
        else:
            keep = 0
            while cached[keep] == tokens[keep]:
                keep += 1
        if keep < len(cached) or keep < real_end:
            keep = self._cut(keep, lazy=True)
        return keep

