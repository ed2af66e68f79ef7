"""A draft model from another tokenizer family, seen by the round loop in target ids.

Token-level intersection (Timor et al., ICML 2025, "Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies"): the draft may propose only its tokens whose
text is exactly one target token. Its logits outside that intersection are -inf, so q is
its distribution restricted to the intersection and renormalised, a distribution over
target ids like any other, and the ordinary rule min(1, p/q) with the residual keeps the
target's law exactly.

The draft keeps its own tokenization of the committed text. `CrossVocabDraft.cached` is
in target ids (what the round loop reads); the draft model's own cache holds its
tokenization of their text, re-tokenized from a little before the point where the two
part (never the whole context), so a target token outside the intersection costs a short
re-sync, not a restart. A SentencePiece draft that puts a space before what it reads (Llama
2's, for a Mistral target) reads the target's text as it would read it alone, and text
that starts without that space (a reply after its own prompt) as exactly that text.
"""

from __future__ import annotations

import bisect
import time

import numpy as np

from ..llama import DraftTraits, LogitsWanted, Model, Vocabulary
from .vocabmap import VocabMap

#: Re-tokenizing starts at most this many draft tokens before the point where the text
#: changed, at a token that begins a word (BPE pre-tokenizers split there).
BACKOFF_MAX = 8
BPE = 2  # llama.cpp's LLAMA_VOCAB_TYPE_BPE: byte-level, spells any bytes
#: Written before text that does not start with the space a SentencePiece tokenizer puts
#: there, then dropped: characters Llama's and Mistral's vocabularies spell with a byte
#: token, which joins no other piece (the spelling is checked all the same).
SENTINELS = ("\n", "\t")


class CrossVocabDraft:
    """The draft model of a cross-vocabulary pair, driven in target ids.

    `cached` (target ids) is what the round loop believes the draft holds; the model's
    own cache holds draft ids spelling a prefix of their text. Each `decode` brings the
    model up to the whole text (`_bring_up`); a drafted token (one token in the
    intersection, right after its row was read) is appended as the draft id it came
    from; the round's end cuts the cache back and the next draft re-tokenizes the text
    from a word start before it, so between rounds the cache is the tokenizer's own.
    """

    traits = DraftTraits("cross-vocab", "a draft model of another tokenizer", shadow=False,
                         vocabulary="mapped",
                         because="its rows are its own tokenization's, not the target's")

    def __init__(self, model: Model, target: Vocabulary, vmap: VocabMap) -> None:
        self.model, self.target, self.vmap = model, target, vmap
        self.path = model.path
        self.cached: list[int] = []  # target ids
        # What a SentencePiece tokenizer with a space prefix writes before any text, and
        # what the draft reads before the target's: that space, unless the text has one.
        self._lead = self._pad = _lead(model)
        # The characters a vocabulary without byte tokens can spell (None: any).
        self._alphabet = _alphabet(model)
        # The target's prompt and the draft's own rendering of it (its chat template):
        # while `cached` follows the prompt, the draft reads that instead.
        self._alias: tuple[list[int], list[int]] | None = None
        self._alias_text = b""
        self._text = bytearray(self._lead)  # what the draft reads before `cached`, then
        self._ends: list[int] = []  # their bytes; len(_text) after each of `cached`
        self._draft_ends: list[int] = []  # bytes spelt by model.cached[: i + 1]
        self._canonical = 0  # model.cached[:_canonical] came from the tokenizer
        self._to_draft = vmap.to_draft()
        self._row = np.empty(vmap.n_target, dtype=np.float32)
        self.sync_s = 0.0  # tokenizing and mapping, priced as draft time
        self.lost: str | None = None  # why it cannot draft past this text (None: it can)
        # A row was just read: one token decoded next is the one drawn from it.
        self._served = False

    # ---------------------------------------------------------- what rounds.py uses
    @property
    def decode_s(self) -> float:
        return self.model.decode_s + self.sync_s

    @property
    def tokens_evaluated(self) -> int:
        return self.model.tokens_evaluated

    def can_draft(self) -> bool:
        return self.lost is None

    def set_threads(self, n_threads: int) -> None:
        self.model.set_threads(n_threads)

    @property
    def n_threads(self) -> int:
        return self.model.n_threads

    def decode(self, tokens: list[int], logits: LogitsWanted = "last") -> None:
        if not tokens:
            return
        if logits == "all":
            raise ValueError("a cross-vocabulary draft reads its last row only")
        m = self.model
        drafted, self._served = self._served, False
        if drafted and len(tokens) == 1 and len(self._draft_ends) == len(m.cached) < m.n_ctx \
                and (not self._draft_ends or self._draft_ends[-1] == len(self._text)):
            d = int(self._to_draft[tokens[0]]) if tokens[0] < len(self._to_draft) else -1
            if d >= 0:  # the token it just drafted: its own id, no tokenizer
                self._append(tokens)
                m.decode([d], logits)
                self._draft_ends.append(len(self._text))
                return
        self._append(tokens)
        self._bring_up(logits == "last")

    def logits_row(self, i: int) -> np.ndarray:
        """The draft's last row in target ids: -inf outside the intersection."""
        t0 = time.perf_counter()
        row = self._row
        row.fill(-np.inf)
        row[self.vmap.target_ids] = self.model.logits_row(-1)[self.vmap.draft_ids]
        self.sync_s += time.perf_counter() - t0
        self._served = True
        return row

    def sync_to(self, tokens: list[int]) -> int:
        keep = _common_prefix(self.cached, list(tokens))
        self.truncate(keep)
        return keep

    def truncate(self, n: int) -> None:
        self._served = False
        if n >= len(self.cached):
            # Still repair a model cache an interrupt left mid-update.
            self._cut_model(len(self._draft_ends))
            return
        del self.cached[n:], self._ends[n:]
        del self._text[self._ends[-1] if self._ends else len(self._fixed_text()):]
        # the draft tokens that spell within what is left (their ends never decrease)
        self._cut_model(bisect.bisect_right(self._draft_ends, len(self._text)))

    def checkpoint(self, next_batch: int | None = None) -> None:
        self.model.checkpoint(next_batch)

    def clear(self) -> None:
        self.model.clear()
        self.cached.clear()
        self._ends.clear()
        self._text[:] = self._fixed_text()
        self._draft_ends.clear()
        self._canonical = 0
        self.lost = None

    def pos_max(self) -> int:
        """len(cached) - 1 where the model's cache spells a prefix of their text, as
        llama.cpp agrees; -2 (never a cache's length) where it does not."""
        m = self.model
        spelt = b"".join(m.piece(t) for t in m.cached)
        ok = (m.pos_max() + 1 == len(m.cached) == len(self._draft_ends)
              and self._text.startswith(spelt))
        return len(self.cached) - 1 if ok else -2

    def own_mass(self) -> float:
        """The share of the draft's own softmax (its last row) on the tokens it may
        propose: what the restriction to the intersection costs it."""
        full = self.model.logits_row(-1).astype(np.float64)
        weights = np.exp(full - full.max())
        return float(weights[self.vmap.draft_ids].sum() / weights.sum())

    def vocabulary_note(self) -> str:
        vmap = self.vmap
        return (f"vocabularies differ, {len(vmap.draft_ids)} of the draft's {vmap.n_draft} "
                f"tokens ({vmap.share:.0%}) spell a target token")

    def close(self) -> None:
        self.model.close()

    def canonical(self) -> list[int]:
        """The draft's own tokenization of the whole text (what its cache should hold
        once brought up; for tests)."""
        tail = _complete(self._text[len(self._alias_text):])
        fresh = self._spell(tail)
        if fresh is None:  # text it cannot spell: its tokenizer's reading all the same
            text = tail[len(self._lead):] if tail.startswith(self._lead) else tail
            fresh = self.model.tokenize(text.decode("utf-8", errors="replace"),
                                        add_bos=False, special=False)
        return self._fixed() + fresh

    def set_prompt(self, prompt: list[int], draft_prompt: list[int] | None) -> None:
        """This call's prompt, and the draft's own tokens for it (its chat template's
        rendering of the same conversation; None: it reads the target's text). While
        `cached` follows the prompt the draft holds `draft_prompt`, then its reading of
        the text generated after it. Keeps what both caches share with the new call."""
        if draft_prompt is None:
            if self._alias is not None:
                self._alias, self._alias_text = None, b""
                self._rebuild()
            return
        prompt, draft_prompt = list(prompt), list(draft_prompt)
        m = self.model
        keep = _common_prefix(self.cached, prompt)
        del self.cached[keep:]
        self._alias = (prompt, draft_prompt)
        self._alias_text = b"".join(m.piece(t) for t in draft_prompt)
        self._text = bytearray(self._alias_text)
        self._ends = [len(self._alias_text)] * keep
        self._cut_model(_common_prefix(m.cached, draft_prompt))

    # --------------------------------------------------------------- the re-sync
    def _append(self, tokens: list[int]) -> None:
        for t in tokens:
            i = len(self.cached)
            if self._alias is not None and i < len(self._alias[0]):
                if t != self._alias[0][i]:  # this history leaves the prompt: plain text
                    self._alias, self._alias_text = None, b""
                    self._rebuild()
                else:
                    self.cached.append(t)  # spelt by the draft's prompt already
                    self._ends.append(len(self._text))
                    continue
            piece = self.target.piece(t)
            if piece and self._alias is None and len(self._text) == len(self._pad):
                self._settle_pad(piece)
            self.cached.append(t)
            self._text += piece
            self._ends.append(len(self._text))

    def _settle_pad(self, first: bytes) -> None:
        """The text's first bytes are known: the draft reads its tokenizer's leading space
        before them only where they lack one (a SentencePiece target's text has it, and
        the draft reads it as it would read the text alone, not with a second space)."""
        pad = b"" if first.startswith(self._lead) else self._lead
        if pad != self._pad:
            self._pad = pad
            self._text[:] = pad
            self._ends = [len(pad)] * len(self.cached)  # all of them spell nothing
            self._cut_model(bisect.bisect_right(self._draft_ends, 0))

    def _rebuild(self) -> None:
        """`_text` and `_ends` as the plain reading of `cached`; the model starts over."""
        tokens = self.cached[:]
        del self.cached[:]
        self._text, self._pad, self._ends = bytearray(self._lead), self._lead, []
        self._cut_model(0)
        self._append(tokens)

    def _bos(self) -> list[int]:
        m = self.model
        return [m.bos] if m.adds_bos and m.bos >= 0 else []

    def _fixed(self) -> list[int]:
        """The draft tokens its tokenizer never re-reads: its prompt, or its BOS."""
        return self._alias[1] if self._alias is not None else self._bos()

    def _fixed_text(self) -> bytes:
        return self._alias_text if self._alias is not None else self._pad

    def _cut_model(self, n: int) -> None:
        m = self.model
        m.sync_to(m.cached[:n])
        del self._draft_ends[len(m.cached):]
        self._canonical = min(self._canonical, len(m.cached))

    def _bring_up(self, want_logits: bool) -> None:
        """Re-tokenize the text from a word start a little before where the model's
        tokens stop being the tokenizer's own, and decode what differs. Text the
        tokenizer cannot spell back byte for byte stops drafting (`lost`), never the
        generation."""
        t0 = time.perf_counter()
        m = self.model
        bos = self._fixed()
        start = len(bos)
        if len(m.cached) > start:
            start = max(start, min(self._canonical, len(m.cached)) - 1)
            floor = max(len(bos), start - BACKOFF_MAX)
            while start > floor and not _word_start(m.piece(m.cached[start - 1]),
                                                    m.piece(m.cached[start])):
                start -= 1
        fresh = self._tokenize_from(start)
        if fresh is None and start > len(bos):
            fresh, start = self._tokenize_from(len(bos)), len(bos)  # from the top, rarely
        self.sync_s += time.perf_counter() - t0
        if fresh is None:
            self.lost = "the draft's tokenizer cannot spell the text back byte for byte"
            return
        wanted = bos + fresh if start == len(bos) else m.cached[:start] + fresh
        if len(wanted) > m.n_ctx:
            self.lost = "the draft's context window is full"
            return
        if not wanted:
            self.lost = "the draft has no text to draft from"
            return
        kept = _common_prefix(m.cached, wanted)
        if want_logits and kept == len(wanted):
            kept -= 1  # the last row is read: decode the last token again
        self._cut_model(kept)
        kept = len(m.cached)  # a recurrent draft may have gone back further
        ends = self._draft_ends
        for t in wanted[kept:]:
            ends.append((ends[-1] if ends else 0) + len(m.piece(t)))
        m.decode(wanted[kept:], "last" if want_logits else "none")
        self._canonical = len(m.cached)
        self.lost = None

    def _tokenize_from(self, start: int) -> list[int] | None:
        """The draft's tokens for the text after its first `start` tokens (whole
        characters only), or None where they would not spell it back byte for byte."""
        # The fixed tokens spell the draft's prompt (a BOS spells nothing).
        offset = len(self._alias_text) if start == len(self._fixed()) \
            else self._draft_ends[start - 1]
        return self._spell(_complete(self._text[offset:]))

    def _spell(self, tail: bytes) -> list[int] | None:
        """Draft tokens that spell `tail` exactly, or None. A tokenizer that writes a
        leading space reads the text after one; where `tail` has none (a reply after the
        draft's own prompt, a word's middle) it reads a sentinel first, whose tokens go."""
        if not tail:
            return []
        lead = self._lead
        if tail.startswith(lead):  # always, without a lead
            return self._read(tail[len(lead):], 0) if len(tail) > len(lead) else []
        for sentinel in SENTINELS:
            fresh = self._read(sentinel.encode() + tail, len(lead) + len(sentinel))
            if fresh is not None:
                return fresh
        return None

    def _read(self, text: bytes, drop: int) -> list[int] | None:
        """The tokenizer's tokens for `text` less those spelling the first `drop` bytes
        of what they write (its leading space, then `text`), or None where they would not
        spell that back byte for byte or no token ends after `drop` bytes."""
        try:
            chars = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if self._alphabet is not None and not self._alphabet.issuperset(chars):
            return None  # llama.cpp aborts on a character such a vocabulary lacks
        m = self.model
        tokens = m.tokenize(chars, add_bos=False, special=False)
        pieces = [m.piece(t) for t in tokens]
        if b"".join(pieces) != self._lead + text:
            return None
        n = spelt = 0
        while spelt < drop:
            spelt += len(pieces[n])
            n += 1
        return tokens[n:] if spelt == drop else None


def _lead(model: Model) -> bytes:
    pieces = b"".join(model.piece(t) for t in model.tokenize("a", add_bos=False, special=False))
    return pieces[: len(pieces) - 1] if pieces.endswith(b"a") else b""


def _alphabet(model: Model) -> frozenset[str] | None:
    """Byte-level BPE and byte-fallback vocabularies spell anything; others only the
    characters of their pieces."""
    if model.vocab_type == BPE or any(model.is_byte(t) for t in range(model.n_vocab)):
        return None
    return frozenset("".join(model.piece(t).decode("utf-8", errors="ignore")
                             for t in range(model.n_vocab)))


def _word_start(before: bytes, piece: bytes) -> bool:
    """Whether a tokenizer would split between `before` and `piece`: a space after a
    character that is not one (where BPE pre-tokenizers cut; runs of white space merge)."""
    return piece[:1].isspace() and not before[-1:].isspace()


def _complete(data: bytes | bytearray) -> bytes:
    """`data` without an unfinished UTF-8 character at its end (a byte token's half of
    one); the rest of the text is whole characters or was never UTF-8 at all."""
    data = bytes(data)
    for cut in range(1, min(4, len(data)) + 1):
        lead = data[-cut]
        if lead < 0x80:
            return data
        if lead >= 0xC0:
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return data if cut >= need else data[:-cut]
    return data


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
