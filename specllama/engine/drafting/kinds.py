"""Every kind of draft model, in one table: how a kind is recognised, what `--drafters`
calls it, how it loads beside a target, and how a `serve --parallel` slot gets its own.

What a kind can and cannot do (draft ahead on idle cores, predict earlier positions, keep
a cache of its own, serve parallel slots, which vocabulary it drafts in) it declares itself
as `DraftTraits` (llama/views.py); the decoder, the chain, the checks, the server and the
command line read those and this table, never a class. The refusals are made here, one
line each, from the declarations. A new kind is its own module, its tests and a line in
`KINDS`: the model code behind the llama boundary, its entry here.

| kind | recognised by | drafts as |
| --- | --- | --- |
| `model` | any other GGUF given as the draft | `model` |
| `mtp` | the target's own MTP (nextn) layers, with no draft file | `mtp` |
| `gemma4-assistant` | a `gemma4-assistant` GGUF beside a Gemma 4 target | `model` |
| `eagle3` | an `eagle3` GGUF beside the target it was trained on | `model` |

A draft of another tokenizer (`--cross-vocab`) is a view over a `model` kind's file
(crossvocab.py), made where the decoder sees the two vocabularies differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidParameterError, ModelLoadError
from ...paths import cache_dir
from ..llama import DraftModel, DraftTraits, Model
from ..llama.assistant import AssistantDraft
from ..llama.batched import Batcher, SeqView
from ..llama.compat import check_compatible, compatible
from ..llama.eagle3 import Eagle3Draft
from ..llama.gguf import architecture
from ..llama.mtp import MtpDraft, has_mtp
from .crossvocab import CrossVocabDraft
from .vocabmap import VocabMap, check_intersection


@dataclass(frozen=True)
class Beside:
    """What a draft loads with: the target loaded first, and the context's sizes."""

    target: Model
    n_ctx: int
    n_threads: int | None
    n_seq: int


#: A slot's own draft under `serve --parallel`: from the first slot's draft, the slot's
#: view of the target, the batcher that runs every decode, and the slot's sequence.
SlotDraft = Callable[[Model, Model, Batcher, int], Model]


@dataclass(frozen=True)
class DraftKind:
    traits: DraftTraits
    #: The GGUF architecture of its files (None: not recognised by a file of its own).
    architecture: str | None
    load: Callable[[Path, Beside], Model]
    slot: SlotDraft | None = None  # None: it serves one sequence (traits.parallel False)

    @property
    def name(self) -> str:
        return self.traits.kind


def _model(path: Path, at: Beside) -> Model:
    return Model(path, n_ctx=at.n_ctx, n_threads=at.n_threads, n_seq=at.n_seq)


def _mtp(path: Path, at: Beside) -> Model:
    return MtpDraft(at.target)


KINDS: tuple[DraftKind, ...] = (
    DraftKind(Model.traits, None, _model,
              lambda first, target, batcher, seq: SeqView(batcher, seq, first)),
    DraftKind(MtpDraft.traits, None, _mtp,
              lambda first, target, batcher, seq: MtpDraft(target, batcher.call)),
    DraftKind(AssistantDraft.traits, "gemma4-assistant",
              lambda path, at: AssistantDraft(path, at.target)),
    DraftKind(Eagle3Draft.traits, "eagle3", lambda path, at: Eagle3Draft(path, at.target)),
)
_BY_NAME = {k.name: k for k in KINDS}
_BY_ARCH = {k.architecture: k for k in KINDS if k.architecture}


def kind_of(draft: DraftModel) -> DraftKind:
    """The table's entry for a loaded draft (a view's: the kind it is a view of)."""
    return _BY_NAME.get(draft.traits.kind, KINDS[0])


def check_target_file(path: Path) -> None:
    """A file that only drafts (an assistant, an EAGLE3 head) given as the target."""
    kind = _BY_ARCH.get(architecture(path) or "")
    if kind is not None:
        raise ModelLoadError(f"{path.name} is {kind.traits.title}: it drafts for a "
                             "target, as the draft model (--draft)")


def load_draft(path: Path, at: Beside) -> Model:
    """The draft file `path` as its kind loads it beside the loaded target."""
    kind = _BY_ARCH.get(architecture(path) or "", KINDS[0])
    if at.n_seq > 1 and kind.slot is None:
        raise refusal(path, kind.traits, ONE_SEQUENCE)
    return kind.load(path, at)


def self_draft(target: Model) -> Model | None:
    """What drafts for a target given no draft file: its own MTP layers, if it has them."""
    return _BY_NAME["mtp"].load(target.path, Beside(target, target.n_ctx, None, 1)) \
        if has_mtp(target) else None


def slot_draft(first: Model | None, target: Model, batcher: Batcher, seq: int) -> Model | None:
    """A `serve --parallel` slot's own draft, made as the first slot's kind makes it."""
    if first is None:
        return None
    make = kind_of(first).slot
    if make is None:
        raise refusal(first.path, first.traits, ONE_SEQUENCE)
    return make(first, target, batcher, seq)


def in_target_ids(draft: Model, target: Model, cross_vocab: bool) -> DraftModel:
    """The draft as the round loop drives it, in target ids: the file itself where the
    two vocabularies match (refused where they do not), or with `cross_vocab` a view
    through the tokens both spell alike (crossvocab.py)."""
    if cross_vocab and not compatible(target, draft):
        vmap = VocabMap.cached(target, draft, cache_dir())
        check_intersection(vmap, target, draft)
        return CrossVocabDraft(draft, target, vmap)
    check_compatible(target, draft)
    return draft


#: What a kind that cannot serve parallel slots or draft ahead is told, after "so it".
ONE_SEQUENCE = "drafts for one sequence, not for --parallel slots"
NOT_AHEAD = "cannot draft ahead (--draft-threads)"


def refusal(path: Path, traits: DraftTraits, so_it: str) -> InvalidParameterError:
    """The one-line error for a draft asked to do what its kind cannot."""
    because = f": {traits.because}, so" if traits.because else ":"
    return InvalidParameterError(f"{path.name} is {traits.title}{because} it {so_it}")
