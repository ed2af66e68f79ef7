"""The trace page: one self-contained HTML file (inline CSS, JS and SVG; no network)
in the seed demo's colours, rendered from chips and stats. It knows nothing of the
recorder (trace.py), which builds the chips and calls it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import jinja2

from ..engine.drafting.chain import Drafters
from ..engine.loop.stats import Stats

ChipKind = Literal["accepted", "rejected", "target"]


@dataclass(frozen=True)
class TraceToken:
    """One chip of the page: a token in the output, or a rejected draft."""

    token: int
    text: str
    kind: ChipKind  # accepted draft, rejected draft, or chosen by the target itself
    round: int  # 1-based
    position: int | None  # 1-based draft position; None for the target's own token
    p: float | None = None  # p_i(d_i) (drafts only; None where never evaluated)
    q: float | None = None  # q_i(d_i)
    target_kind: str | None = None  # correction, bonus or plain (target tokens only)
    origin: str = ""  # where a lookup draft was seen (suffixcache.ORIGINS), or "prediction"


@dataclass(frozen=True)
class PageGeneration:
    """One generation as the page shows it: what it answers, and its chips."""

    label: str | None
    chips: Sequence[TraceToken]

_CSS = {"accepted": "accepted", "target": "corrected", "rejected": "rejected"}
#: Where a draft was copied from (a lookup's text, the prediction), as the legend and a
#: chip's title say it.
_ORIGIN = {"context": "copied from this context", "session": "copied from an earlier output",
           "persisted": "copied from the draft cache", "corpus": "copied from the corpus",
           "prediction": "copied from the prediction (generate --predict)"}
_TARGET_KIND = {"correction": "correction after a rejection", "bonus": "bonus after a fully "
                "accepted draft", "plain": "plain step (no draft)"}


def _prob(name: str, value: float | None) -> str:
    return f"{name} not evaluated (after the first rejection)" if value is None else (
        f"{name} {value:.3f}")


def _chip(c: TraceToken) -> dict[str, Any]:
    if c.kind == "target":
        title = f"round {c.round} · from the target: {_TARGET_KIND.get(c.target_kind or '', '')}"
    else:
        verdict = "accepted" if c.kind == "accepted" else "rejected"
        title = (f"round {c.round} · draft position {c.position} · {verdict} · "
                 f"{_prob('p', c.p)} · {_prob('q', c.q)}")
        if c.origin:
            title += f" · {_ORIGIN.get(c.origin, c.origin)}"
    display = c.text.replace("\n", "↵").replace("\t", "→") or "∅"
    return {
        "kind": _CSS[c.kind],
        "css": _CSS[c.kind] + ("" if c.text else " empty")
        + (f" origin-{c.origin}" if c.origin in _ORIGIN else ""),
        "round": c.round,
        "title": title + ("" if c.text else " · no text (e.g. end of generation)"),
        "display": display,
        "newline": c.kind != "rejected" and c.text.endswith("\n"),
    }


def render_page(generations: Sequence[PageGeneration], stats: Stats, *,
                title: str = "specllama trace", meta: str = "") -> str:
    """The page: the generations' chips, the totals `stats`, one line `meta` on the run."""
    bars = []
    for i, (rate, reached) in enumerate(zip(stats.acceptance_by_position, stats.reached_at)):
        bars.append({
            "x": 10 + i * 46,
            "height": round(100 * rate, 1),
            "pct": f"{rate:.0%}",
            "position": i + 1,
            "title": f"position {i + 1}: {stats.accepted_at[i]} of {reached} accepted",
        })
    summary = (f"{stats.accepted} of {stats.drafted} drafts accepted "
               f"({stats.acceptance_rate:.1%}); {stats.tokens_per_s:.1f} tok/s; "
               f"time: target {stats.target_s:.2f} s, draft {stats.draft_s:.2f} s, "
               f"total {stats.generate_s:.2f} s")
    template = jinja2.Environment(autoescape=True).from_string(
        resources.files("specllama.cli").joinpath("templates/trace.html").read_text("utf-8")
    )
    return template.render(
        title=title,
        meta=meta,
        stats=stats,
        tokens_per_step=f"{stats.tokens_per_step:.2f}×" if stats.target_steps else "—",
        generations=[{"label": g.label, "chips": [_chip(c) for c in g.chips]}
                     for g in generations],
        origins=[(o, _ORIGIN[o]) for o in _ORIGIN
                 if any(c.origin == o for g in generations for c in g.chips)],
        bars=bars,
        chart_width=20 + 46 * max(len(bars), 1),
        summary=summary,
    )


def trace_meta(settings: dict[str, Any]) -> str:
    """The trace page's one line about the run."""
    models = Path(settings["target"]).name
    if settings["draft"]:
        models += " + " + (settings["draft"] if settings["draft"] == "lookup"
                           else Path(settings["draft"]).name)
    return (f"{models} · temperature {settings['temperature']:g} · draft_max "
            f"{settings['draft_max']} · drafters {Drafters(settings['drafters'])}"
            + (f" · seed {settings['seed']}" if settings["seed"] is not None else ""))
