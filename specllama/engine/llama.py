"""One GGUF model through llama.cpp's low-level API (llama-cpp-python's `_internals.py`
in spirit); `quantize`.

A `Model` is one GGUF file with its own context (KV cache) and a reusable batch.
It tracks which tokens its KV cache holds (`cached`), decodes new tokens at the
end of that sequence, hands out logits rows as zero-copy numpy views, and cuts
the cache back. With `backend.py` (the process-wide side: log, start, RPC), the only
module that touches llama_cpp: when its API changes, only these two change.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import (
    ContextOverflowError,
    DecodeError,
    DraftDerivationError,
    KVCacheError,
    ModelLoadError,
)
from . import backend
from . import rpc as rpc_net
from .backend import lc  # llama_cpp, imported there with the fix for a broken install
from .gguf import check_gguf_file

# llama.cpp's CPU threads spin while they wait for each other: faster on an idle machine,
# ruinous when another process takes a core; hence the default thread count of
# cli/options.py rather than another wait policy (docs/performance.md).

LLAMA_CPP_VERSION = str(getattr(lc, "__version__", "?"))

QUANT_TYPES: dict[str, int] = {
    "F32": lc.LLAMA_FTYPE_ALL_F32,  # the bandwidth-bound stand-in for a big target (bench/)
    "F16": lc.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q5_1": lc.LLAMA_FTYPE_MOSTLY_Q5_1,
    "Q5_0": lc.LLAMA_FTYPE_MOSTLY_Q5_0,
    "Q4_1": lc.LLAMA_FTYPE_MOSTLY_Q4_1,
    "Q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
    "IQ4_NL": lc.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}

LogitsWanted = Literal["none", "last", "all"]


class DraftModel(Protocol):
    """A draft model as the round loop drives it, in target ids: a `Model` of the
    target's family, or a cross-vocabulary view (engine/crossvocab.py)."""

    path: Path
    cached: list[int]

    @property
    def decode_s(self) -> float: ...
    @property
    def tokens_evaluated(self) -> int: ...
    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None: ...
    def logits_row(self, i: int) -> np.ndarray: ...
    def sync_to(self, tokens: list[int]) -> int: ...
    def truncate(self, n: int) -> None: ...
    def clear(self) -> None: ...
    def pos_max(self) -> int: ...
    def can_draft(self) -> bool: ...


class Vocabulary:
    """A GGUF file's tokenizer and chat template only (llama.cpp's vocab_only load: no
    weights, no context, never on a remote device): what `specllama serve` tokenizes
    requests with while the model itself runs in its engine process."""

    def __init__(self, path: str | Path) -> None:
        backend.init()
        self.path = Path(path)
        self._model: Any = None
        check_gguf_file(self.path, what="model")
        mparams = lc.llama_model_default_params()
        mparams.vocab_only = True
        model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelLoadError(f"{self.path}: llama.cpp could not read its vocabulary "
                                 f"({backend.last_log_error()})")
        self._adopt(model)

    def _adopt(self, model: Any) -> None:
        self._model = model
        self._vocab = lc.llama_model_get_vocab(model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._lltokenizer: Any = None  # grammar_tokenizer(), once asked for

    def close(self) -> None:
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------- vocab
    @property
    def vocab_type(self) -> int:
        return int(lc.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(lc.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(lc.llama_vocab_eos(self._vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    @property
    def adds_eos(self) -> bool:
        return bool(lc.llama_vocab_get_add_eos(self._vocab))

    def token_text(self, token: int) -> bytes:
        """The raw vocabulary entry (e.g. '▁the', '<0x0A>'), as llama.cpp compares vocabs."""
        return lc.llama_vocab_get_text(self._vocab, token) or b""

    def grammar_tokenizer(self) -> Any:
        """llguidance's view of this vocabulary (each token's bytes, control tokens marked
        with a 0xff prefix as llguidance expects, end-of-generation ids), built once (about
        a second for 49k tokens): what constraints mask and force tokens with."""
        if self._lltokenizer is None:
            import llguidance

            buf = ctypes.create_string_buffer(1024)
            pieces: list[bytes] = []
            control = lc.LLAMA_TOKEN_ATTR_CONTROL
            for token in range(self.n_vocab):
                n = lc.llama_token_to_piece(self._vocab, token, buf, 1024, 0, True)
                piece = buf.raw[: max(n, 0)]
                attr = lc.llama_vocab_get_attr(self._vocab, token)
                if attr & control or (attr & lc.LLAMA_TOKEN_ATTR_USER_DEFINED
                                      and piece.startswith(b"<") and piece.endswith(b">")):
                    piece = b"\xff" + piece
                pieces.append(piece)
            eog = [t for t in range(self.n_vocab) if self.is_eog(t)] or [self.eos]
            fptr = ctypes.cast(lc.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
            self._lltokenizer = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                tokens=pieces, vocab_ptr=self._vocab, tokenize_fptr=fptr, eos_token=eog,
                slices=None)
        return self._lltokenizer

    def is_eog(self, token: int) -> bool:
        hit = self._eog.get(token)
        if hit is None:
            hit = self._eog[token] = bool(lc.llama_vocab_is_eog(self._vocab, token))
        return hit

    def is_control(self, token: int) -> bool:
        """Control, unknown or unused: no text of its own in what a model writes."""
        attr = int(lc.llama_vocab_get_attr(self._vocab, token))
        return bool(attr & (lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN
                            | lc.LLAMA_TOKEN_ATTR_UNUSED))

    def is_byte(self, token: int) -> bool:
        """A byte-fallback token (SentencePiece's '<0x0A>')."""
        return bool(int(lc.llama_vocab_get_attr(self._vocab, token)) & lc.LLAMA_TOKEN_ATTR_BYTE)

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def format_chat(self, messages: list[dict[str, str]], template: str | None = None) -> str:
        """Render messages with the model's own jinja2 chat template (or `template`),
        ending with the assistant's generation prompt."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = template or self.chat_template()
        if template is None:
            raise ValueError("model has no chat template")
        piece = lambda t: self.token_text(t).decode("utf-8", errors="replace")  # noqa: E731
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=piece(self.eos) if self.eos >= 0 else "",
            bos_token=piece(self.bos) if self.bos >= 0 else "",
            add_generation_prompt=True,
        )
        chat: Any = messages  # the role/content dicts the formatter's TypedDicts describe
        return formatter(messages=chat).prompt

    def prompt(self, text: str, *, chat: bool = True, system: str | None = None) -> list[int]:
        """`text` as this model should see it: the user's message in its chat template
        when `chat` and it has one, else raw (BOS if the model wants one)."""
        if chat and self.chat_template() is not None:
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": text})
            return self.tokenize_chat(self.format_chat(messages))
        return self.tokenize(text, add_bos=self.adds_bos, special=True)

    def tokenize_chat(self, rendered: str) -> list[int]:
        """Tokenize a rendered chat prompt: special tokens parsed, BOS added only if the
        template did not already write it."""
        bos = self.bos
        bos_text = self.token_text(bos).decode("utf-8", errors="replace") if bos >= 0 else ""
        add_bos = self.adds_bos and not (bos_text and rendered.startswith(bos_text))
        return self.tokenize(rendered, add_bos=add_bos, special=True)

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes this token contributes to the output text (control tokens: none)."""
        out = self._pieces.get(token)
        if out is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            out = self._pieces[token] = buf.raw[:n]
        return out

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")


class Model(Vocabulary):
    """One GGUF model with its own KV cache, driven token by token."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_batch: int = 512,
        rpc: Sequence[str] = (),
    ) -> None:
        """rpc: HOST:PORT of RPC servers; the model's layers (and its KV cache) go
        there instead of this machine's CPU."""
        backend.init()
        self.path = Path(path)
        # llama.cpp handles (ctypes objects); None once freed
        self._model = None
        self._ctx: Any = None
        self._batch: Any = None
        check_gguf_file(self.path, what="model")
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)

        self.rpc = tuple(rpc_net.check_endpoint(e) for e in rpc)
        mparams = lc.llama_model_default_params()
        if backend.amx_built_in():
            mparams.use_extra_bufts = False
        if self.rpc:
            self._devices = backend.rpc_devices(self.rpc)  # kept alive with the model
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            mparams.n_gpu_layers = -1  # every layer (and the output layer) on them
        model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not model:
            raise ModelLoadError(
                f"{self.path}: llama.cpp could not load it ({backend.last_log_error()}); "
                "the file may be truncated or of an unsupported architecture"
            )
        self._adopt(model)

        self.n_batch = max(1, min(n_batch, n_ctx))
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            self.close()
            raise ModelLoadError(f"{self.path}: could not create a context of {n_ctx} tokens "
                                 f"({backend.last_log_error()})")
        self._ctx = ctx
        self.n_ctx = int(lc.llama_n_ctx(ctx))
        self._mem = lc.llama_get_memory(ctx)
        # A token this model lacks (a pair's vocabularies may differ by up to 128 ids at
        # the end) is read as a stand-in: it costs acceptance, never exactness.
        newline = int(lc.llama_vocab_nl(self._vocab))
        self._stand_in = newline if 0 <= newline < self.n_vocab else 0
        self.memory_kind = _memory_kind(model)
        self._row_type = ctypes.c_float * self.n_vocab
        self._ctx_address = ctypes.cast(ctx, ctypes.c_void_p).value
        self._fast_logits = backend.logits_address()
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        if self.rpc:
            rpc_net.keep_alive(list(self.rpc))

        self.cached: list[int] = []  # token ids held by the KV cache, position = index
        self.decode_s = 0.0  # wall time inside llama_decode
        self.tokens_evaluated = 0  # every token ever decoded (prefix-reuse tests count these)
        self.decode_calls = 0
        self._warm_sizes: set[int] = set()  # batch sizes warm_batch_sizes has decoded

    def set_threads(self, n_threads: int) -> None:
        """Decode with n_threads from now on (chosen once the load has shown how busy
        the machine is)."""
        self.n_threads = max(1, int(n_threads))
        lc.llama_set_n_threads(self._ctx, self.n_threads, self.n_threads)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None
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
        batch = self._batch
        batch.n_tokens = len(tokens)
        want_all = logits == "all"
        for i, tok in enumerate(tokens):
            batch.token[i] = tok if tok < self.n_vocab else self._stand_in
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = want_all
        if logits == "last":
            batch.logits[len(tokens) - 1] = True
        # Record first: if anything interrupts us, the recovery path trusts the
        # smaller of this list and the cache's real end (pos_max).
        self.cached.extend(tokens)
        t0 = time.perf_counter()
        rc = self._decode_remote(batch) if self.rpc else lc.llama_decode(self._ctx, batch)
        self.decode_s += time.perf_counter() - t0
        self.decode_calls += 1
        if rc != 0:
            del self.cached[start:]
            self._drop_from(start)
            if rc == 1:
                raise ContextOverflowError(
                    f"{self.path.name}: no room in the KV cache for {len(tokens)} more tokens"
                )
            raise DecodeError(f"{self.path.name}: llama_decode failed with code {rc} on "
                              f"{len(tokens)} tokens (SPECLLAMA_DEBUG=1 shows llama.cpp's log)")
        self.tokens_evaluated += len(tokens)

    def _decode_remote(self, batch: Any) -> int:
        with backend.stall_watch(", ".join(self.rpc)):
            rc = int(lc.llama_decode(self._ctx, batch))
            if rc == 0:
                # Remote devices compute asynchronously: wait here, so decode_s (the
                # stats, auto's costs) holds the real cost rather than the next read.
                lc.llama_synchronize(self._ctx)
        return rc

    def warm_batch_sizes(self, sizes: Sequence[int]) -> int:
        """On RPC devices: decode each batch size of `sizes` once (logits of every row),
        untimed, and cut the cache and the counters back, so a measurement that follows
        times what a decode of that size costs from then on. Local models: nothing.
        Returns the number of decodes made.

        Why: the first decode of a new batch shape makes ggml's RPC client ask the server
        for the compute size of each MUL_MAT shape, one synchronous round trip each (five
        for a llama-type model; ggml-rpc.cpp get_alloc_size, cached per shape); a shape
        seen before waits for one reply only. Not worth it before generation: one decode
        costs more than the round trips it saves."""
        if not self.rpc:
            return 0
        base = len(self.cached)
        todo = [n for n in dict.fromkeys(int(n) for n in sizes) if 1 < n <= self.n_batch
                and n not in self._warm_sizes and base + n <= self.n_ctx]
        if not todo:
            return 0
        saved = (self.decode_s, self.decode_calls, self.tokens_evaluated)
        try:
            for n in todo:
                self.decode([self._stand_in] * n, "all")
                self.truncate(base)
                self._warm_sizes.add(n)
        finally:
            self.truncate(base)
            self.decode_s, self.decode_calls, self.tokens_evaluated = saved
        return len(todo)

    def logits_row(self, i: int) -> np.ndarray:
        """Zero-copy view of the logits of row i of the last decode; valid until the next one."""
        if self._fast_logits is not None:
            address = self._fast_logits(self._ctx_address, i)
            if not address:
                raise IndexError(f"no logits for row {i} of the last decode")
            row: Any = self._row_type.from_address(address)  # a ctypes array: a buffer
            return np.frombuffer(row, dtype=np.float32)
        ptr = lc.llama_get_logits_ith(self._ctx, i)  # pragma: no cover - no private handle
        if not ptr:
            raise IndexError(f"no logits for row {i} of the last decode")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def can_draft(self) -> bool:
        """A model can always draft from its cache (a cross-vocabulary view may not)."""
        return True

    def pos_max(self) -> int:
        """Highest position the KV cache really holds (-1 when empty)."""
        return int(lc.llama_memory_seq_pos_max(self._mem, 0))

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens, drop the rest (trusting `cached`: a cache
        an interrupt may have left mid-update is sync_to's to repair)."""
        if n < len(self.cached):
            self._drop_from(n)
            del self.cached[n:]

    @property
    def can_rewind(self) -> bool:
        """Whether the memory can drop a suffix (False for recurrent and hybrid models)."""
        return self.memory_kind == "transformer"

    def _drop_from(self, n: int) -> None:
        if not self.can_rewind and n > 0:
            # A recurrent state cannot be cut back (llama.cpp may even drop all of it and
            # report success): rebuild it from the tokens kept. Correct, and rare outside
            # speculation, which refuses such models.
            kept = self.cached[:n]
            lc.llama_memory_clear(self._mem, True)
            del self.cached[:]
            self.decode(kept, "none")
            return
        if not lc.llama_memory_seq_rm(self._mem, 0, n, -1):
            raise KVCacheError(
                f"{self.path.name}: llama.cpp could not drop cached tokens from position {n}; "
                "stopping rather than continuing with a cache that holds what it should not"
            )

    def clear(self) -> None:
        lc.llama_memory_clear(self._mem, True)
        self.cached.clear()

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
            self._drop_from(keep)
            del cached[keep:]
        return keep


def _memory_kind(model) -> str:
    """"transformer", "recurrent" (Mamba, RWKV) or "hybrid" (attention plus recurrent layers)."""
    if lc.llama_model_is_recurrent(model):
        return "recurrent"
    is_hybrid = getattr(lc, "llama_model_is_hybrid", None)  # newer llama.cpp only
    if is_hybrid is not None and is_hybrid(model):
        return "hybrid"
    return "transformer"


def quantize(src: Path, dst: Path, ftype: str, n_threads: int | None = None) -> None:
    """Requantize a GGUF file (e.g. a Q4_0 self-draft from a Q4_1 target)."""
    if ftype not in QUANT_TYPES:
        raise DraftDerivationError(
            f"unknown quantization {ftype!r}; choose one of {', '.join(QUANT_TYPES)}"
        )
    backend.init()
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[ftype]
    params.nthread = n_threads or 0
    params.allow_requantize = True
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise DraftDerivationError(
            f"{src}: requantizing to {ftype} failed ({backend.last_log_error()})"
        )
