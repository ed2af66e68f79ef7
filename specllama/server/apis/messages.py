"""Anthropic's Messages API (`POST /v1/messages`) as a thin translation onto the one
request type the engine serves (ChatRequest): the tools' grammar, their validation, the
prompt cache and the reasoning split are Chat Completions' own.

The request: `system`, text / tool_use / tool_result blocks, `tools` with `input_schema`,
`tool_choice`, `stop_sequences`, `thinking` and `output_config` (messages_schema.py
says what is refused). The answer: thinking, text and tool_use blocks; streams as
Anthropic's events (message_start, content_block_*, message_delta, message_stop).

Earlier turns' `thinking` blocks are dropped: the chat templates that write reasoning
(Qwen3's, DeepSeek-R1's) drop it from earlier turns too, and ChatRequest has no field
for it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from ... import GenerationResult
from .. import schema
from ..answer import Call, Calls, Piece, ReasoningDelta, TextDelta, Whole
from ..apierror import APIError
from ..prompts import Work
from ..schema import MAX_MESSAGES, ChatRequest, Message, Tool, ToolCall
from .base import SSE, Body, Reply, Wanted, dumps
from .figures import EXTRA_KEY
from .messages_schema import (
    ChoiceAny,
    ChoiceNone,
    ChoiceTool,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    parse,
)

if TYPE_CHECKING:
    from .base import Dialect

Effort = Literal["none", "minimal", "low", "medium", "high"]
BlockType = Literal["thinking", "text"]
OpenAIChoice = Literal["none", "auto", "required"] | schema.NamedToolChoice | None

# APIError's status -> Anthropic's error type (the status itself is kept).
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error",
}
# Anthropic's effort has two steps past "high"; the chat templates know "high" at most.
_EFFORTS: dict[str, Effort] = {"low": "low", "medium": "medium", "high": "high",
                               "xhigh": "high", "max": "high"}


class MessagesDialect:
    """Anthropic's Messages API: one `Dialect` (base.py) for the generic route."""

    def parse(self, body: bytes) -> MessagesRequest:
        return parse(body)

    def chat(self, request: MessagesRequest) -> ChatRequest:
        return to_chat(request)

    def wants(self, request: MessagesRequest) -> Wanted:
        return "text" if request.stream else "end"

    def work(self, request: MessagesRequest, work: Work) -> Work:
        return work

    def new_id(self, work: Work) -> str:
        return "msg_" + uuid.uuid4().hex[:24]

    def error(self, exc: APIError) -> Body:
        return error_body(exc)

    def complete(self, request: MessagesRequest, reply: Reply, whole: Whole,
                 result: GenerationResult, extra: Body) -> Body:
        content: list[Body] = []
        if whole.reasoning is not None:
            content.append(_thinking(whole.reasoning if request.display != "omitted" else ""))
        if whole.text:
            content.append({"type": "text", "text": whole.text})
        content += [_tool_use(call) for call in whole.calls]
        return {**_message(reply, content), "stop_reason": stop_reason(request, whole, result),
                "stop_sequence": _stop_sequence(request, whole),
                "usage": usage(result), EXTRA_KEY: extra}

    def writer(self, request: MessagesRequest, reply: Reply) -> MessageEvents:
        return MessageEvents(request, reply)

    def counting(self, body: bytes) -> ChatRequest:
        """POST /v1/messages/count_tokens: the prompt such a request would have."""
        return to_chat(parse(body, counting=True))


def error_body(exc: APIError) -> Body:
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500
                            else "invalid_request_error")
    # The engine's checks name Chat Completions' field: the client sent Anthropic's.
    message = exc.message.replace("response_format", "output_config.format")
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---------------------------------------------------------------- the request


def to_chat(r: MessagesRequest) -> ChatRequest:
    """The request as Chat Completions would send it: tool_use blocks become an assistant
    turn's tool_calls, tool_result blocks tool turns, so the engine path is one."""
    messages: list[Message] = []
    if r.system:
        messages.append(Message(role="system", content=_joined(r.system)))
    for i, message in enumerate(r.messages):
        messages += _turns(message, i)
    if len(messages) > MAX_MESSAGES:  # one message of many tool_result blocks is many turns
        raise APIError(400, f"messages: {len(messages)} turns as the engine reads them (the "
                       "system prompt one, each tool_result block one, the text between "
                       f"them one); at most {MAX_MESSAGES}", param="messages")
    tools = [Tool(type="function", function=schema.FunctionDef(
        name=t.name, description=t.description, parameters=t.input_schema))
        for t in r.tools] if r.tools else None
    choice, parallel = _tool_choice(r.tool_choice)
    fmt = r.output_config.format if r.output_config else None
    try:
        return ChatRequest(
            model=r.model, messages=messages, max_tokens=r.max_tokens, stream=r.stream,
            stop=r.stop_sequences or None, temperature=r.temperature, top_p=r.top_p,
            top_k=r.top_k, seed=r.seed, tools=tools, tool_choice=choice,
            parallel_tool_calls=parallel, reasoning_effort=_effort(r),
            reasoning_budget=r.thinking.budget_tokens
            if isinstance(r.thinking, ThinkingEnabled) else None,
            response_format=None if fmt is None else schema.ResponseFormat.model_validate(
                {"type": "json_schema", "json_schema": {"schema": fmt.schema_}}),
            # Spelled out: mypy reads fields declared `Field(None, ...)` as required.
            min_p=None, n=1, max_completion_tokens=None, top_logprobs=None)
    except ValidationError as exc:
        # A limit of the engine's request that the checks here did not foresee: still
        # the client's request, so a 400 naming the field rather than a 500.
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        raise APIError(400, f"{'.'.join(loc)}: {first['msg']}",
                       param=loc[0] if loc else None) from None


def _tool_choice(choice: ToolChoice | None) -> tuple[OpenAIChoice, bool]:
    """Anthropic's tool_choice -> Chat Completions' (any = required), and whether the
    answer may hold several calls."""
    if choice is None:
        return None, True
    if isinstance(choice, ChoiceNone):
        return "none", True
    parallel = not choice.disable_parallel_tool_use
    if isinstance(choice, ChoiceTool):
        name = schema.FunctionName(name=choice.name)
        return schema.NamedToolChoice(type="function", function=name), parallel
    return ("required" if isinstance(choice, ChoiceAny) else "auto"), parallel


def _turns(message: InputMessage, i: int) -> list[Message]:
    """One Anthropic message -> Chat Completions' turns, in order: each tool_result its
    own tool turn (they come first in a user message), text between them a user turn."""
    if message.role == "assistant":
        text = _joined([b for b in message.content if isinstance(b, TextBlock)])
        calls = [ToolCall(id=b.id, function=schema.CalledFunction(
            name=b.name, arguments=_dumps(b.input, f"messages.{i}.content.{j}.input")))
            for j, b in enumerate(message.content) if isinstance(b, ToolUseBlock)]
        return [Message(role="assistant", content=text or None, tool_calls=calls or None)]
    out: list[Message] = []
    texts: list[TextBlock] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block)
            continue
        if texts:
            out.append(Message(role="user", content=_joined(texts)))
            texts = []
        if isinstance(block, ToolResultBlock):
            # The model reads a failed call's answer as one: Chat Completions has no flag.
            prefix = "Error: " if block.is_error else ""
            out.append(Message(role="tool", tool_call_id=block.tool_use_id,
                               content=prefix + block.text()))
    if texts or not out:
        out.append(Message(role="user", content=_joined(texts)))
    return out


def _joined(blocks: list[TextBlock]) -> str:
    return "\n\n".join(b.text for b in blocks)


def _dumps(value: object, where: str) -> str:
    try:
        return json.dumps(value)
    except RecursionError:
        raise APIError(400, f"{where}: JSON nested too deeply to read",
                       param="messages") from None


def _effort(r: MessagesRequest) -> Effort | None:
    """`thinking` and `output_config.effort` -> reasoning_effort: off when thinking is
    disabled; on when it is enabled (its budget_tokens is the reasoning_budget); else the
    effort asked."""
    if isinstance(r.thinking, ThinkingDisabled):
        return "none"
    asked = r.output_config.effort if r.output_config else None
    if asked is not None:
        return _EFFORTS[asked]
    return "medium" if isinstance(r.thinking, ThinkingEnabled) else None


# ---------------------------------------------------------------- the answer


def stop_reason(r: MessagesRequest, whole: Whole, result: GenerationResult) -> str:
    if whole.finish == "tool_calls":
        return "tool_use"
    if whole.finish == "length":
        return "model_context_window_exceeded" if result.finish_reason == "context" \
            else "max_tokens"
    return "stop_sequence" if _stop_sequence(r, whole) is not None else "end_turn"


def _stop_sequence(r: MessagesRequest, whole: Whole) -> str | None:
    """The client's stop sequence that ended the answer; a template's own stop string
    (the plain format's "\\nUser:") is a natural end of the turn."""
    s = whole.stop_sequence
    return s if s is not None and s in (r.stop_sequences or ()) else None


def usage(result: GenerationResult) -> Body:
    """Anthropic counts cached prompt tokens apart from input_tokens: the prompt is
    input_tokens + cache_read_input_tokens (what the KV caches reused)."""
    reused = result.stats.prompt_reused
    return {"input_tokens": result.prompt_tokens - reused, "output_tokens": len(result.tokens),
            "cache_read_input_tokens": reused, "cache_creation_input_tokens": 0}


def _message(reply: Reply, content: list[Body]) -> Body:
    return {"id": reply.rid, "type": "message", "role": "assistant", "model": reply.model,
            "content": content}


def _thinking(text: str) -> Body:
    # No signature: nothing here checks thinking blocks sent back (they are dropped).
    return {"type": "thinking", "thinking": text, "signature": ""}


def _tool_id(call: Call) -> str:
    """Anthropic's spelling of a call's id (toolu_...); any id round-trips as sent."""
    return "toolu_" + call.id.removeprefix("call_")


def _tool_use(call: Call) -> Body:
    arguments = call.parsed_arguments()
    # input_schema is an object schema (checked) and the grammar holds calls to it.
    assert isinstance(arguments, dict), arguments
    return {"type": "tool_use", "id": _tool_id(call), "name": call.name, "input": arguments}


def _event(kind: str, **data: object) -> SSE:
    return {"event": kind, "data": dumps({"type": kind, **data})}


class MessageEvents:
    """A streamed answer as Anthropic's events: one content block open at a time,
    thinking and text as deltas, each tool_use whole (the grammar holds calls back until
    they close) as one input_json_delta."""

    def __init__(self, request: MessagesRequest, reply: Reply) -> None:
        self.request = request
        self.reply = reply
        self._index = -1
        self._open: BlockType | None = None

    def start(self) -> list[SSE]:
        message = {**_message(self.reply, []), "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": len(self.reply.work.tokens), "output_tokens": 0}}
        return [_event("message_start", message=message), _event("ping")]

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        out: list[SSE] = []
        for piece in pieces:
            if isinstance(piece, ReasoningDelta):
                out += self._into("thinking")
                if self.request.display != "omitted":
                    out.append(self._delta({"type": "thinking_delta", "thinking": piece.text}))
            elif isinstance(piece, TextDelta):
                out += self._into("text")
                out.append(self._delta({"type": "text_delta", "text": piece.text}))
            elif isinstance(piece, Calls):
                out += self._close()
                for call in piece.calls:
                    self._index += 1
                    out.append(_event("content_block_start", index=self._index, content_block={
                        "type": "tool_use", "id": _tool_id(call), "name": call.name,
                        "input": {}}))
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": call.arguments}))
                    out.append(_event("content_block_stop", index=self._index))
        return out

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        out = self.pieces(tail) + self._close()
        out.append(_event("message_delta", delta={
            "stop_reason": stop_reason(self.request, whole, result),
            "stop_sequence": _stop_sequence(self.request, whole)},
            usage=usage(result), **{EXTRA_KEY: extra}))
        return [*out, _event("message_stop")]

    def error(self, exc: APIError) -> list[SSE]:
        return [{"event": "error", "data": dumps(error_body(exc))}]

    def _into(self, kind: BlockType) -> list[SSE]:
        """Open a block of this kind unless it is the one open."""
        if self._open == kind:
            return []
        out = self._close()
        self._index += 1
        self._open = kind
        block = _thinking("") if kind == "thinking" else {"type": "text", "text": ""}
        return [*out, _event("content_block_start", index=self._index, content_block=block)]

    def _close(self) -> list[SSE]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._index)]

    def _delta(self, delta: Body) -> SSE:
        return _event("content_block_delta", index=self._index, delta=delta)


if TYPE_CHECKING:  # mypy checks that it is a Dialect
    _DIALECT: Dialect[MessagesRequest] = MessagesDialect()
