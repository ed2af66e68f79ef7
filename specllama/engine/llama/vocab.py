"""A GGUF file's tokenizer and chat template through llama.cpp (vocab_only: no weights):
what `specllama serve` tokenizes with, and the base of `Model`."""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from . import backend
from .backend import lc  # llama_cpp, imported there with the fix for a broken install
from .gguf import check_gguf_file


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle tokens as llama.cpp reads them (the GGUF's
    tokenizer.ggml.fim_*_token_id, else texts it knows, such as Qwen's <|fim_prefix|>);
    None where the model has none. `rep` names a repository and `sep` opens a file in
    the repo-level pattern (llama-server's FIM_REP and FIM_SEP)."""

    pre: int | None
    suf: int | None
    mid: int | None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    @property
    def usable(self) -> bool:
        """Prefix, suffix and middle: what llama-server's /infill needs."""
        return self.pre is not None and self.suf is not None and self.mid is not None


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
        self._formatters: dict[str, Any] = {}  # by template: compiling one takes ~10 ms

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

    @property
    def fim(self) -> FimTokens:
        """The fill-in-the-middle tokens (llama.cpp answers -1 for one it lacks)."""
        def get(name: str) -> int | None:
            token = int(getattr(lc, f"llama_vocab_fim_{name}")(self._vocab))
            return None if token < 0 else token

        return FimTokens(*(get(n) for n in ("pre", "suf", "mid", "pad", "rep", "sep")))

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

    def meta(self, key: str) -> str | None:
        """The file's metadata value of ``key`` as text (None when it has none): e.g.
        ``specllama.synthetic``, the sentence a synthetic model says of itself."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(lc.llama_model_meta_val_str(self._model, key.encode(), buf, size))
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1  # the value's length: ask again with room for all of it

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def format_chat(self, messages: list[dict[str, Any]], template: str | None = None,
                    tools: list[dict[str, Any]] | None = None, **variables: Any) -> str:
        """Render messages with the model's own jinja2 chat template (or `template`),
        ending with the assistant's generation prompt; `tools` (OpenAI's shape) for a
        template with a tools section; `variables` for the template to read (Qwen3's
        `enable_thinking`), as llama-server's chat_template_kwargs."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = template or self.chat_template()
        if template is None:
            raise ValueError("model has no chat template")
        formatter = self._formatters.get(template)
        if formatter is None:
            piece = lambda t: self.token_text(t).decode("utf-8", errors="replace")  # noqa: E731
            formatter = self._formatters[template] = Jinja2ChatFormatter(
                template=template,
                eos_token=piece(self.eos) if self.eos >= 0 else "",
                bos_token=piece(self.bos) if self.bos >= 0 else "",
                add_generation_prompt=True,
            )
        chat: Any = messages  # the role/content dicts the formatter's TypedDicts describe
        described: Any = tools
        return formatter(messages=chat, tools=described, **variables).prompt

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

    def render(self, tokens: list[int]) -> str:
        """The tokens as text with control tokens spelt out ("<s>", "<|fim_prefix|>"), as
        llama-server shows a prompt back."""
        out = []
        for token in tokens:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, True)
            if n < 0:  # a longer piece: -n bytes
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, True)
            out.append(buf.raw[: max(n, 0)])
        return b"".join(out).decode("utf-8", errors="replace")
