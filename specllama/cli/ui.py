"""All terminal output: the coloured token stream, the stats panel (the stderr console
and its spinner: ../console.py).

Colours follow the seed demo: accepted draft tokens green, tokens the target
chose itself yellow, pending drafts blue. Generated text goes to stdout,
everything else to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.loop.events import DraftProposed, Event, TargetToken, TextFlushed, TokensAccepted
from ..engine.loop.stats import Stats
from ..policy.compare import Comparison
from ..policy.cpumeter import BUSY_WARN

ACCEPTED = "green"
TARGET = "yellow"
PENDING = "blue"  # drafts awaiting the verdict (liveview)
PREDICTED = "magenta"  # drafts from the prediction (generate --predict), awaiting it


class TokenPrinter:
    """Writes generated text as it arrives; coloured only when asked and on a terminal."""

    def __init__(self, out: TextIO | None = None, *, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        if color is None:
            color = self.out.isatty() and not os.environ.get("NO_COLOR")
        self.color = color
        self._console = Console(file=self.out, highlight=False, soft_wrap=True,
                                force_terminal=color or None, no_color=not color)
        # The escape codes around a piece of text in each style, rendered by rich once:
        # printing every token through rich costs ~0.15 ms, a write costs nothing.
        self._codes = {style: self._codes_for(style) for style in (ACCEPTED, TARGET)}
        self.printed = ""

    def _codes_for(self, style: str) -> tuple[str, str]:
        with self._console.capture() as captured:
            self._console.print(Text("\0", style=style), end="")
        before, _, after = captured.get().partition("\0")
        return before, after

    def show(self, event: Event) -> None:
        if isinstance(event, TokensAccepted):
            self._write(event.text, ACCEPTED)
        elif isinstance(event, TargetToken):
            self._write(event.text, TARGET)
        elif isinstance(event, TextFlushed):
            self._write(event.text, None)
        elif isinstance(event, DraftProposed):
            pass  # plain output shows verified text only; liveview.LiveDrafts shows drafts

    def close(self) -> None:
        """Nothing waits to be drawn here (`liveview.LiveDrafts` has a tail to clear)."""

    def _write(self, text: str, style: str | None) -> None:
        if not text:
            return
        self.printed += text
        if self.color and style:
            before, after = self._codes[style]
            text = before + text + after
        self.out.write(text)
        self.out.flush()

    def legend(self) -> Text:
        return Text.assemble(("accepted draft", ACCEPTED), "  ", ("from target", TARGET))


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def stats_table(stats: Stats, *, title: str = "specllama", comparison: Comparison | None = None,
                busy: float | None = None, why: bool = False) -> Table:
    """The stats panel. It leads with how the run compares with the target alone
    (`comparison`) and, when other processes took much of the CPU (`busy`), says so;
    `why` adds the draft-length policy's reasoning (--verbose, /stats)."""
    table = Table(title=title, show_header=False, box=None, pad_edge=False, title_justify="left")
    table.add_column(style="dim")
    table.add_column()
    off = comparison is not None and comparison.verdict == "off"
    if comparison is not None:
        table.add_row("speculation", Text(comparison.line(stats.policy_note if off else ""),
                                          style=VERDICT_STYLES[comparison.verdict]))
    if busy is not None and busy >= BUSY_WARN:
        table.add_row("busy", Text(busy_warning(busy), style="yellow"))
    table.add_row("tokens", f"{stats.tokens} in {stats.target_steps} target steps "
                  f"({stats.tokens_per_step:.2f} per step)")
    if stats.drafted:
        by_pos = " ".join(f"{a:.0%}" for a in stats.acceptance_by_position[:8])
        table.add_row("drafts", f"{stats.accepted}/{stats.drafted} accepted "
                      f"({stats.acceptance_rate:.1%}); by position {by_pos}")
    elif not stats.forced:
        table.add_row("drafts", "none (target alone)")
    looked_up = {o: n for o, n in stats.origin_drafted.items() if o not in ("mtp", "prediction")}
    if "prediction" in stats.origin_drafted:
        table.add_row("prediction", f"{stats.origin_accepted.get('prediction', 0)}/"
                      f"{stats.origin_drafted['prediction']} drafts from it accepted")
    if "mtp" in stats.origin_drafted:
        table.add_row("mtp drafts", f"{stats.origin_accepted.get('mtp', 0)}/"
                      f"{stats.origin_drafted['mtp']} accepted (the target's own MTP layers)")
    if looked_up:
        table.add_row("lookup from", ", ".join(
            f"{origin} {stats.origin_accepted.get(origin, 0)}/{n}"
            for origin, n in looked_up.items()) + " accepted"
            + (f" ({stats.spliced_accepted}/{stats.spliced} inside model drafts, following "
               "earlier replies)" if stats.spliced else ""))
    if stats.ahead:
        table.add_row("drafted ahead", f"{stats.ahead_accepted}/{stats.ahead} accepted (drawn "
                      "while the target verified the round before)")
    if stats.forced or stats.mask_s:
        share = stats.mask_s / (stats.generate_s or 1.0)
        table.add_row("constraint", f"{stats.forced_accepted}/{stats.forced} forced tokens "
                      f"accepted (drafted free); token masks {share:.1%} of the time")
    table.add_row("speed", f"{stats.tokens_per_s:.1f} tok/s generating; prompt "
                  f"{stats.prompt_tokens} tokens in {_fmt_s(stats.prompt_s)}"
                  + (f" ({stats.prompt_reused} reused)" if stats.prompt_reused else ""))
    g = stats.generate_s or 1.0
    table.add_row("time", f"{_fmt_s(stats.generate_s)}: target {stats.target_s / g:.0%}, "
                  f"draft {stats.draft_s / g:.0%}, overhead {stats.overhead_share:.1%}")
    if stats.policy_note and not off:  # when off, the first line gave the note
        table.add_row("draft length", f"mean {stats.mean_draft_length:.2f}; {stats.policy_note}")
    if why and stats.policy_detail:
        table.add_row("why", stats.policy_detail)
    table.add_row("target on", stats.target_at)
    if stats.rewind:
        table.add_row("rewind", stats.rewind)
    return table


VERDICT_STYLES = {"helped": "green", "hurt": "red", "even": "", "off": "yellow"}


def busy_warning(busy: float) -> str:
    return (f"other processes used {busy:.0%} of the CPU during this run: these figures "
            "are lower and noisier than this machine's")


def stats_footer(stats: Stats, *, busy: float | None = None) -> Text:
    """One line under each chat reply."""
    parts = [f"{stats.tokens} tok", f"{stats.tokens_per_s:.1f} tok/s",
             f"{stats.tokens_per_step:.2f} tok/step"]
    if stats.drafted:
        parts.insert(1, f"accept {stats.acceptance_rate:.0%}")
    footer = Text("  ".join(parts), style="dim")
    if busy is not None and busy >= BUSY_WARN:
        footer.append(f"  (busy: other processes used {busy:.0%} of the CPU)", style="yellow")
    return footer

