"""Can this draft speak for this target? The check llama.cpp applies to a pair
(`common_speculative_are_compatible`, common/speculative.cpp)."""

from __future__ import annotations

from ...errors import IncompatiblePairError
from . import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5  # ids below are special tokens that families renumber freely
# llama.cpp's enum llama_vocab_type
VOCAB_TYPES = {0: "none", 1: "SentencePiece", 2: "BPE", 3: "WordPiece", 4: "Unigram",
               5: "RWKV", 6: "PLaMo-2"}


def check_compatible(target: Model, draft: Model) -> None:
    """Raise IncompatiblePairError naming both files and the first difference. As
    llama.cpp: the same tokenizer type; both add BOS or neither, and the same BOS id where
    they add it (likewise EOS); vocabulary sizes within 128; the same text from id 5 on."""

    def fail(what: str) -> None:
        raise IncompatiblePairError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: {what}; "
            "use a draft model from the same family (same tokenizer), or let it draft "
            "across tokenizers with --cross-vocab (models.toml [defaults]: cross_vocab = true)"
        )

    if target.vocab_type != draft.vocab_type:
        names = [VOCAB_TYPES.get(v, str(v)) for v in (target.vocab_type, draft.vocab_type)]
        fail(f"tokenizer types differ ({names[0]} vs {names[1]})")
    # A BOS/EOS id matters only where the tokenizers add it to every prompt.
    for name, adds, ids in (("BOS", (target.adds_bos, draft.adds_bos), (target.bos, draft.bos)),
                            ("EOS", (target.adds_eos, draft.adds_eos), (target.eos, draft.eos))):
        if adds[0] != adds[1]:
            one, other = ("target", "draft") if adds[0] else ("draft", "target")
            fail(f"the {one} adds {name} to every prompt and the {other} does not")
        if adds[0] and ids[0] != ids[1]:
            fail(f"{name} tokens differ ({ids[0]} vs {ids[1]})")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        fail(f"vocabulary sizes differ ({target.n_vocab} vs {draft.n_vocab} tokens)")
    for token in range(FIRST_COMPARED_TOKEN, min(target.n_vocab, draft.n_vocab)):
        a, b = target.token_text(token), draft.token_text(token)
        if a != b:
            shown = (a.decode(errors="replace"), b.decode(errors="replace"))
            fail(f"token {token} is {shown[0]!r} vs {shown[1]!r}")


def compatible(target: Model, draft: Model) -> bool:
    """Whether `check_compatible` lets the pair through."""
    try:
        check_compatible(target, draft)
    except IncompatiblePairError:
        return False
    return True

