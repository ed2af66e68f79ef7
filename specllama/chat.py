"""`specllama chat`: a conversation that stays fast however long it gets.

Two layers:

- `ChatSession` (no printing) holds the conversation, the settings and the
  decoder. `reply(text)` renders the whole conversation with the model's own
  chat template, turns it into tokens and streams the answer with
  `keep_cache=True`, so both KV caches keep the common prefix and a turn
  evaluates only its new tokens.
- `ChatREPL` reads lines (prompt_toolkit on a terminal, plain lines from a
  pipe), runs slash commands and renders the events.

Prefix reuse needs the tokens of earlier turns to stay identical from turn to
turn. Re-tokenizing the rendered text does not guarantee that: a model may
generate "Hel" + "lo" where the tokenizer would write "Hello". So the session
keeps the token history itself: the tokens of the previous prompt, then the
tokens the model really generated, then the tokenized rest of the new
rendering (the template's end-of-turn marker, the new user message, the
assistant header). The rest is tokenized on its own only where that cannot
change the tokenization: when it starts with a special token. Whenever this
does not hold (the template rendered earlier turns differently, turns were
dropped, no template), the full rendering is tokenized and the engine still
reuses the longest common token prefix.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import json
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import click
from rich.console import Console
from rich.text import Text

from .config import validate_setting
from .errors import ContextOverflowError, InvalidParameterError, SpecLlamaError
from .events import (
    DraftProposed,
    Event,
    Finished,
    PromptEvaluated,
    RoundVerified,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from .liveview import LiveDrafts
from .options import (
    DRAFT_MODES,
    RunSettings,
    model_options,
    open_decoder,
    pass_options,
    sampling_options,
    view_options,
)
from .speculative import GenerationResult, SpeculativeDecoder
from .stats import Stats
from .trace import TraceRecorder
from .ui import TokenPrinter, stats_footer, stats_table, stderr_console

# Settings `/set` can change while the models stay loaded.
SETTABLE = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "max_tokens",
    "draft_max",
    "draft_mode",
    "p_min",
)
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed")
_FIXED_AT_LOAD = ("n_ctx", "threads")
_ALIASES = {"temp": "temperature", "t": "temperature", "k": "draft_max", "max": "max_tokens"}

# Used when a model has no usable chat template.
PLAIN_STOP = ("\nUser:",)


# ----------------------------------------------------------------------------- session


@dataclass
class Message:
    role: str  # "user" or "assistant"
    content: str
    finish_reason: str | None = None  # assistant messages: why the reply ended


@dataclass(frozen=True)
class HistoryTrimmed:
    """The conversation outgrew the context window: the oldest turns were dropped
    (the system prompt is kept). Yielded by `ChatSession.reply` before generation."""

    turns: int  # user/assistant pairs dropped
    tokens_before: int  # prompt length with them
    tokens_after: int  # prompt length without them
    n_ctx: int


@dataclass
class TurnInfo:
    """What one reply cost: counted, not timed (the prefix-reuse tests read these)."""

    prompt_tokens: int  # the whole conversation as the model sees it
    reused: int  # prompt tokens the target's cache already held
    prompt_evaluated: dict[str, int]  # tokens decoded to bring each cache up to date
    evaluated: dict[str, int]  # tokens decoded during the whole reply
    result: GenerationResult | None = None
    trimmed: HistoryTrimmed | None = None
    prompt_text: str = ""  # the rendered conversation

    @property
    def finish_reason(self) -> str:
        return self.result.finish_reason if self.result else "interrupted"


@dataclass
class _Anchor:
    """The previous turn as token history: its prompt (text and tokens), and the
    reply the model generated (text as stored in the message, and tokens)."""

    prompt_text: str
    prompt_tokens: list[int]
    reply_text: str
    reply_tokens: list[int]


def parse_setting(name: str, raw: str) -> tuple[str, Any]:
    """`/set NAME VALUE` -> (canonical name, validated value); InvalidParameterError
    with one line of explanation otherwise."""
    key = _ALIASES.get(name.lower(), name.lower().replace("-", "_"))
    if key in _FIXED_AT_LOAD:
        flag = "--" + key.replace("_", "-")
        raise InvalidParameterError(
            f"{key} is fixed once the models are loaded; restart with {flag}"
        )
    if key not in SETTABLE:
        close = difflib.get_close_matches(key, SETTABLE, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InvalidParameterError(
            f"unknown setting {name!r}{hint}; settable: {', '.join(SETTABLE)}"
        )
    text = raw.strip()
    if not text:
        raise InvalidParameterError(f"/set {key} needs a value")
    if key == "draft_mode":
        if text not in DRAFT_MODES:
            raise InvalidParameterError(f"draft_mode: must be one of {', '.join(DRAFT_MODES)}")
        return key, text
    if key == "seed" and text.lower() in ("none", "off", "random"):
        return key, None
    if key == "draft_max" and text in ("auto", "heuristic"):
        return key, text
    value: Any
    try:
        value = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            value = text
    return key, validate_setting(key, value)


class ChatSession:
    """A conversation with a loaded decoder. Never prints.

    `reply(text)` yields the engine's events (plus `HistoryTrimmed`) and records
    the assistant's message when the stream ends, however it ends (finished,
    closed early, interrupted by Ctrl-C): a partial reply stays in the history.
    """

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        settings: RunSettings,
        *,
        system: str | None = None,
    ) -> None:
        self.decoder = decoder
        self.settings = settings
        self.system = system or None
        self.messages: list[Message] = []  # this conversation, dropped turns included
        self.first_kept = 0  # messages[first_kept:] are what the model sees
        self.totals = Stats()  # every reply of the session
        self.replies = 0
        self.last_turn: TurnInfo | None = None
        self.committed: list[int] = []  # tokens of the last prompt + reply (cache check)
        self._anchor: _Anchor | None = None
        self.template: str | None = decoder.target.chat_template()
        self.fold_system = False  # template rejects the system role: prepend to 1st user
        self.notice: str | None = None  # one line for the user about the template
        self.trace = TraceRecorder(decoder.target.piece)  # for /save FILE.html
        self._check_template()

    # ------------------------------------------------------------- templates
    @property
    def plain_format(self) -> bool:
        return self.template is None

    def _check_template(self) -> None:
        name = self.decoder.target.path.name
        if self.template is None:
            self.notice = (
                f"{name} has no chat template in its metadata; using a plain "
                "'User: / Assistant:' format"
            )
            return
        probe = [{"role": "user", "content": "Hello"}]
        try:
            self.decoder.target.format_chat(probe, self.template)
        except Exception as exc:  # a template can fail in any jinja2 way
            self.notice = (
                f"the chat template of {name} does not render ({_one_line(exc)}); "
                "using a plain 'User: / Assistant:' format"
            )
            self.template = None
            return
        try:
            self.decoder.target.format_chat(
                [{"role": "system", "content": "Be brief."}, *probe], self.template
            )
        except Exception:
            self.fold_system = True

    def chat_messages(
        self, first_kept: int | None = None, pending: Message | None = None
    ) -> list[dict[str, str]]:
        """What the template gets: the system prompt, the kept turns (from `first_kept`)
        and the user message waiting for its reply."""
        start = self.first_kept if first_kept is None else first_kept
        kept = self.messages[start:] + ([pending] if pending is not None else [])
        turns = [{"role": m.role, "content": m.content} for m in kept]
        if self.system:
            if self.fold_system and turns:
                turns[0] = {**turns[0], "content": f"{self.system}\n\n{turns[0]['content']}"}
            elif not self.fold_system:
                turns.insert(0, {"role": "system", "content": self.system})
        return turns

    def render(self, messages: list[dict[str, str]] | None = None) -> str:
        """The conversation as text, ending where the assistant's reply begins."""
        messages = self.chat_messages() if messages is None else messages
        if self.template is not None:
            try:
                return self.decoder.target.format_chat(messages, self.template)
            except Exception as exc:
                raise InvalidParameterError(
                    f"the model's chat template failed to render: {_one_line(exc)}"
                ) from exc
        parts = []
        for m in messages:
            if m["role"] == "system":
                parts.append(f"{m['content']}\n\n")
            elif m["role"] == "user":
                parts.append(f"User: {m['content']}\n")
            else:
                parts.append(f"Assistant: {m['content']}\n")
        parts.append("Assistant:")
        return "".join(parts)

    # ---------------------------------------------------------------- tokens
    def prompt_tokens(self, text: str) -> list[int]:
        """Tokens of a rendered conversation: the token history where it still
        holds, the tokenized rest after it (see the module docstring)."""
        target = self.decoder.target
        anchor = self._anchor
        if anchor is not None and text.startswith(anchor.prompt_text):
            after = text[len(anchor.prompt_text) :]
            reply = anchor.reply_text
            # The template may trim the reply (Llama 3 does), so try those forms too.
            for form in dict.fromkeys((reply, reply.strip(), reply.lstrip(), reply.rstrip())):
                if not after.startswith(form):
                    continue
                rest = after[len(form) :]
                rest_tokens = target.tokenize(rest, add_bos=False, special=True)
                if rest_tokens and self._starts_with_special(rest, rest_tokens[0]):
                    return anchor.prompt_tokens + anchor.reply_tokens + rest_tokens
        if self.template is None:
            return self.decoder.tokenize(text)
        return target.tokenize_chat(text)

    def _starts_with_special(self, text: str, token: int) -> bool:
        """A control token (prints as nothing) whose own text begins `text`: then
        tokenizing from here gives what tokenizing the whole would."""
        target = self.decoder.target
        spelled = target.token_text(token).decode("utf-8", errors="replace")
        return target.piece(token) == b"" and bool(spelled) and text.startswith(spelled)

    def _reserve(self) -> int:
        """Room kept free for the reply when deciding whether turns must go."""
        return min(self.settings.max_tokens, self.decoder.n_ctx // 4)

    def _fit(self, pending: Message) -> tuple[str, list[int], int, HistoryTrimmed | None]:
        """Render and tokenize with the pending user message; if prompt + reserve
        overflows the context, drop the oldest user/assistant pairs (down to 3/4 of
        the window, so the next few turns need not drop and re-read again).
        Changes nothing; returns (text, tokens, first_kept, trimmed)."""
        n_ctx = self.decoder.n_ctx
        reserve = self._reserve()
        first_kept = self.first_kept
        text = self.render(self.chat_messages(first_kept, pending))
        tokens = self.prompt_tokens(text)
        before = len(tokens)
        dropped = 0
        if before + reserve > n_ctx:
            goal = n_ctx - n_ctx // 4
            while len(tokens) + reserve > goal and first_kept < len(self.messages):
                # Turns are user + assistant pairs; the system prompt is not in messages.
                first_kept = min(first_kept + 2, len(self.messages))
                dropped += 1
                text = self.render(self.chat_messages(first_kept, pending))
                tokens = self.prompt_tokens(text)
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(
                f"with this message the prompt is {len(tokens)} tokens, but the context "
                f"window holds {n_ctx}; shorten it or restart with a larger --n-ctx"
            )
        trimmed = HistoryTrimmed(dropped, before, len(tokens), n_ctx) if dropped else None
        return text, tokens, first_kept, trimmed

    # ----------------------------------------------------------------- reply
    def reply(self, user_text: str) -> Iterator[Event | HistoryTrimmed]:
        """Stream the assistant's answer to a new user message. Problems found before
        generating (an empty or too long message, a broken template) raise here; the
        conversation changes only once the returned iterator is started."""
        user_text = user_text.strip()
        if not user_text:
            raise InvalidParameterError("the message is empty")
        pending = Message("user", user_text)
        text, tokens, first_kept, trimmed = self._fit(pending)
        return self._stream(pending, first_kept, text, tokens, trimmed)

    def _stream(
        self,
        pending: Message,
        first_kept: int,
        text: str,
        tokens: list[int],
        trimmed: HistoryTrimmed | None,
    ) -> Iterator[Event | HistoryTrimmed]:
        self.messages.append(pending)
        self.first_kept = first_kept
        models = {"target": self.decoder.target}
        if self.decoder.draft is not None:
            models["draft"] = self.decoder.draft
        at_start = {name: m.tokens_evaluated for name, m in models.items()}
        turn = TurnInfo(len(tokens), 0, {}, {}, trimmed=trimmed, prompt_text=text)
        self.last_turn = turn
        s = self.settings
        before = self.decoder.last_result
        stream = self.decoder.stream(
            tokens,
            max_tokens=s.max_tokens,
            sampling=s.sampling,
            draft_max=s.draft_max,
            draft_mode=s.draft_mode,
            stop=PLAIN_STOP if self.plain_format else (),
            keep_cache=True,
        )
        self.trace.begin(pending.content)
        try:
            if trimmed is not None:
                yield trimmed
            for event in stream:
                self.trace.feed(event)
                if isinstance(event, PromptEvaluated):
                    turn.reused = event.reused
                    turn.prompt_evaluated = {
                        n: m.tokens_evaluated - at_start[n] for n, m in models.items()
                    }
                yield event
        finally:
            stream.close()
            turn.evaluated = {n: m.tokens_evaluated - at_start[n] for n, m in models.items()}
            result = self.decoder.last_result
            self._record(text, tokens, None if result is before else result)

    def _record(self, text: str, tokens: list[int], result: GenerationResult | None) -> None:
        """Keep the reply (partial or not) as the assistant's message and extend the
        token history with the tokens really generated. No result: the stream
        stopped before generating, so the user message is withdrawn."""
        target = self.decoder.target
        if self.last_turn is not None:
            self.last_turn.result = result
        if result is None:
            # Stopped (or failed) before the first token: the turn never happened.
            self.messages.pop()
            self.trace.generations.pop()
            for model in (target, self.decoder.draft):
                if model is not None:
                    model.sync_to(self.committed[:-1])
            return
        generated = list(result.tokens)
        body = generated[:-1] if generated and target.is_eog(generated[-1]) else generated
        if self.plain_format:
            # A stop string may cut the text inside a token: keep the text, not tokens.
            content = result.text
            self._anchor = None
        else:
            content = target.detokenize(body)
            self._anchor = _Anchor(text, list(tokens), content, body)
        self.trace.finish(result)
        # The message keeps the text stripped; the anchor matches either form.
        self.messages.append(Message("assistant", content.strip(), result.finish_reason))
        self.committed = list(tokens) + generated
        self.totals.merge(result.stats)
        self.replies += 1

    # -------------------------------------------------------------- commands
    def set(self, name: str, value: Any) -> tuple[str, Any]:
        """Change a setting; `value` may be a string as typed after /set."""
        if isinstance(value, str):
            key, value = parse_setting(name, value)
        else:
            key, value = parse_setting(name, str(value))
        if key == "draft_mode" and value in ("model", "hybrid") and self.decoder.draft is None:
            raise InvalidParameterError(
                f"draft_mode {value} needs a draft model, but this pair drafts by lookup"
            )
        s = self.settings
        if key in _SAMPLING_FIELDS:
            s.sampling = dataclasses.replace(s.sampling, **{key: value})
        elif key == "p_min":
            s.p_min = self.decoder.p_min = value
        else:
            setattr(s, key, value)
        return key, value

    def reset(self) -> None:
        """A new conversation (the caches keep what is still common, e.g. the system prompt)."""
        self.messages.clear()
        self.first_kept = 0
        self._anchor = None
        self.trace.clear()

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        # The prompt changes from its first tokens: every kept turn is read again.

    def context_tokens(self) -> int:
        """Length of the conversation as the model sees it now (the last prompt + reply)."""
        return len(self.committed)

    def cache_report(self) -> dict[str, Any]:
        """Both caches against the token history (for /debug-cache and tests):
        consistent means each cache holds a prefix of it, and llama.cpp agrees."""
        out: dict[str, Any] = {"history": len(self.committed)}
        ok = True
        for name, model in (("target", self.decoder.target), ("draft", self.decoder.draft)):
            if model is None:
                continue
            n = len(model.cached)
            good = model.cached == self.committed[:n] and model.pos_max() + 1 == n
            ok = ok and good
            out[name] = n
        out["consistent"] = ok
        return out

    # ------------------------------------------------------------------ save
    def transcript(self) -> dict[str, Any]:
        return {
            "format": "specllama-chat/1",
            "saved": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "settings": self.settings.as_dict(),
            "system": self.system,
            "messages": [
                {
                    "role": m.role,
                    "content": m.content,
                    **({"finish_reason": m.finish_reason} if m.finish_reason else {}),
                    **({"dropped_from_context": True} if i < self.first_kept else {}),
                }
                for i, m in enumerate(self.messages)
            ],
            "stats": self.totals.to_dict(),
        }

    def save(self, path: str | Path) -> str:
        """Write the transcript: JSON for *.json, the trace page for *.html, Markdown
        otherwise. Returns the format."""
        path = Path(path).expanduser()
        if path.suffix.lower() in (".html", ".htm"):
            self.trace.settings = self.settings.as_dict()
            return self.trace.save(path, title="specllama chat")
        data = self.transcript()
        if path.suffix.lower() == ".json":
            body, kind = json.dumps(data, ensure_ascii=False, indent=2) + "\n", "JSON"
        else:
            body, kind = _markdown(data), "Markdown"
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise InvalidParameterError(f"cannot write {path}: {exc.strerror or exc}") from None
        return kind


def _markdown(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = ["# specllama chat", ""]
    lines.append(f"- saved: {data['saved']}")
    lines.append(f"- target: `{s['target']}`")
    lines.append(f"- draft: `{s['draft']}`")
    lines.append(
        f"- temperature {s['temperature']}, top_k {s['top_k']}, top_p {s['top_p']}, "
        f"min_p {s['min_p']}, draft_max {s['draft_max']}, draft_mode {s['draft_mode']}"
    )
    lines.append("")
    if data["system"]:
        lines += ["## System", "", data["system"], ""]
    for m in data["messages"]:
        lines += [f"## {m['role'].capitalize()}", "", m["content"] or "*(empty)*"]
        notes = []
        if m.get("finish_reason") in ("interrupted", "length", "context", "error"):
            notes.append({"interrupted": "interrupted", "length": "cut at max_tokens",
                          "context": "cut: context window full",
                          "error": "cut by an error"}[m["finish_reason"]])
        if m.get("dropped_from_context"):
            notes.append("dropped from the context window")
        if notes:
            lines += ["", f"*({'; '.join(notes)})*"]
        lines.append("")
    return "\n".join(lines)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# -------------------------------------------------------------------------------- REPL

HELP = [
    ("/help", "this list"),
    ("/reset", "start a new conversation"),
    ("/stats", "totals of this session"),
    ("/set [NAME VALUE]", "show settings, or change one: " + ", ".join(SETTABLE)
     + ", show_drafts (on/off), pace (ms)"),
    ("/system [TEXT|-]", "show, set or ('-') remove the system prompt"),
    ("/save FILE", "save the conversation (FILE.json: JSON, FILE.html: trace page, "
                   "else Markdown)"),
    ("/exit", "quit (also /quit, Ctrl-D)"),
]
COMMANDS = ("help", "reset", "stats", "set", "system", "save", "exit", "quit")
_FINISH_NOTES = {
    "interrupted": "interrupted",
    "length": "cut at max_tokens",
    "context": "cut: the context window is full",
    "error": "cut by an error",
}


class _Exit(Exception):
    pass


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore a second Ctrl-C while the caches are being put back in order."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
        prompt = PromptSession(history=history)
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
        session = self.session
        printer = TokenPrinter(self.out, color=self.color)
        if printer.color and (self.show_drafts or self.pace_ms):
            printer = LiveDrafts(self.out, session.decoder.target.piece, pace_ms=self.pace_ms)
        try:
            events = session.reply(text)
        except SpecLlamaError as exc:
            self.error(exc)
            return True
        except KeyboardInterrupt:  # while rendering: nothing has changed yet
            self.err.print(Text("(cancelled)", style="yellow"))
            return self.interactive
        interrupted = False
        started = False
        try:
            for event in events:
                if isinstance(event, HistoryTrimmed):
                    self.err.print(
                        f"[yellow]notice:[/yellow] the conversation no longer fits the context "
                        f"window ({event.n_ctx} tokens): dropped the {event.turns} oldest "
                        f"{'turn' if event.turns == 1 else 'turns'} ({event.tokens_before} -> "
                        f"{event.tokens_after} tokens)"
                        + ("; the system prompt is kept" if session.system else ""),
                        markup=True,
                    )
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
                elif isinstance(event, Finished):
                    pass
        except KeyboardInterrupt:
            interrupted = True
            with _sigint_deferred():
                events.close()
        except SpecLlamaError as exc:
            with _sigint_deferred():
                events.close()
            printer.close()
            self._end_line(printer)
            self.error(exc)
            return True
        printer.close()
        self._end_line(printer)
        turn = session.last_turn
        result = turn.result if turn else None
        if result is not None:
            footer = stats_footer(result.stats)
            note = _FINISH_NOTES.get(result.finish_reason)
            if note:
                footer.append(f"  ({note})", style="yellow")
            self.err.print(footer)
        elif interrupted:
            self.err.print(Text("(interrupted before the reply began; message withdrawn)",
                                style="yellow"))
        return self.interactive or not interrupted

    def _end_line(self, printer: TokenPrinter) -> None:
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
        self.show_totals(title_prefix="session")
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
            for name in (*SETTABLE, "show_drafts", "pace"):
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
        """The REPL's own display settings (the session never sees them)."""
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

    def cmd_save(self, arg: str) -> None:
        if not arg:
            raise InvalidParameterError("/save needs a file name, e.g. /save chat.md")
        kind = self.session.save(arg)
        self.err.print(Text(f"saved the conversation to {arg} ({kind})", style="dim"))

    def cmd_exit(self, arg: str) -> None:
        raise _Exit

    def cmd_debug_cache(self, arg: str) -> None:
        report = self.session.cache_report()
        self.err.print(" ".join(f"{k}={v}" for k, v in report.items()))

    def show_totals(self, title_prefix: str = "session") -> None:
        s = self.session
        if not s.replies:
            return
        self.err.print(
            stats_table(s.totals, title=f"{title_prefix}: {_plural(s.replies, 'reply', 'replies')}")
        )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# ------------------------------------------------------------------------------- command


@click.command("chat")
@model_options
@sampling_options
@click.option("--system", metavar="TEXT", help="System prompt for the conversation.")
@click.option("--plain", is_flag=True, help="No colours.")
@view_options
@pass_options
def chat_command(opts: dict[str, Any]) -> None:
    """Chat with the model pair: replies stream as they are verified.

    On a terminal: line editing, history, slash commands (/help). Piped: every
    line of stdin is one message (or a slash command); the replies go to stdout.
    """
    err = stderr_console()
    decoder, settings = open_decoder(opts, err)
    try:
        session = ChatSession(decoder, settings, system=opts.get("system"))
        interactive = sys.stdin.isatty()
        color = False if opts.get("plain") else None  # None: on a terminal, unless NO_COLOR
        code = ChatREPL(session, err=err, color=color, interactive=interactive,
                        show_drafts=opts["show_drafts"], pace_ms=opts["pace"]).run()
    finally:
        decoder.close()
    if code:
        sys.exit(code)
