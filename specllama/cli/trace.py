"""The trace recorder: engine events -> one record per round, and per token, as JSON.

Built from events only: `DraftProposed` is implied by `RoundVerified.drafted`, whose
tail past the accepted prefix is what the target rejected. Token texts come from the
target's pieces, decoded incrementally so a character split across tokens shows once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..engine.loop.events import Event, Finished, GenerationResult, RoundVerified
from ..engine.loop.stats import Stats
from ..engine.loop.textstream import TokenTexts
from ..errors import InvalidParameterError
from .tracepage import PageGeneration, TraceToken, render_page, trace_meta

if TYPE_CHECKING:
    from ..engine.llama import Vocabulary

TRACE_FORMAT = "specllama-trace/1"


@dataclass
class Generation:
    """One generation (a `generate` run, or one chat reply) as rounds and chips."""

    label: str | None = None  # what it answers (the chat's user message)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    chips: list[TraceToken] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    stats: Stats | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "stats": self.stats.to_dict() if self.stats else None,
            "rounds": self.rounds,
        }


class TraceRecorder:
    """Feed it every event of one or more generations; read `generations` or save."""

    def __init__(self, piece: Callable[[int], bytes], settings: dict[str, Any] | None = None):
        self.settings = settings or {}
        self.generations: list[Generation] = []
        self._texts = TokenTexts(piece)
        self._result: GenerationResult | None = None  # the last one recorded

    def begin(self, label: str | None = None) -> None:
        """Start a new generation (the next one also starts by itself after Finished)."""
        self.generations.append(Generation(label))
        self._texts.reset()

    def clear(self) -> None:
        self.generations.clear()

    def feed(self, event: Event) -> None:
        if isinstance(event, RoundVerified):
            if not self.generations or self.generations[-1].stats is not None:
                self.begin()
            self._round(self.generations[-1], event)
        elif isinstance(event, Finished):
            self.finish(event.result)

    def finish(self, result: GenerationResult | None) -> None:
        """The generation's result (also after Ctrl-C, where no Finished came)."""
        if result is None or result is self._result:
            return
        self._result = result
        if not self.generations or self.generations[-1].stats is not None:
            self.begin()  # a generation without a single round
        gen = self.generations[-1]
        gen.text, gen.finish_reason = result.text, result.finish_reason
        gen.prompt_tokens, gen.stats = result.prompt_tokens, result.stats

    def _round(self, gen: Generation, ev: RoundVerified) -> None:
        n = len(gen.rounds) + 1
        shown = min(ev.accepted, ev.emitted)  # accepted drafts that reached the output
        ends_with_target = ev.emitted > shown
        accepted = self._texts.take(ev.drafted[:shown])
        rest = self._texts.peek(ev.drafted[shown:])  # rejected (or cut short by EOS)
        rejected = rest if ends_with_target else []
        target_text = self._texts.take((ev.token,))[0] if ends_with_target else None
        # where each draft's text was seen ("" for a model's or a constraint's own)
        seen = ["" if o in ("model", "forced") else o for o in ev.origins]
        chips = [TraceToken(t, s, "accepted", n, i + 1, ev.p[i], ev.q[i], origin=seen[i])
                 for i, (t, s) in enumerate(zip(ev.drafted, accepted))]
        chips += [TraceToken(t, s, "rejected", n, shown + i + 1, ev.p[shown + i], ev.q[shown + i],
                             origin=seen[shown + i])
                  for i, (t, s) in enumerate(zip(ev.drafted[shown:], rejected))]
        if target_text is not None:
            chips.append(TraceToken(ev.token, target_text, "target", n, None,
                                    target_kind=ev.kind))
        gen.chips += chips
        gen.rounds.append(ev.record(n, accepted + rest, target_text))

    @property
    def totals(self) -> Stats:
        total = Stats()
        for gen in self.generations:
            if gen.stats is not None:
                total.merge(gen.stats)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TRACE_FORMAT,
            "settings": self.settings,
            "stats": self.totals.to_dict(),
            "generations": [g.to_dict() for g in self.generations],
        }

    def save(self, path: str | Path, *, title: str = "specllama trace",
             meta: str | None = None) -> str:
        """Write FILE.json (the records) or FILE.html (the page); returns which.
        The page's `meta` (one line about the run) defaults to one from the settings."""
        path = Path(path).expanduser()
        kind = trace_kind(path)
        if kind == "JSON":
            body = json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n"
        else:
            if meta is None:
                meta = trace_meta(self.settings) if self.settings else ""
            pages = [PageGeneration(g.label, g.chips) for g in self.generations]
            body = render_page(pages, self.totals, title=title, meta=meta)
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise InvalidParameterError(f"cannot write {path}: {exc.strerror or exc}") from None
        return kind


class _Pair(Protocol):
    @property
    def target(self) -> Vocabulary: ...
    @property
    def draft(self) -> Vocabulary | None: ...


def token_piece(decoder: _Pair) -> Callable[[int], bytes]:
    """Text of any token a round may show: the target's, or for an id only the draft's
    vocabulary has (a rejected draft of an uneven pair) the draft model's."""
    target, draft = decoder.target, decoder.draft

    def piece(token: int) -> bytes:
        if token < target.n_vocab:
            return target.piece(token)
        return draft.piece(token) if draft is not None and token < draft.n_vocab else b""

    return piece


def trace_kind(path: str | Path) -> Literal["HTML", "JSON"]:
    """What a trace file name asks for; InvalidParameterError for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        return "HTML"
    if suffix == ".json":
        return "JSON"
    raise InvalidParameterError(f"a trace file must end in .html or .json, got {str(path)!r}")
