"""The chain of drafters the round loop asks, and the names `--drafters` takes.

Each round the chain asks its drafters in order for a continuation of the text (tokens a
constraint forces first, always). The first drafter that proposes anything else ends the
chain: its draft is the round's. Every drafter hears how the round ended (`accept`).

Names:
- `lookup`: copy what followed the last tokens before (this call's context, earlier
  calls, a persisted cache, a corpus; engine/drafting/lookup.py);
- `model`: the draft model; after `lookup` in a chain, what earlier replies of one shape
  agree on is spliced into its drafts free;
- `lookup>model`: the draft model, with lookups feeding its own verification (the
  hierarchical chain: each guess it confirms costs no draft step of its own);
- `mtp`: the target's own MTP layers in the draft model's place (engine/llama/mtp.py),
  for a target that has them and no draft model.

A request's prediction of its output (prediction.py) is no name here: given, it joins
whatever chain is in play, first (after a constraint's forced tokens), "none" included;
only a draft length of 0 leaves it out.

`hybrid` is `lookup,model`: the default with a draft model; `lookup` without one;
`none` is nobody (the target alone). `who_drafts` is the one rule from what was asked to
the drafters of a pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from ...errors import InvalidParameterError
from ..constraint import Constraint
from ..llama import DraftModel, DraftTraits
from .base import Ask, Draft, Drafter, Start
from .following import Archives
from .forced import ForcedDrafter
from .lookup import LookupDrafter
from .model import ModelDrafter
from .prediction import Prediction, PredictionDrafter

DRAFTER_NAMES = ("lookup", "model", "lookup>model", "mtp")
#: Words for common chains (the former draft modes).
SHORTHANDS: dict[str, tuple[str, ...]] = {"hybrid": ("lookup", "model")}
NEED_MODEL = frozenset({"model", "lookup>model", "mtp"})  # one of them at most
#: What holds the draft model's place: a draft model, the target's MTP layers, nothing.
DraftKind = Literal["model", "mtp", "none"]


class Drafting(Protocol):
    """What holds the draft model's place, as far as who drafts goes: a DraftModel, or
    chat's view of one in another process."""

    traits: DraftTraits


def draft_kind(model: Drafting | None) -> DraftKind:
    """What drafts as the draft model of a pair: its kind's `--drafters` name, or none."""
    return "none" if model is None else model.traits.drafts_as


def who_drafts(asked: object, model: Drafting | None, target: str = "the target") -> Drafters:
    """The one rule, for every entry point (a flag, models.toml, /set, an API field, the
    Python API): None (nothing asked) is the default for this pair; an empty value or
    "none" is nobody, the target alone; names are checked against what the pair has."""
    kind = draft_kind(model)
    if asked is None:
        return Drafters.default(kind)
    return Drafters.parse(asked).check(kind, target)


class Drafters(tuple[str, ...]):
    """Who drafts, in order: names `--drafters` takes, parsed once where they come in
    (a flag, models.toml, /set, an API argument) and passed on as this value; () for
    nobody (the target alone)."""

    __slots__ = ()

    @classmethod
    def parse(cls, value: object) -> Drafters:
        """`--drafters` text ("lookup,model"), a models.toml list, or a shorthand;
        InvalidParameterError for anything else."""
        if isinstance(value, Drafters):
            return value
        if value == "none" or (isinstance(value, (list, tuple)) and not value):
            return NOBODY
        if isinstance(value, str):
            items = SHORTHANDS.get(value.strip()) or tuple(
                v.strip() for v in value.split(",") if v.strip())
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = tuple(v.strip() for v in value)
        else:
            raise InvalidParameterError(f"drafters must be names separated by commas, "
                                        f"got {value!r}")
        unknown = [v for v in items if v not in DRAFTER_NAMES]
        if unknown or not items:
            raise InvalidParameterError(
                f"drafters must be some of {', '.join(DRAFTER_NAMES)} in order (or "
                f"{', '.join(SHORTHANDS)}, or none), got {', '.join(unknown) or 'nothing'}")
        if len(set(items)) < len(items) or len(NEED_MODEL & set(items)) > 1:
            raise InvalidParameterError(f"drafters name each drafter once and one draft "
                                        f"model at most, got {','.join(items)}")
        return cls(items)

    @classmethod
    def default(cls, kind: DraftKind) -> Drafters:
        """Who drafts unless told, the one rule: lookup where the text repeats itself,
        then what drafts as the draft model (a draft model, or the target's MTP layers).
        docs/performance.md has what each measured."""
        return cls(("lookup",) if kind == "none" else ("lookup", kind))

    def check(self, kind: DraftKind, target: str = "the target") -> Drafters:
        """These names, refused where they need a draft this pair does not have."""
        if "mtp" in self and kind != "mtp":
            raise InvalidParameterError(
                f"drafters mtp draft with the target's own MTP layers, and {target} has "
                "none" if kind == "none" else "drafters mtp draft with the target's own "
                "MTP layers, not with a draft model: name model instead")
        if kind == "none" and NEED_MODEL & set(self):
            raise InvalidParameterError(
                f"drafters {self} need a draft model, but this pair has none "
                "(it drafts by lookup)")
        if kind == "mtp" and {"model", "lookup>model"} & set(self):
            raise InvalidParameterError(
                f"drafters {self} need a draft model; {target} drafts for itself "
                "with its MTP layers: name mtp instead")
        return self

    def __str__(self) -> str:
        return ",".join(self) if self else "none"

    def __repr__(self) -> str:
        return f"Drafters({str(self)!r})"


NOBODY = Drafters()


class DraftChain:
    """Asks `drafters` in order; `idle` ones (a draft model the chain does not use, a
    lookup that only feeds the model) only keep their state in step with the text."""

    def __init__(self, drafters: Sequence[Drafter], idle: Sequence[Drafter] = ()) -> None:
        self.drafters = tuple(drafters)
        self._all = (*self.drafters, *idle)

    def __bool__(self) -> bool:
        return bool(self.drafters)

    @property
    def decode_s(self) -> float:
        return sum(d.decode_s for d in self._all)

    @property
    def behind(self) -> int:
        return max((d.behind for d in self._all), default=0)

    def begin(self, start: Start) -> None:
        for d in self._all:
            d.begin(start)

    def draft(self, ask: Ask) -> Draft:
        out = Draft()
        for drafter in self.drafters:
            if len(out) >= ask.room:
                break
            part = drafter.draft(ask.after(out))
            out.extend(part)
            if len(part) > part.forced:
                break
        return out

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        for d in self._all:
            d.accept(committed, alone_p)

    def end(self, committed: Sequence[int]) -> None:
        for d in self._all:
            d.end(committed)


def build_chain(names: Drafters, *, model: DraftModel | None, p_min: float,
                ends: Callable[[int], bool], shadow: bool, archives: Archives,
                constraint: Constraint | None = None, ahead: int = 0,
                ahead_threads: int = 0, prediction: Prediction | None = None,
                piece: Callable[[int], bytes] | None = None) -> DraftChain:
    """The chain of `names` (checked against the draft model's place: Drafters.check) over the
    pair's draft model (None: none loaded) and what lookups may copy from; `constraint`:
    its forced tokens first; `ahead`: the draft model drafts that many tokens ahead, on
    `ahead_threads` threads, while the target verifies; `prediction`: the request's
    prediction of its output, drafting before the others (`piece`: a target token's
    bytes, to follow the output's text where its tokens differ)."""
    names.check(draft_kind(model))
    lookup = LookupDrafter(archives=archives) if {"lookup", "lookup>model"} & set(names) \
        else None
    drafters: list[Drafter] = [ForcedDrafter(constraint)] if constraint is not None else []
    if prediction is not None and prediction.tokens:
        drafters.append(PredictionDrafter(prediction, piece))
    drafted_by_model = False
    for name in names:
        if name == "lookup":
            assert lookup is not None
            drafters.append(lookup)
            continue
        assert model is not None
        verify = name == "lookup>model"
        if verify and model.traits.vocabulary == "mapped":
            raise InvalidParameterError("drafters lookup>model need a draft model that "
                                        "shares the target's tokenizer")
        drafter = ModelDrafter(model, p_min, ends=ends, shadow=shadow, feeder=lookup,
                               feed="verify" if verify else "splice", ahead=ahead,
                               ahead_threads=ahead_threads,
                               origin="mtp" if name == "mtp" else "model")
        if lookup is not None and not verify:
            lookup.feeds = drafter
        drafters.append(drafter)
        drafted_by_model = True
    idle: list[Drafter] = [] if drafted_by_model or model is None else \
        [ModelDrafter(model, p_min, ends=ends, idle=True)]
    if lookup is not None and lookup not in drafters:
        idle.append(lookup)  # it feeds the model: its index follows the text all the same
    return DraftChain(drafters, idle)
