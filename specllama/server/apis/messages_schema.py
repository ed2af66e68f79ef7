"""Request bodies of Anthropic's Messages API (the fields specllama honours), read and
checked: every refusal is a 400 naming the field, as Anthropic answers.

Unknown fields are refused (Anthropic refuses them too), so a feature we cannot honour
(images, documents, server tools, prefill, ...) never passes as if it had been used.
Fields that only hint at accounting or caching (`metadata`, `service_tier`,
`cache_control`) are accepted and ignored: our prompt cache reuses prefixes by itself.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..apierror import APIError
from ..schema import MAX_MESSAGES, MAX_PARTS, MAX_STOP, MAX_TOOLS

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_NOT_HERE = "is not supported by this server (specllama serve)"
# Citations are accepted and ignored (earlier answers sent back whole): as many in all as
# content blocks, so a body of a million `{}` is refused before validation reads them.
MAX_CITATIONS = MAX_PARTS


class _Strict(BaseModel):
    # strict: no `"temperature": true` read as 1.0, no `"stream": 0` as false (schema.py)
    model_config = ConfigDict(extra="forbid", strict=True)


class _Cacheable(_Strict):
    # A prompt-caching hint: accepted and ignored (the prompt cache reuses prefixes itself).
    cache_control: dict[str, Any] | None = None


def _as_blocks(value: object) -> object:
    """Content as a string is shorthand for one text block (Anthropic's rule)."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class TextBlock(_Cacheable):
    type: Literal["text"]
    text: str
    # Earlier answers sent back whole may carry these; they change nothing here.
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Cacheable):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]
    caller: dict[str, Any] | None = None  # who called it (Anthropic's server tools): unused


class ToolResultBlock(_Cacheable):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[TextBlock] = []
    is_error: bool | None = None

    _blocks = field_validator("content", mode="before")(_as_blocks)

    def text(self) -> str:
        return "".join(b.text for b in self.content)


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                  | RedactedThinkingBlock, Field(discriminator="type")]


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: list[Block]

    _blocks = field_validator("content", mode="before")(_as_blocks)


class ToolDef(_Cacheable):
    type: Literal["custom"] | None = None  # a client tool; server tools are refused
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # calls always follow the schema here: the grammar holds them


class _Choice(_Strict):
    disable_parallel_tool_use: bool = False


class ChoiceAuto(_Choice):
    type: Literal["auto"]


class ChoiceAny(_Choice):
    type: Literal["any"]


class ChoiceTool(_Choice):
    type: Literal["tool"]
    name: str


class ChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone,
                       Field(discriminator="type")]
Display = Literal["summarized", "omitted"]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)  # the close forced past it (engine/loop/budget.py)
    display: Display | None = None


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Display | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled,
                     Field(discriminator="type")]


class JSONFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JSONFormat | None = None


class MessagesRequest(_Cacheable):
    model: str
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    messages: list[InputMessage] = Field(min_length=1)
    system: list[TextBlock] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)  # Anthropic's range
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0)  # specllama's extension (Anthropic has none)
    stream: bool = False
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None  # ignored, as it changes nothing here
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: ignored

    _blocks = field_validator("system", mode="before")(_as_blocks)

    @property
    def display(self) -> Display | None:
        thinking = self.thinking
        if isinstance(thinking, (ThinkingEnabled, ThinkingAdaptive)):
            return thinking.display
        return None


# The discriminated unions: the fields that hold one, and the tags pydantic names.
_UNIONS = {"tool_choice", "thinking"}
_TAGS = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking", "auto", "any",
         "tool", "none", "enabled", "adaptive", "disabled"}


def parse(body: bytes, counting: bool = False) -> MessagesRequest:
    """The body as a MessagesRequest, or a 400 naming what is wrong with it. `counting`:
    a count_tokens body, which has no max_tokens (nor stream, nor stop_sequences)."""
    text, data = _decode(body)
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    if counting:
        if "max_tokens" in data:
            raise APIError(400, "max_tokens: Extra inputs are not permitted",
                           param="max_tokens")
        data["max_tokens"] = 1
    _check_sizes(data)
    if _SURROGATE_ESCAPE.search(text):
        _check_surrogates(data)
    try:
        request = MessagesRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = _path(first["loc"])
        raise APIError(400, _explain(first, ".".join(loc)), param=loc[0] if loc else None) \
            from None
    _check_meaning(request, counting)
    return request


def _decode(body: bytes) -> tuple[str, object]:
    try:
        text = body.decode("utf-8")
        return text, json.loads(text)
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc.msg} (line "
                       f"{exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise APIError(400, "the request body is JSON nested too deeply to read") from None
    except ValueError:  # Python's limit on the digits of an integer (sys.int_info)
        raise APIError(400, "the request body holds a number with too many digits") from None


def _check_sizes(data: dict[str, Any]) -> None:
    """The caps Chat Completions has (the engine's request type holds them), and those on
    the content blocks and citations in all, checked before anything walks the items."""
    for name, limit in (("messages", MAX_MESSAGES), ("tools", MAX_TOOLS),
                        ("stop_sequences", MAX_STOP)):
        value = data.get(name)
        if isinstance(value, list) and len(value) > limit:
            raise APIError(400, f"{name}: at most {limit} items here, got {len(value)}",
                           param=name)
    tally = _Tally()
    tally.blocks(data.get("system"), "system")
    messages = data.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        tally.blocks(message.get("content") if isinstance(message, dict) else None,
                     f"messages.{i}.content")


class _Tally:
    """Content blocks (the system prompt's, the messages', the tool results') and their
    citations, over the whole body. Each list counts by its length before its items are
    read, so these loops visit MAX_PARTS blocks at most, whatever the body holds."""

    def __init__(self) -> None:
        self.parts = 0
        self.citations = 0

    def blocks(self, blocks: object, where: str, nested: bool = False) -> None:
        if not isinstance(blocks, list):
            return  # a string is one block; anything else is validation's to name
        self.parts += len(blocks)
        if self.parts > MAX_PARTS:
            raise _past(where, MAX_PARTS, "content blocks")
        for j, block in enumerate(blocks):
            if not isinstance(block, dict):
                continue
            citations = block.get("citations")
            if isinstance(citations, list):
                self.citations += len(citations)
                if self.citations > MAX_CITATIONS:
                    raise _past(f"{where}.{j}.citations", MAX_CITATIONS, "citations")
            # A tool_result's content is text blocks, one level down (not a nesting).
            if not nested and block.get("type") == "tool_result":
                self.blocks(block.get("content"), f"{where}.{j}.content", nested=True)


def _past(where: str, limit: int, what: str) -> APIError:
    return APIError(400, f"{where}: more than {limit} {what} in all",
                    param=where.partition(".")[0])


def _check_surrogates(data: dict[str, Any]) -> None:
    """A lone UTF-16 surrogate (an escape without its pair) is not text: named by field."""
    for name, value in data.items():
        # A key may be the surrogate itself: named by its escape, as UTF-8 cannot write it.
        where = name.encode("utf-8", "backslashreplace").decode("utf-8")
        try:
            found = _SURROGATE.search(json.dumps(value, ensure_ascii=False))
        except RecursionError:
            raise APIError(400, f"{where}: JSON nested too deeply to read",
                           param=where) from None
        if found or _SURROGATE.search(name):
            raise APIError(400, f"{where}: holds a lone UTF-16 surrogate (an escape "
                           "\\ud800-\\udfff without its pair), which is not text", param=where)


def _path(loc: tuple[int | str, ...]) -> list[str]:
    """Pydantic's path less the union tags it inserts ("content.0.text.text" ->
    "content.0.text"): the path as the client wrote its JSON."""
    out: list[str] = []
    dropped = False
    for i, part in enumerate(loc):
        after_union = i > 0 and not dropped and (isinstance(loc[i - 1], int)
                                                 or loc[i - 1] in _UNIONS)
        dropped = after_union and part in _TAGS
        if not dropped:
            out.append(str(part))
    return out


def _explain(error: Any, where: str) -> str:
    """Pydantic's first error in words that say what this server does not do."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{where}: {_NOT_HERE}; leave it out"
    if kind == "union_tag_invalid":
        return (f"{where}.type: {ctx.get('tag')!r} {_NOT_HERE}; it takes "
                f"{ctx.get('expected_tags')}")
    if kind == "literal_error" and where.endswith("type"):
        return f"{where}: {error.get('input')!r} {_NOT_HERE}; it takes {ctx.get('expected')}"
    return f"{where}: {error['msg']}"


def _check_meaning(r: MessagesRequest, counting: bool = False) -> None:
    """What is well-formed yet not honoured here, or contradicts itself (`counting`: a
    count_tokens body, whose max_tokens is the parser's stand-in)."""
    for i, message in enumerate(r.messages):
        for j, block in enumerate(message.content):
            where = f"messages.{i}.content.{j}"
            if message.role == "user" and isinstance(block, (ToolUseBlock, ThinkingBlock,
                                                             RedactedThinkingBlock)):
                raise APIError(400, f"{where}: {block.type} blocks belong in assistant "
                               "messages", param="messages")
            if message.role == "assistant" and isinstance(block, ToolResultBlock):
                raise APIError(400, f"{where}: tool_result blocks belong in user messages",
                               param="messages")
    if r.messages[-1].role == "assistant":
        raise APIError(400, f"messages.{len(r.messages) - 1}: a last assistant message "
                       f"(prefill) {_NOT_HERE}; end with a user message", param="messages")
    seen: dict[str, int] = {}
    for i, tool in enumerate(r.tools or []):
        if tool.input_schema.get("type") != "object":
            raise APIError(400, f"tools.{i}.input_schema.type: must be 'object'", param="tools")
        if tool.name in seen:  # a tool_use names its tool: two of one name are ambiguous
            raise APIError(400, f"tools.{i}.name: {tool.name!r} is also the name of "
                           f"tools.{seen[tool.name]}", param="tools")
        seen[tool.name] = i
    if isinstance(r.thinking, ThinkingEnabled) and not counting and \
            r.thinking.budget_tokens >= r.max_tokens:
        raise APIError(400, "thinking.budget_tokens: must be less than max_tokens",
                       param="thinking")
    tools_used = bool(r.tools) and not isinstance(r.tool_choice, ChoiceNone)
    if r.output_config and r.output_config.format and tools_used:
        raise APIError(400, "output_config.format cannot be combined with tools: the answer "
                       "follows the tools' call format; leave one out (or send tool_choice "
                       "{\"type\": \"none\"})", param="output_config")
    if r.tool_choice is not None and not isinstance(r.tool_choice, ChoiceNone) and \
            not isinstance(r.tool_choice, ChoiceAuto) and not r.tools:
        raise APIError(400, "tool_choice: asks for a tool call but there are no tools",
                       param="tool_choice")
    if isinstance(r.tool_choice, ChoiceTool) and \
            r.tool_choice.name not in {t.name for t in r.tools or []}:
        raise APIError(400, f"tool_choice.name: {r.tool_choice.name!r} is not among the "
                       "tools", param="tool_choice")
