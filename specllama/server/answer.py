"""The generated text told apart, whichever API asked: reasoning, answer text, tool calls.

Every API (Chat Completions, Responses, Messages) renders the same pieces in its own
shape: `Answer.feed` turns the text as it is decided into pieces, `Answer.end` flushes
what was held back and says how the answer ended. The reasoning split comes first (the
template's markers, reasoning.py), then the answer is read for tool calls: reasoning is
never parsed as a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from .. import GenerationResult
from ..engine.loop.linestops import Deadline, Indent
from .prompts import Work
from .reasoning import Splitter
from .tools import OPEN, parse_calls

# The engine's reasons -> what the APIs are told ("stop": a natural end or a stop string).
_ENDS: dict[str, Literal["stop", "length"]] = {
    "eos": "stop", "stop": "stop", "length": "length", "context": "length",
    "interrupted": "stop",
}

Finish = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def parsed_arguments(self) -> object:
        return json.loads(self.arguments)


@dataclass(frozen=True)
class Calls:
    """The answer's tool calls, whole: the grammar holds them back until they close."""

    calls: tuple[Call, ...]


Piece = ReasoningDelta | TextDelta | Calls


@dataclass(frozen=True)
class Whole:
    """The answer read whole (a request that does not stream)."""

    reasoning: str | None  # None: the template marks none, or none was written
    text: str | None  # None: the answer is tool calls only
    calls: tuple[Call, ...]
    finish: Finish
    stop_sequence: str | None = None  # the stop string that ended it, when one did


class Answer:
    """Pieces of one answer as its text arrives."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self._split = Splitter(work.reasoning) if work.reasoning is not None else None
        # With tools, answer text that may begin a call is held until it is told apart.
        self._undecided = work.tools is not None
        self._held = ""
        self._reasoning: list[str] = []
        self._text: list[str] = []

    def feed(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._split is None:
            return self._answer(text)
        out: list[Piece] = []
        for kind, part in self._split.feed(text):
            out += self._reason(part) if kind == "reasoning" else self._answer(part)
        return out

    def end(self, result: GenerationResult) -> tuple[list[Piece], Whole]:
        """The pieces still held back, and the answer whole."""
        out: list[Piece] = []
        if self._split is not None:
            for kind, part in self._split.end():
                out += self._reason(part) if kind == "reasoning" else self._answer(part)
        finish: Finish = _ENDS.get(result.finish_reason, "stop")
        if isinstance(result.stopped_by, Indent | Deadline):  # a limit, as llama-server says
            finish = "length"
        calls: tuple[Call, ...] = ()
        if self._held:
            found = parse_calls(self._held, finish == "length")
            if found:
                calls = tuple(Call(c["id"], c["function"]["name"], c["function"]["arguments"])
                              for c in found)
                out.append(Calls(calls))
                finish = "tool_calls" if finish == "stop" else finish
            elif finish != "length":  # the grammar admits no such text: say what came
                out.append(self._say(self._held))
            # else a call max_tokens cut: answer text never opens like one (tools.py)
            self._held = ""
        reasoning = "".join(self._reasoning) if self._reasoning else None
        text = "".join(self._text)
        whole = Whole(reasoning, text if text or not calls else None, calls, finish,
                      result.stop_string)
        return out, whole

    def _reason(self, text: str) -> list[Piece]:
        if not text:
            return []
        self._reasoning.append(text)
        return [ReasoningDelta(text)]

    def _answer(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._undecided:
            self._held += text
            if OPEN.startswith(self._held) or self._held.startswith(OPEN.strip()):
                return []  # a call (sent whole at the end) or not yet known
            text, self._held, self._undecided = self._held, "", False
        return [self._say(text)]

    def _say(self, text: str) -> TextDelta:
        self._text.append(text)
        return TextDelta(text)


def read_whole(work: Work, result: GenerationResult) -> Whole:
    """The answer of a request that did not stream."""
    answer = Answer(work)
    answer.feed(result.text)
    return answer.end(result)[1]
