"""Which draft tokens a target can take: the draft ids whose text is exactly one target
token (token-level intersection, Timor et al., ICML 2025), built once per pair of
tokenizers and kept in the cache."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import IncompatiblePairError
from ..llama import Vocabulary
from .draftcache import tokenizer_fingerprint

#: Below this share of the draft's vocabulary in the intersection a draft has too little
#: to say to be worth loading (the issue's bar; real cross-family pairs share 60-95%).
MIN_SHARE = 0.10


@dataclass(frozen=True)
class VocabMap:
    """Draft ids whose text is exactly one target token, and those target ids."""

    draft_ids: np.ndarray  # int64, ascending
    target_ids: np.ndarray  # int64, target_ids[i] is draft_ids[i]'s text in the target
    n_draft: int
    n_target: int

    @property
    def share(self) -> float:
        """The share of the draft's vocabulary inside the intersection."""
        return len(self.draft_ids) / max(1, self.n_draft)

    def to_draft(self) -> np.ndarray:
        """target id -> draft id (-1 outside the intersection)."""
        out = np.full(self.n_target, -1, dtype=np.int64)
        out[self.target_ids] = self.draft_ids
        return out

    @classmethod
    def build(cls, target: Vocabulary, draft: Vocabulary) -> VocabMap:
        """Match each token's bytes as it adds them to the text (llama.cpp's
        token_to_piece: GPT-2's 'Ġ' and SentencePiece's '▁' are spaces, a byte-fallback
        token its byte). Control and end-of-generation tokens stay out; where several
        target tokens spell the same bytes (a byte token and a normal one), the normal one
        stands for them, and likewise for the draft, so the map is one to one."""
        by_text = {text: t for t, text in _spellings(target).items()}
        pairs: dict[int, int] = {}
        for d, text in _spellings(draft).items():
            t = by_text.get(text)
            if t is not None:
                pairs[d] = t
        drafts = np.fromiter(sorted(pairs), dtype=np.int64, count=len(pairs))
        targets = np.fromiter((pairs[int(d)] for d in drafts), dtype=np.int64, count=len(pairs))
        return cls(drafts, targets, draft.n_vocab, target.n_vocab)

    @classmethod
    def cached(cls, target: Vocabulary, draft: Vocabulary, cache_root: Path) -> VocabMap:
        """`build`, once per pair of tokenizers: kept under cache_root/vocabmaps."""
        key = hashlib.sha256(
            f"{tokenizer_fingerprint(target)}|{tokenizer_fingerprint(draft)}".encode()
        ).hexdigest()[:24]
        path = cache_root / "vocabmaps" / f"{key}.npz"
        try:
            with np.load(path) as data:
                found = cls(data["draft_ids"], data["target_ids"], draft.n_vocab, target.n_vocab)
            if len(found.draft_ids) == len(found.target_ids):
                return found
        except (OSError, ValueError, KeyError):
            pass  # absent, truncated or foreign: build it again
        built = cls.build(target, draft)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{time.time_ns()}.tmp.npz")
            np.savez(tmp, draft_ids=built.draft_ids, target_ids=built.target_ids)
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache costs a rebuild next time, nothing else
        return built


def _spellings(vocab: Vocabulary) -> dict[int, bytes]:
    """Token id -> the bytes it adds to the text, one id per spelling (see build)."""
    best: dict[bytes, int] = {}
    for token in range(vocab.n_vocab):
        if vocab.is_eog(token) or vocab.is_control(token):
            continue
        text = vocab.piece(token)
        if not text:
            continue
        other = best.get(text)
        if other is None or (vocab.is_byte(other) and not vocab.is_byte(token)):
            best[text] = token
    return {token: text for text, token in best.items()}


def check_intersection(vmap: VocabMap, target: Vocabulary, draft: Vocabulary) -> None:
    if vmap.share < MIN_SHARE:
        raise IncompatiblePairError(
            f"draft {draft.path.name} shares too few tokens with target {target.path.name} "
            f"to draft for it: {len(vmap.draft_ids)} of its {vmap.n_draft} tokens "
            f"({vmap.share:.0%}; at least {MIN_SHARE:.0%} needed) spell a target token"
        )
