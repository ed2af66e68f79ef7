"""Reasoning told apart from the answer by the chat template's markers.

Thinking models write their reasoning between markers before the answer: `<think>` and
`</think>` (Qwen3, DeepSeek-R1, QwQ; often the template itself writes `<think>\\n` at the
end of the generation prompt, so the output starts inside the reasoning), or gpt-oss's
channels (`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final
<|message|>...`). The split reads the output text, which leaves control tokens out
(Vocabulary.piece): Qwen3's and DeepSeek's think tokens are added tokens, not control
ones, and llama.cpp turns gpt-oss's <|channel|>, <|message|> and <|start|> into added
tokens for this reason; only <|end|> vanishes, and the markers do without it. Markers
made of control tokens cannot be split (`with_tokens`).

`markers` reads them off the template and the rendered prompt, `Splitter` splits the
output text as it arrives, and `constrain_answer` wraps a constraint so that it holds
from the end of the reasoning only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..engine.constraint import JSON_OPTIONS, ConstraintSpec
from ..errors import ConstraintError

if TYPE_CHECKING:
    from ..engine.llama import Vocabulary

Kind = Literal["reasoning", "text"]
Format = Literal["none", "auto"]  # llama-server's --reasoning-format, the two we have
Effort = Literal["none", "minimal", "low", "medium", "high"]

_GPT_OSS = ("<|channel|>analysis<|message|>", "<|start|>assistant<|channel|>final<|message|>")
_THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class Markers:
    """How a template marks reasoning: between `open` and `close`; `starts_open` when the
    rendered prompt already ends inside it (the template wrote `open`)."""

    open: str
    close: str
    starts_open: bool = False
    # Control tokens the model writes just before `close` that the output text leaves out
    # (gpt-oss's <|end|>): a grammar must still let the model write them.
    hidden: str = ""
    # The target's single tokens the markers are made of, (text, id), that llguidance
    # reads as special tokens and never as text: a grammar names them by id.
    tokens: tuple[tuple[str, int], ...] = ()


# ------------------------------------------------------------------ the template


def markers(template: str | None, rendered: str, fmt: Format = "auto") -> Markers | None:
    """The reasoning markers of this prompt's answer; None when it is not split (`fmt`
    "none", a template that marks no reasoning, or one whose prompt already closed it:
    thinking turned off writes an empty `<think>\\n\\n</think>` block)."""
    if fmt == "none":
        return None
    found = _template_markers(template)
    if found is None:
        return None
    end = rendered.rstrip()
    if end.endswith(found.close):
        return None
    return replace(found, starts_open=end.endswith(found.open))


def _template_markers(template: str | None) -> Markers | None:
    if not template:
        return None
    if all(t in template for t in ("<|channel|>", "<|message|>", "analysis", "final")):
        return Markers(*_GPT_OSS, hidden="<|end|>")
    if _THINK[1] in template:
        return Markers(*_THINK)
    return None


def variables(effort: Effort | None) -> dict[str, Any]:
    """Template variables for a request's reasoning_effort, as llama-server passes them
    (chat_template_kwargs): `enable_thinking` (Qwen3, GLM), `thinking` (DeepSeek V3.1),
    `reasoning_effort` (gpt-oss, which knows low/medium/high). A template reads the ones
    it knows; nothing is passed when the request says nothing, so its prompt is as before."""
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False, "thinking": False}
    return {"enable_thinking": True, "thinking": True,
            "reasoning_effort": "low" if effort == "minimal" else effort}


def thinking_off(template: str | None, rendered: str) -> str:
    """The prompt with thinking off. A template that turns it off itself already closed
    the reasoning (see `markers`). One that wrote the opening marker and cannot turn it
    off gets an empty reasoning block after it, as llama-server closes such a prompt.
    A template whose model opens the reasoning itself cannot be told: the request is
    honoured silently, as llama-server does, and whatever the model thinks is still
    split off its answer."""
    found = markers(template, rendered)
    if found is None or not found.starts_open:
        return rendered
    return f"{rendered.rstrip()}\n\n{found.close}\n\n"


def with_tokens(found: Markers, vocab: Vocabulary) -> Markers | None:
    """`found` with the target's special tokens its markers are made of, as the grammar
    tokenizer (Vocabulary.grammar_tokenizer) sees them: control tokens, and added tokens
    written <...> (Qwen3's `</think>`). None when `open` or `close` holds a control
    token: the output text leaves those out, so the split could never find them."""
    tokens: dict[str, int] = {}
    for text in (found.open, found.hidden, found.close):
        for token in vocab.tokenize(text, add_bos=False, special=True) if text else []:
            piece = vocab.token_text(token).decode("utf-8", errors="replace")
            control = vocab.is_control(token)
            if control and text != found.hidden:
                return None
            if len(piece) > 1 and piece in text and (
                    control or (piece.startswith("<") and piece.endswith(">"))):
                tokens[piece] = token
    return replace(found, tokens=tuple(tokens.items()))


# ------------------------------------------------------------------ the output


class Splitter:
    """The output text as it arrives -> (kind, text) parts, the same whichever way the
    text is cut into deltas: a marker that may be starting is held until it is told
    apart. As llama-server does, the reasoning is stripped of the whitespace around it,
    and the answer of the whitespace that follows the close."""

    def __init__(self, markers: Markers) -> None:
        self.markers = markers
        self._state: Literal["start", "reasoning", "after", "text"] = \
            "reasoning" if markers.starts_open else "start"
        self._held = ""
        self._lead = True  # no reasoning said yet: whitespace is dropped

    def feed(self, text: str) -> Iterable[tuple[Kind, str]]:
        self._held += text
        out: list[tuple[Kind, str]] = []
        while self._step(out):
            pass
        return _merged(out)

    def end(self) -> Iterable[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        held, self._held = self._held, ""
        if self._state in ("start", "text"):
            out.append(("text", held))
        elif self._state == "reasoning":
            self._reason(held.rstrip(), out)
        return [(k, t) for k, t in out if t]

    def _step(self, out: list[tuple[Kind, str]]) -> bool:
        """One change of state (True) or all that can be told now said (False)."""
        m, held = self.markers, self._held
        if self._state == "start":
            rest = held.lstrip()
            if rest.startswith(m.open):
                self._held, self._state = rest[len(m.open):], "reasoning"
                return True
            if m.open.startswith(rest):
                return False  # whitespace, or the opening marker's beginning
            self._state = "text"
            return True
        if self._state == "reasoning":
            at = held.find(m.close)
            if at >= 0:
                self._reason(held[:at].rstrip(), out)
                self._held, self._state = held[at + len(m.close):], "after"
                return True
            keep = _partial(held, m.close)
            said = held[: len(held) - keep]
            kept = len(said) - len(said.rstrip())  # may be the whitespace before the close
            self._reason(said[: len(said) - kept], out)
            self._held = held[len(said) - kept:]
            if self._lead:
                self._held = self._held.lstrip()
            return False
        if self._state == "after":
            self._held = held.lstrip()
            if self._held:
                self._state = "text"
                return True
            return False
        if held:
            out.append(("text", held))
            self._held = ""
        return False

    def _reason(self, text: str, out: list[tuple[Kind, str]]) -> None:
        if self._lead:
            text = text.lstrip()
        if text:
            self._lead = False
            out.append(("reasoning", text))


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _merged(parts: list[tuple[Kind, str]]) -> list[tuple[Kind, str]]:
    out: list[tuple[Kind, str]] = []
    for kind, text in parts:
        if not text:
            continue
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


# ------------------------------------------------------------------ the constraint


def constrain_answer(spec: ConstraintSpec, found: Markers | None) -> ConstraintSpec:
    """`spec` on the answer only: a Lark grammar of free reasoning up to the first close
    marker, then the answer under `spec` (after whitespace, as models write it; the
    Splitter hands the answer over without it). Without markers, `spec` itself.

    The reasoning is free text: the target draws it from its own distribution, masked
    only where a special token other than the markers' would come (llguidance reads
    those apart from text), and where the end of generation would come (an answer is
    owed). No reasoning budget: llguidance's `max_tokens` would count one, but its
    validate_tokens (Constraint.fits, which vets drafts) does not, so drafts could
    break the grammar."""
    if found is None:
        return spec
    ids = dict(found.tokens)
    lines = ["start: " + ("think after" if found.starts_open else "open think after | answer")]
    if not found.starts_open:
        lines.append("open: " + _either(_lark_literal(found.open),
                                         _lark_tokens(found.open, ids)))
    regex = _regex_literal(found.close)
    # Two ways to end the reasoning: the close as text (a lazy lexeme: it ends at the
    # first), or the close's special tokens (never read as text) after reasoning that
    # holds no close as text.
    lines.append(f"closed[lazy]: /(?s:.*){regex}/")
    as_tokens = _lark_tokens(found.close, ids)
    if as_tokens:
        hidden = _lark_tokens(found.hidden, ids)
        lines += [
            f"think: closed | cut {hidden + '? ' if hidden else ''}{as_tokens}",
            "cut: REASONING",
            f"REASONING: /(?s:.*)/ & ~/(?s:.*){regex}(?s:.*)/",
        ]
    else:
        lines.append("think: closed")
    lines += [
        "after: SPACE? answer",
        r"SPACE: /[ \t\r\n]+/",
        "answer: " + _answer(spec),
    ]
    return ConstraintSpec("grammar", "\n".join(lines) + "\n")


def _answer(spec: ConstraintSpec) -> str:
    """`spec` as one Lark rule body: %json for a schema, %lark for a grammar or regex
    (a nested grammar keeps its own `start` and rule names)."""
    if spec.kind in ("json_schema", "json_object"):
        schema = json.loads(spec.text) if spec.kind == "json_schema" else {"type": "object"}
        if not isinstance(schema, dict):
            raise ConstraintError("the JSON schema is not valid: Expecting object schema "
                                  "to apply options")
        # As ConstraintSpec.grammar applies them: the server's options over the schema's.
        own = schema.get("x-guidance")
        schema["x-guidance"] = {**(own if isinstance(own, dict) else {}), **JSON_OPTIONS}
        return "%json " + json.dumps(schema)
    from llguidance import regex_to_lark
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        body = f"start: /{regex_to_lark(spec.text)}/" if spec.kind == "regex" \
            else any_to_lark(spec.text)
    except Exception as exc:  # the converter raises whatever it meets
        raise ConstraintError(f"the {spec.describe()} is not valid: {exc}") from None
    return "%lark {\n" + body + "\n}"


def _either(*alternatives: str) -> str:
    return " | ".join(dict.fromkeys(a for a in alternatives if a))


def _lark_literal(text: str) -> str:
    return json.dumps(text) if text else ""


def _regex_literal(text: str) -> str:
    return re.sub(r"([\\/.^$|?*+()\[\]{}])", r"\\\1", text)


def _lark_tokens(text: str, ids: dict[str, int]) -> str:
    """`text` as Lark items: its special tokens by id, the rest as literals ("" when it
    holds no special token: the text literal says it all)."""
    if not text or not ids:
        return ""
    names = sorted(ids, key=len, reverse=True)
    parts = [p for p in re.split("(" + "|".join(map(re.escape, names)) + ")", text) if p]
    if not any(p in ids for p in parts):
        return ""
    return " ".join(f"<[{ids[p]}]>" if p in ids else json.dumps(p) for p in parts)
