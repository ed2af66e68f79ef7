"""The chat REPL: reads lines, runs slash commands, renders replies."""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from ... import DraftProposed, Event, RoundVerified, TargetToken, TextFlushed, TokensAccepted
from ...console import stderr_console
from ...engine.settings import LIVE_SETTINGS
from ...errors import InvalidParameterError, SpecLlamaError
from ...policy.cpumeter import CpuMeter
from ..liveview import LiveDrafts
from ..trace import token_piece
from ..ui import TokenPrinter, stats_footer, stats_table
from .session import ChatSession, HistoryTrimmed
from .signals import sigint_ignored

HELP = [
    ("/help", "this list"),
    ("/reset", "start a new conversation"),
    ("/stats", "totals of this session"),
    ("/set [NAME VALUE]", "show settings, or change one: " + ", ".join(LIVE_SETTINGS)
     + ", show_drafts (on/off), pace (ms)"),
    ("/system [TEXT|-]", "show, set or ('-') remove the system prompt"),
    ("/retry", "send again the last message, when its reply failed"),
    ("/save FILE", "save the conversation (FILE.json: JSON, FILE.html: trace page, "
                   "else Markdown)"),
    ("/exit", "quit (also /quit, Ctrl-D)"),
]
COMMANDS = ("help", "reset", "stats", "set", "system", "retry", "save", "exit", "quit")
_FINISH_NOTES = {
    "interrupted": "interrupted",
    "length": "cut at max_tokens",
    "context": "cut: the context window is full",
    "error": "cut by an error",
}


class _Exit(Exception):
    pass


class ChatREPL:
    """Reads lines, runs slash commands, renders replies. Text to `out`, the rest to `err`."""

    def __init__(
        self,
        session: ChatSession,
        *,
        out: TextIO | None = None,
        err: Console | None = None,
        color: bool | None = None,
        interactive: bool = False,
        show_drafts: bool = False,
        pace_ms: int = 0,
    ) -> None:
        self.session = session
        self.out = out or sys.stdout
        self.err = err or stderr_console()
        self.color = color
        self.interactive = interactive
        self._told_off = False  # said once that speculation is off, and why
        self.show_drafts = show_drafts  # display settings: /set show_drafts, /set pace
        self.pace_ms = pace_ms

    # ----------------------------------------------------------------- input
    def lines(self) -> Iterator[str | None]:
        """User lines; None for a line cleared by Ctrl-C. Ends at EOF (Ctrl-D)."""
        if self.interactive and sys.stdin.isatty() and self.out.isatty():
            yield from self._prompt_toolkit_lines()
            return
        stdin = sys.stdin
        while True:
            if self.interactive:
                self.err.file.write("> ")
                self.err.file.flush()
            try:
                line = stdin.readline()
            except KeyboardInterrupt:
                if not self.interactive:
                    raise
                self.err.file.write("\n")
                yield None
                continue
            if not line:
                return
            yield line.rstrip("\r\n")

    def _prompt_toolkit_lines(self) -> Iterator[str | None]:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history: Any = InMemoryHistory()
        try:  # kept across sessions, like a shell's; in memory if the file cannot be
            import platformdirs

            path = Path(platformdirs.user_state_dir("specllama")) / "chat_history"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8"):
                pass
            history = FileHistory(str(path))
        except OSError:
            pass
        prompt: PromptSession[str] = PromptSession(history=history)
        while True:
            try:
                yield prompt.prompt("> ")
            except KeyboardInterrupt:  # Ctrl-C at the prompt: the line is cleared
                yield None
            except EOFError:  # Ctrl-D
                return

    # ------------------------------------------------------------------ loop
    def run(self, lines: Iterable[str | None] | None = None) -> int:
        """The loop; returns the exit code (130 when a piped run is interrupted)."""
        session = self.session
        if session.notice:
            self.err.print(f"[yellow]notice:[/yellow] {session.notice}", markup=True)
        if self.interactive:
            self._banner()
        try:
            for line in self.lines() if lines is None else lines:
                if line is None or not line.strip():
                    continue
                if line.lstrip().startswith("/"):
                    self.command(line.strip())
                    continue
                if not self.answer(line):
                    self.show_totals()
                    return 130
        except _Exit:
            pass
        except KeyboardInterrupt:
            self.err.print("interrupted")
            self.show_totals()
            return 130
        self.show_totals()
        return 0

    def _banner(self) -> None:
        s = self.session.settings
        d = self.session.decoder
        names = d.target.path.name + (f" + {d.draft.path.name}" if d.draft else " (lookup drafts)")
        self.err.print(
            Text.assemble(
                ("specllama chat", "bold"),
                f"  {names}  n_ctx {s.n_ctx}  draft_max {s.draft_max}"
                f"  temperature {s.sampling.temperature:g}",
            )
        )
        line = Text("/help for commands, Ctrl-C stops a reply, Ctrl-D quits", style="dim")
        printer = TokenPrinter(self.out, color=self.color)
        if printer.color:
            line = Text.assemble(printer.legend(), "   ", line)
        self.err.print(line)

    # ---------------------------------------------------------------- replies
    def answer(self, text: str) -> bool:
        """One reply, rendered; False when a piped run was interrupted (stop there)."""
        printer = self._reply_printer()
        try:
            events = self.session.reply(text)
        except SpecLlamaError as exc:
            self.error(exc)
            return True
        except KeyboardInterrupt:  # while rendering: nothing has changed yet
            self.err.print(Text("(cancelled)", style="yellow"))
            return self.interactive
        meter = CpuMeter()
        meter.start()
        try:
            interrupted = self._render(events, printer)
        except SpecLlamaError as exc:
            printer.close()
            self._end_line(printer)
            self.error(exc)
            return True
        printer.close()
        self._end_line(printer)
        self._show_outcome(busy=meter.stop(), interrupted=interrupted)
        return self.interactive or not interrupted

    def _reply_printer(self) -> TokenPrinter | LiveDrafts:
        plain = TokenPrinter(self.out, color=self.color)
        if plain.color and (self.show_drafts or self.pace_ms):
            return LiveDrafts(self.out, token_piece(self.session.decoder), pace_ms=self.pace_ms)
        return plain

    def _render(self, events: Generator[Event | HistoryTrimmed, None, None],
                printer: TokenPrinter | LiveDrafts) -> bool:
        """The reply's events as they come; True when Ctrl-C stopped it. The caches are
        put back in order (events.close()) on Ctrl-C or an error."""
        started = False
        try:
            for event in events:
                if isinstance(event, HistoryTrimmed):
                    self._notice_trimmed(event)
                elif isinstance(event, (TokensAccepted, TargetToken, TextFlushed)):
                    if not started:
                        # The first piece often carries the tokenizer's leading space.
                        stripped = event.text.lstrip()
                        if not stripped:
                            continue
                        event = dataclasses.replace(event, text=stripped)
                        started = True
                    printer.show(event)
                elif isinstance(event, (DraftProposed, RoundVerified)):
                    printer.show(event)
        except KeyboardInterrupt:
            with sigint_ignored():
                events.close()
            return True
        except SpecLlamaError:
            with sigint_ignored():
                events.close()
            raise
        return False

    def _notice_trimmed(self, event: HistoryTrimmed) -> None:
        self.err.print(
            f"[yellow]notice:[/yellow] the conversation no longer fits the context "
            f"window ({event.n_ctx} tokens): dropped the {event.turns} oldest "
            f"{'turn' if event.turns == 1 else 'turns'} ({event.tokens_before} -> "
            f"{event.tokens_after} tokens)"
            + ("; the system prompt is kept" if self.session.system else ""),
            markup=True,
        )

    def _show_outcome(self, *, busy: float | None, interrupted: bool) -> None:
        """The reply's stats line, or why there is no reply."""
        turn = self.session.last_turn
        result = turn.result if turn else None
        if result is not None:
            footer = stats_footer(result.stats, busy=busy)
            note = _FINISH_NOTES.get(result.finish_reason)
            if note:
                footer.append(f"  ({note})", style="yellow")
            self.err.print(footer)
            if not result.stats.drafted and result.stats.policy_note and not self._told_off:
                # Once a session: why there were no drafts (auto found they cannot pay).
                self._told_off = True
                self.err.print(Text(f"speculation off: the target decodes alone "
                                    f"({result.stats.policy_note})", style="yellow"))
        elif interrupted:
            self.err.print(Text("(interrupted before the reply began; message withdrawn)",
                                style="yellow"))

    def _end_line(self, printer: TokenPrinter | LiveDrafts) -> None:
        if printer.printed and not printer.printed.endswith("\n"):
            self.out.write("\n")
        elif not printer.printed:
            self.out.write("\n")
        self.out.flush()

    def error(self, exc: BaseException) -> None:
        self.err.print(Text(f"error: {exc}", style="red"))

    # --------------------------------------------------------------- commands
    def command(self, line: str) -> None:
        name, _, arg = line[1:].partition(" ")
        name = name.lower()
        arg = arg.strip()
        handler: Callable[[str], None] | None = {
            "help": self.cmd_help,
            "?": self.cmd_help,
            "reset": self.cmd_reset,
            "clear": self.cmd_reset,
            "stats": self.cmd_stats,
            "set": self.cmd_set,
            "system": self.cmd_system,
            "retry": self.cmd_retry,
            "save": self.cmd_save,
            "exit": self.cmd_exit,
            "quit": self.cmd_exit,
            "debug-cache": self.cmd_debug_cache,
        }.get(name)
        if handler is None:
            close = difflib.get_close_matches(name, COMMANDS, n=1)
            hint = f"did you mean /{close[0]}? " if close else ""
            self.err.print(Text(f"unknown command /{name}; {hint}/help lists the commands",
                                style="yellow"))
            return
        try:
            handler(arg)
        except SpecLlamaError as exc:
            self.error(exc)

    def cmd_help(self, arg: str) -> None:
        width = max(len(c) for c, _ in HELP)
        for cmd, what in HELP:
            self.err.print(Text.assemble((cmd.ljust(width), "bold"), "  ", what))
        self.err.print(
            Text("Anything else is sent to the model. Up/Down: history. Ctrl-C stops a reply.",
                 style="dim")
        )

    def cmd_reset(self, arg: str) -> None:
        self.session.reset()
        self.err.print(Text("new conversation", style="dim"))

    def cmd_stats(self, arg: str) -> None:
        self.show_totals(title_prefix="session", why=True)
        s = self.session
        self.err.print(
            Text(
                f"conversation: {s.context_tokens()} of {s.decoder.n_ctx} context tokens; "
                f"{len(s.messages) - s.first_kept} messages in context"
                + (f" ({s.first_kept} dropped)" if s.first_kept else ""),
                style="dim",
            )
        )

    def cmd_set(self, arg: str) -> None:
        if not arg:
            values = self.session.settings.as_dict()
            values.update(show_drafts="on" if self.show_drafts else "off", pace=self.pace_ms)
            for name in (*LIVE_SETTINGS, "show_drafts", "pace"):
                self.err.print(Text.assemble((f"{name:12}", "dim"), str(values[name])))
            return
        name, _, value = arg.partition(" ")
        if "=" in name and not value:
            name, _, value = name.partition("=")
        if name.lower().replace("-", "_") in ("show_drafts", "pace"):
            self.set_view(name.lower().replace("-", "_"), value.strip())
            return
        key, parsed = self.session.set(name, value)
        self.err.print(Text(f"{key} = {parsed}", style="dim"))

    def set_view(self, name: str, value: str) -> None:
        """The REPL's own display settings: not in the settings table, which holds what
        the engine uses (the session never sees these)."""
        if name == "pace":
            if not value.isdigit():
                raise InvalidParameterError(f"pace: expected milliseconds >= 0, got {value!r}")
            self.pace_ms = int(value)
        elif value.lower() in ("on", "off", "true", "false", "1", "0"):
            self.show_drafts = value.lower() in ("on", "true", "1")
        else:
            raise InvalidParameterError(f"show_drafts: expected on or off, got {value!r}")
        shown = self.pace_ms if name == "pace" else ("on" if self.show_drafts else "off")
        self.err.print(Text(f"{name} = {shown}", style="dim"))

    def cmd_system(self, arg: str) -> None:
        s = self.session
        if not arg:
            self.err.print(s.system if s.system else Text("(no system prompt)", style="dim"))
            return
        s.set_system(None if arg == "-" else arg)
        self.err.print(Text("system prompt " + ("removed" if arg == "-" else "set")
                            + "; it applies from the next reply", style="dim"))

    def cmd_retry(self, arg: str) -> None:
        text = self.session.unanswered
        if text is None:
            self.err.print(Text("nothing to retry: the last message has its reply", style="dim"))
            return
        self.answer(text)

    def cmd_save(self, arg: str) -> None:
        if not arg:
            raise InvalidParameterError("/save needs a file name, e.g. /save chat.md")
        kind = self.session.save(arg)
        self.err.print(Text(f"saved the conversation to {arg} ({kind})", style="dim"))

    def cmd_exit(self, arg: str) -> None:
        raise _Exit

    def cmd_debug_cache(self, arg: str) -> None:
        report = self.session.cache_report()
        self.err.print(" ".join(f"{k}={v}" for k, v in report.as_dict().items()))

    def show_totals(self, title_prefix: str = "session", why: bool = False) -> None:
        s = self.session
        if not s.replies:
            return
        self.err.print(
            stats_table(s.totals, title=f"{title_prefix}: {_plural(s.replies, 'reply', 'replies')}",
                        comparison=s.compare(), why=why)
        )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
