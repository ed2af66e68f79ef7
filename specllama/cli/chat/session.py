"""The chat session (no printing; `repl.ChatREPL` renders it).

`ChatSession` holds the conversation, the settings and the decoder. `reply(text)`
renders the whole conversation with the model's own chat template, turns it into
tokens and streams the answer with `keep_cache=True`, so both KV caches keep the
common prefix and a turn evaluates only its new tokens. How the conversation
becomes a prompt, and why the session keeps its token history, is `prompt`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...engine.decoder import GenerationResult, GenerationStream, SpeculativeDecoder
from ...engine.drafting.chain import who_drafts
from ...engine.llama.kvreport import CacheReport, cache_report
from ...engine.loop.events import Event, PromptEvaluated
from ...engine.loop.stats import Stats
from ...engine.settings import LIVE_SETTINGS, SETTINGS
from ...errors import ContextOverflowError, InvalidParameterError
from ...loading import RunSettings
from ...policy.compare import Comparison, compare_with_target
from ..trace import TraceRecorder, token_piece
from .prompt import (
    PLAIN_STOP,
    Anchor,
    chat_turns,
    check_template,
    prompt_tokens,
    render_chat,
)
from .remote import RemoteDecoder, RemoteStream
from .transcript import Message, Transcript

_ALIASES = {"temp": "temperature", "t": "temperature", "k": "draft_max", "max": "max_tokens",
            "draft_mode": "drafters"}


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


def parse_setting(name: str, raw: str) -> tuple[str, Any]:
    """`/set NAME VALUE` -> (canonical name, validated value); InvalidParameterError
    with one line of explanation otherwise."""
    key = _ALIASES.get(name.lower(), name.lower().replace("-", "_"))
    setting = SETTINGS.get(key)
    if setting is not None and setting.at_load:
        raise InvalidParameterError(
            f"{key} is fixed once the models are loaded; restart with {setting.flag}"
        )
    if setting is None:
        close = difflib.get_close_matches(key, LIVE_SETTINGS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InvalidParameterError(
            f"unknown setting {name!r}{hint}; settable: {', '.join(LIVE_SETTINGS)}"
        )
    if not raw.strip():
        raise InvalidParameterError(f"/set {key} needs a value")
    return key, setting.parse(raw)


class ChatSession:
    """A conversation with a loaded decoder. Never prints.

    `reply(text)` yields the engine's events (plus `HistoryTrimmed`) and records
    the assistant's message when the stream ends, however it ends (finished,
    closed early, interrupted by Ctrl-C): a partial reply stays in the history.
    """

    def __init__(
        self,
        decoder: SpeculativeDecoder | RemoteDecoder,
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
        self.unanswered: str | None = None  # a message whose turn failed: /retry
        self.committed: list[int] = []  # tokens of the last prompt + reply (cache check)
        self._anchor: Anchor | None = None
        # fold_system: the template rejects the system role (the system prompt goes
        # into the first user message); notice: one line for the user about the template
        self.template, self.fold_system, self.notice = check_template(decoder.target)
        self.trace = TraceRecorder(token_piece(decoder))  # for /save FILE.html

    # ------------------------------------------------------------- templates
    @property
    def plain_format(self) -> bool:
        return self.template is None

    def chat_messages(
        self, first_kept: int | None = None, pending: Message | None = None
    ) -> list[dict[str, str]]:
        """What the template gets: the system prompt, the kept turns (from `first_kept`)
        and the user message waiting for its reply."""
        start = self.first_kept if first_kept is None else first_kept
        kept = self.messages[start:] + ([pending] if pending is not None else [])
        return chat_turns(kept, self.system, self.fold_system)

    def render(self, messages: list[dict[str, str]] | None = None) -> str:
        """The conversation as text, ending where the assistant's reply begins."""
        messages = self.chat_messages() if messages is None else messages
        return render_chat(self.decoder.target, self.template, messages)

    # ---------------------------------------------------------------- tokens
    def prompt_tokens(self, text: str) -> list[int]:
        """Tokens of a rendered conversation: the token history where it still
        holds, the tokenized rest after it (`prompt.prompt_tokens`)."""
        return prompt_tokens(self.decoder.target, self.template, self._anchor, text)

    def _draft_prompt(self) -> list[int] | None:
        """A draft of another family reads the conversation in its own chat template
        (a remote engine's draft reads the target's)."""
        if self.plain_format or not isinstance(self.decoder, SpeculativeDecoder):
            return None
        return self.decoder.draft_prompt_for(self.chat_messages())

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
    def reply(self, user_text: str) -> Generator[Event | HistoryTrimmed, None, None]:
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
    ) -> Generator[Event | HistoryTrimmed, None, None]:
        self.messages.append(pending)
        self.unanswered = pending.content
        self.first_kept = first_kept
        models = {"target": self.decoder.target}
        if self.decoder.draft is not None:
            models["draft"] = self.decoder.draft
        at_start = {name: m.tokens_evaluated for name, m in models.items()}
        turn = TurnInfo(len(tokens), 0, {}, {}, trimmed=trimmed, prompt_text=text)
        self.last_turn = turn
        s = self.settings
        stream: GenerationStream | RemoteStream | None = None
        self.trace.begin(pending.content)
        try:
            stream = self.decoder.stream(
                tokens,
                max_tokens=s.max_tokens,
                sampling=s.sampling,
                draft_max=s.draft_max,
                drafters=s.drafters,
                stop=PLAIN_STOP if self.plain_format else (),
                keep_cache=True,
                constraint=s.constraint,
                draft_prompt=self._draft_prompt(),
            )
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
            if stream is not None:
                stream.close()
            turn.evaluated = {n: m.tokens_evaluated - at_start[n] for n, m in models.items()}
            self._record(text, tokens, stream.result if stream is not None else None)

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
            for model in (target, self.decoder.draft_model):
                if model is not None:
                    model.sync_to(self.committed[:-1])
            return
        self.unanswered = None
        generated = list(result.tokens)
        body = generated[:-1] if generated and target.is_eog(generated[-1]) else generated
        if self.plain_format:
            # A stop string may cut the text inside a token: keep the text, not tokens.
            content = result.text
            self._anchor = None
        else:
            content = target.detokenize(body)
            self._anchor = Anchor(text, list(tokens), content, body)
        self.trace.finish(result)
        # The message keeps the text stripped; the anchor matches either form.
        self.messages.append(Message("assistant", content.strip(), result.finish_reason))
        self.committed = list(tokens) + generated
        self.totals.merge(result.stats)
        self.totals.policy_note = result.stats.policy_note  # /stats shows the latest
        self.totals.policy_detail = result.stats.policy_detail
        self.replies += 1

    # -------------------------------------------------------------- commands
    def set(self, name: str, value: Any) -> tuple[str, Any]:
        """Change a setting; `value` may be a string as typed after /set."""
        key, value = parse_setting(name, value if isinstance(value, str) else str(value))
        if key == "drafters":
            value = who_drafts(value, self.decoder.draft, self.decoder.target.path.name)
        elif key == "p_min":
            self.decoder.p_min = value
        self.settings = dataclasses.replace(self.settings, **{key: value})
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

    def cache_report(self) -> CacheReport:
        """Both caches against the token history (for /debug-cache and tests)."""
        if isinstance(self.decoder, RemoteDecoder):
            return self.decoder.cache_report(self.committed)
        return cache_report(self.committed, self.decoder.target, self.decoder.draft_model)

    def compare(self) -> Comparison:
        """The session's speed against the target alone, from measured costs."""
        if isinstance(self.decoder, RemoteDecoder):
            if self.decoder.lost is not None or not self.totals.drafted:
                return Comparison("off")
            return self.decoder.compare(self.totals)
        return compare_with_target(self.decoder, self.totals)

    # ------------------------------------------------------------------ save

    def transcript(self) -> Transcript:
        return Transcript(self.settings, self.system, tuple(self.messages), self.first_kept,
                          self.totals)

    def save(self, path: str | Path) -> str:
        """Write the transcript: JSON for *.json, the trace page for *.html, Markdown
        otherwise. Returns the format."""
        if Path(path).suffix.lower() in (".html", ".htm"):
            self.trace.settings = self.settings.as_dict()
            return self.trace.save(Path(path).expanduser(), title="specllama chat")
        return self.transcript().save(path)
