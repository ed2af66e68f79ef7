"""Can this draft speak for this target? The check llama.cpp applies to a pair."""

from __future__ import annotations

from .backend import Model
from .errors import IncompatiblePairError

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5  # ids below are special tokens that families renumber freely


def check_compatible(target: Model, draft: Model) -> None:
    """Raise IncompatiblePairError naming both files and the first difference."""

    def fail(what: str) -> None:
        raise IncompatiblePairError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {what}; "
            "use a draft model from the same family (same tokenizer)"
        )

    if target.vocab_type != draft.vocab_type:
        fail(f"tokenizer types differ ({target.vocab_type} vs {draft.vocab_type})")
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
