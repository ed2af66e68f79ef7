"""A conversation as the model reads it: rendered with the model's own chat template
(or a plain 'User: / Assistant:' format) and turned into tokens.

Prefix reuse needs the tokens of earlier turns to stay identical from turn to
turn. Re-tokenizing the rendered text does not guarantee that: a model may
generate "Hel" + "lo" where the tokenizer would write "Hello". So the session
keeps the token history itself (`Anchor`): the tokens of the previous prompt, then
the tokens the model really generated, then the tokenized rest of the new
rendering (the template's end-of-turn marker, the new user message, the
assistant header). The rest is tokenized on its own only where that cannot
change the tokenization: when it starts with a special token. Whenever this
does not hold (the template rendered earlier turns differently, turns were
dropped, no template), the full rendering is tokenized and the engine still
reuses the longest common token prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...engine.llama import Vocabulary
from ...errors import InvalidParameterError
from .transcript import Message

# Used when a model has no usable chat template.
PLAIN_STOP = ("\nUser:",)


@dataclass
class Anchor:
    """The previous turn as token history: its prompt (text and tokens), and the
    reply the model generated (text as stored in the message, and tokens)."""

    prompt_text: str
    prompt_tokens: list[int]
    reply_text: str
    reply_tokens: list[int]


def check_template(target: Vocabulary) -> tuple[str | None, bool, str | None]:
    """The target's chat template (None: it has none, or it does not render: the plain
    format), whether the template rejects the system role (then the system prompt is
    prepended to the first user message), and one line for the user about it."""
    name = target.path.name
    template = target.chat_template()
    if template is None:
        return None, False, (
            f"{name} has no chat template in its metadata; using a plain "
            "'User: / Assistant:' format"
        )
    probe = [{"role": "user", "content": "Hello"}]
    try:
        target.format_chat(probe, template)
    except Exception as exc:  # a template can fail in any jinja2 way
        return None, False, (
            f"the chat template of {name} does not render ({one_line(exc)}); "
            "using a plain 'User: / Assistant:' format"
        )
    try:
        target.format_chat([{"role": "system", "content": "Be brief."}, *probe], template)
    except Exception:
        return template, True, None
    return template, False, None


def chat_turns(
    messages: Sequence[Message], system: str | None, fold_system: bool
) -> list[dict[str, str]]:
    """What the template gets: the system prompt (folded into the first message where
    the template has no system role) and the messages."""
    turns = [{"role": m.role, "content": m.content} for m in messages]
    if system:
        if fold_system and turns:
            turns[0] = {**turns[0], "content": f"{system}\n\n{turns[0]['content']}"}
        elif not fold_system:
            turns.insert(0, {"role": "system", "content": system})
    return turns


def render_chat(
    target: Vocabulary, template: str | None, messages: list[dict[str, str]]
) -> str:
    """The conversation as text, ending where the assistant's reply begins: in the
    chat template, or the plain format where there is none."""
    if template is not None:
        try:
            return target.format_chat(messages, template)
        except Exception as exc:
            raise InvalidParameterError(
                f"the model's chat template failed to render: {one_line(exc)}"
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


def prompt_tokens(
    target: Vocabulary, template: str | None, anchor: Anchor | None, text: str
) -> list[int]:
    """Tokens of a rendered conversation: the token history (`anchor`) where it still
    holds, the tokenized rest after it (see the module docstring)."""
    if anchor is not None and text.startswith(anchor.prompt_text):
        after = text[len(anchor.prompt_text) :]
        reply = anchor.reply_text
        # The template may trim the reply (Llama 3 does), so try those forms too.
        for form in dict.fromkeys((reply, reply.strip(), reply.lstrip(), reply.rstrip())):
            if not after.startswith(form):
                continue
            rest = after[len(form) :]
            rest_tokens = target.tokenize(rest, add_bos=False, special=True)
            if rest_tokens and _starts_with_special(target, rest, rest_tokens[0]):
                return anchor.prompt_tokens + anchor.reply_tokens + rest_tokens
    if template is None:
        return target.tokenize(text, add_bos=target.adds_bos, special=True)
    return target.tokenize_chat(text)


def _starts_with_special(target: Vocabulary, text: str, token: int) -> bool:
    """A control token (prints as nothing) whose own text begins `text`: then
    tokenizing from here gives what tokenizing the whole would."""
    spelled = target.token_text(token).decode("utf-8", errors="replace")
    return target.piece(token) == b"" and bool(spelled) and text.startswith(spelled)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
