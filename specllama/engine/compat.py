"""Can this draft speak for this target? The check llama.cpp applies to a pair."""

from __future__ import annotations

from ..errors import IncompatiblePairError
from .llama import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5  # ids below are special tokens that families renumber freely
# llama.cpp's enum llama_vocab_type
VOCAB_TYPES = {0: "none", 1: "SentencePiece", 2: "BPE", 3: "WordPiece", 4: "Unigram",
               5: "RWKV", 6: "PLaMo-2"}


def check_compatible(target: Model, draft: Model) -> None:
    """Raise IncompatiblePairError naming both files and the first difference."""

    def fail(what: str) -> None:
        raise IncompatiblePairError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {what}; "
            "use a draft model from the same family (same tokenizer)"
        )

    if target.vocab_type != draft.vocab_type:
        names = [VOCAB_TYPES.get(v, str(v)) for v in (target.vocab_type, draft.vocab_type)]
        fail(f"tokenizer types differ ({names[0]} vs {names[1]})")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        fail(f"vocabulary sizes differ ({target.n_vocab} vs {draft.n_vocab} tokens)")
    if target.bos != draft.bos:
        fail(f"BOS tokens differ ({target.bos} vs {draft.bos})")
    if target.eos != draft.eos:
        fail(f"EOS tokens differ ({target.eos} vs {draft.eos})")
    for token in range(FIRST_COMPARED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            shown = (a.decode(errors="replace"), b.decode(errors="replace"))
            fail(f"token {token} is {shown[0]!r} vs {shown[1]!r}")


def check_rewindable(model: Model, role: str) -> None:
    """Speculation cuts rejected drafts out of the caches every round; a recurrent or
    hybrid model keeps a running state instead of per-token entries and cannot."""
    if not model.can_rewind:
        raise IncompatiblePairError(
            f"{role} {model.path.name} is a {model.memory_kind} model: its memory cannot drop "
            "rejected draft tokens, so it cannot take part in speculative decoding; "
            "run it as a target alone (--draft-max 0)"
        )
