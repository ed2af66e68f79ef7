"""Requests of OpenAI's Responses API (the fields specllama honours), read onto the one
request type the engine serves (`ChatRequest`): the tools, their grammar and checks,
the response format's constraint and the prompt are then those of Chat Completions.

Fields that would change the answer and that specllama cannot honour are refused with a
400 naming them, as are fields it does not know (as OpenAI answers an unknown one):
never an answer that silently ignores what was asked.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ..apierror import APIError
from ..schema import (
    MAX_MESSAGES,
    MAX_PARTS,
    MAX_TOOLS,
    CalledFunction,
    ChatRequest,
    FunctionDef,
    FunctionName,
    Message,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
)

# Fields read onto the ChatRequest (or kept for the answer).
USED = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "seed", "stream", "store",
    "previous_response_id", "reasoning",
})
# Fields that change nothing for one local model: ignored, as OpenAI's servers do.
IGNORED = frozenset({
    "metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "service_tier", "stream_options",
})
# Fields specllama does not do, accepted only at their no-op values.
NO_OP: dict[str, tuple[Any, ...]] = {
    "include": (None, []),  # reasoning.encrypted_content, logprobs, ...: none can be honoured
    "truncation": (None, "disabled"),  # "auto" drops turns; here a long input is a 400
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),  # stored prompt templates
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
}
# The content parts that are text; images, files and audio are refused by name.
TEXT_PARTS = ("input_text", "output_text", "refusal")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def unsupported(param: str, what: str, hint: str = "leave it out") -> APIError:
    return APIError(400, f"{what} is not supported by this server (specllama serve); {hint}",
                    param=param, code="unsupported_parameter")


class _Model(BaseModel):
    # Items sent back as the API returned them carry ids, statuses, annotations: ignored.
    # strict: no `"temperature": true` read as 1.0, no `"stream": 0` as false (schema.py)
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Model):
    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(_Model):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class MessageItem(_Model):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)


class FunctionCallItem(_Model):
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str  # JSON text, as the API sends it
    id: str | None = None


class FunctionCallOutputItem(_Model):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str | list[TextPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else \
            "".join(p.text for p in self.output)


class ReasoningItem(_Model):
    """An earlier answer's reasoning sent back: accepted, and left out of the prompt
    (chat templates drop the reasoning of earlier turns)."""

    type: Literal["reasoning"]


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("type", "message"))  # a message may leave out its type
    return getattr(value, "type", None)


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]
# What a conversation keeps (the store's, the prompt's): reasoning items are dropped.
Turn = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None


class FunctionChoice(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Model):
    format: TextFormat | None = None


class Reasoning(_Model):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(_Model):
    # The fields of UNSUPPORTED this API honours: none (schema.parse reads it).
    honours: ClassVar[frozenset[str]] = frozenset()
    model: str
    input: Annotated[list[Item], Field(max_length=MAX_MESSAGES)]  # a string: one message
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    # The most items each array field may hold (schema.parse checks them first).
    limits: ClassVar[dict[str, int]] = {"input": MAX_MESSAGES, "tools": MAX_TOOLS}

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        """What the request asks that specllama cannot do, as a 400 naming it, before the
        shape is checked (an APIError passes through pydantic as it is)."""
        if isinstance(data, dict):
            if isinstance(data.get("input"), str):  # one user message: its errors name items
                data = {**data, "input": [{"role": "user", "content": data["input"]}]}
            _refuse_fields(data)
            _refuse_tools(data.get("tools"), data.get("tool_choice"))
            _refuse_items(data.get("input"))
            _refuse_settings(data)
        return data

    @property
    def items(self) -> list[Item]:
        return self.input

    @property
    def format(self) -> TextFormat | None:
        return self.text.format if self.text is not None else None

    def chat(self, history: tuple[Turn, ...]) -> ChatRequest:
        """This request, continuing `history` (a stored response's conversation), as the
        engine serves it."""
        messages = to_messages(self.instructions, [*history, *turns(self.items)])
        if not messages:
            raise APIError(400, "input is empty: send at least one message", param="input")
        if len(messages) > MAX_MESSAGES:
            raise APIError(400, f"the conversation holds {len(messages)} messages (with "
                           f"previous_response_id's); at most {MAX_MESSAGES}",
                           param="input", code="array_above_max_length")
        fmt = self.format
        if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
            raise APIError(400, "text.format.schema is missing: a json_schema format needs "
                           "the schema", param="text")
        return ChatRequest(
            model=self.model, messages=messages, stream=self.stream,
            temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            top_k=None, min_p=None, n=1, max_tokens=None, top_logprobs=None,
            max_completion_tokens=self.max_output_tokens,
            tools=[Tool(type="function", function=FunctionDef(
                name=t.name, description=t.description, parameters=t.parameters,
                strict=t.strict)) for t in self.tools] if self.tools else None,
            tool_choice=self._tool_choice(), parallel_tool_calls=self.parallel_tool_calls,
            response_format=None if fmt is None else ResponseFormat.model_validate({
                "type": fmt.type, "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                  "strict": fmt.strict}}),
            reasoning_effort=self.reasoning.effort if self.reasoning is not None else None,
        )

    def _tool_choice(self) -> Literal["none", "auto", "required"] | NamedToolChoice | None:
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
        return choice


def turns(items: list[Item]) -> list[Turn]:
    return [i for i in items if not isinstance(i, ReasoningItem)]


def to_messages(instructions: str | None, conversation: list[Turn]) -> list[Message]:
    """Items as Chat Completions' messages: a function call joins the assistant turn
    before it (one turn, as templates render text and calls together)."""
    out = [Message(role="system", content=instructions)] if instructions else []
    for item in conversation:
        if isinstance(item, MessageItem):
            out.append(Message(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=CalledFunction(name=item.name,
                                                                     arguments=item.arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(Message(role="assistant", content=None, tool_calls=[call]))
        else:
            out.append(Message(role="tool", content=item.text(), tool_call_id=item.call_id))
    return out


# ------------------------------------------------------------------ refusals
def _refuse_fields(data: dict[str, Any]) -> None:
    for name, value in data.items():
        if name in USED or name in IGNORED:
            continue
        if name not in NO_OP:
            # A key UTF-8 cannot write (a lone surrogate, sent as "\ud800") is named by its
            # escape: the answer naming it must encode.
            shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
            raise APIError(400, f"Unknown parameter: '{shown}': not supported by this server "
                           "(specllama serve); leave it out", param=shown,
                           code="unknown_parameter")
        if not any(value == v and type(value) is type(v) for v in NO_OP[name]):
            raise unsupported(name, f"{name} {_short(value)}")


def _refuse_tools(tools: Any, choice: Any) -> None:
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise unsupported("tools", f"tools[{i}]: the built-in tool {kind!r}",
                              "only function tools are")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind != "function":
        raise unsupported("tool_choice", f"tool_choice of type {kind!r}",
                          "none, auto, required or a function are")


def _refuse_items(items: Any) -> None:
    """Item and content types other than text, O(items + parts)."""
    parts = 0
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if isinstance(kind, str) and kind not in ITEM_TYPES:
            raise unsupported("input", f"input[{i}]: an item of type {kind!r}", "messages, "
                              "function_call, function_call_output and reasoning are")
        if kind == "reasoning":
            continue  # dropped whole (ReasoningItem): its reasoning_text parts go unread
        field = "output" if kind == "function_call_output" else "content"
        content = item.get(field)
        if not isinstance(content, list):
            continue
        parts += len(content)
        if parts > MAX_PARTS:
            raise APIError(400, f"input[{i}].{field}: the items hold more than {MAX_PARTS} "
                           "content parts in all", param="input",
                           code="array_above_max_length")
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in TEXT_PARTS:
                raise unsupported("input", f"input[{i}].{field}[{j}]: content of type "
                                  f"{kind!r}", "only text is")


def _refuse_settings(data: dict[str, Any]) -> None:
    reasoning, text = data.get("reasoning"), data.get("text")
    if isinstance(reasoning, dict):
        for name in ("summary", "generate_summary"):
            if reasoning.get(name) not in (None, "auto"):
                raise unsupported("reasoning", f"reasoning.{name} "
                                  f"{_short(reasoning[name])}", "the reasoning comes whole, "
                                  "as reasoning_text, not summarised")
    if isinstance(text, dict) and text.get("verbosity") not in (None, "medium"):
        raise unsupported("text", f"text.verbosity {_short(text['verbosity'])}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
