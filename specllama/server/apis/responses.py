"""OpenAI's Responses API (`POST /v1/responses`): requests read onto a `ChatRequest`
(responses_schema.py), answers as Response objects, streams as OpenAI's named events,
and a bounded in-memory store for `previous_response_id` (responses_store.py).

An answer's output is its items in order: the reasoning (when the template marks one),
the message, or the function calls. A stream sends each item as it is written
(`response.output_item.added`, its deltas, `response.output_item.done`) between
`response.created` and `response.completed` (`response.incomplete` when cut by
max_output_tokens), with the same ids as the final Response.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ... import GenerationResult
from ..answer import Call, Calls, Piece, ReasoningDelta, TextDelta, Whole
from ..apierror import APIError
from ..prompts import Work
from ..schema import ChatRequest, parse
from .base import SSE, Body, Reply, Wanted, Writer, dumps, reasoning_tokens
from .figures import EXTRA_KEY
from .responses_schema import FunctionCallItem, MessageItem, ResponsesRequest, Turn, turns
from .responses_store import ResponsesStore, stored

Status = Literal["completed", "incomplete", "in_progress", "failed"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Asked:
    """A request as read: the body, the conversation it continues, and the request the
    engine serves."""

    body: ResponsesRequest
    history: tuple[Turn, ...]  # the previous response's conversation; () for none
    chat: ChatRequest

    @property
    def conversation(self) -> tuple[Turn, ...]:
        return (*self.history, *turns(self.body.items))


# ------------------------------------------------------------------ output items
@dataclass
class ReasoningOut:
    id: str
    text: str = ""
    prefix = "rs"

    def body(self, status: Status, whole: bool = True) -> Body:
        return {"type": "reasoning", "id": self.id, "summary": [], "status": status,
                "content": [self.part()] if whole else []}

    def part(self) -> Body:
        return {"type": "reasoning_text", "text": self.text}


@dataclass
class MessageOut:
    id: str
    text: str = ""
    prefix = "msg"

    def body(self, status: Status, whole: bool = True) -> Body:
        return {"type": "message", "id": self.id, "role": "assistant", "status": status,
                "content": [self.part()] if whole else []}

    def part(self) -> Body:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}


@dataclass
class CallOut:
    id: str
    call: Call

    def body(self, status: Status, whole: bool = True) -> Body:
        return {"type": "function_call", "id": self.id, "call_id": self.call.id,
                "name": self.call.name, "arguments": self.call.arguments if whole else "",
                "status": status}


Out = ReasoningOut | MessageOut | CallOut


def outputs(whole: Whole) -> list[Out]:
    """The items of an answer read whole (as a stream sends them: a message once there
    is text; an answer of nothing at all is an empty message)."""
    items: list[Out] = []
    if whole.reasoning is not None:
        items.append(ReasoningOut(new_id("rs"), whole.reasoning))
    if whole.text or not (items or whole.calls):
        items.append(MessageOut(new_id("msg"), whole.text or ""))
    return items + [CallOut(new_id("fc"), c) for c in whole.calls]


def item_status(item: Out, items: list[Out], incomplete: bool) -> Status:
    """The text cut by max_output_tokens is incomplete; a call is kept only whole."""
    cut = incomplete and item is items[-1] and not isinstance(item, CallOut)
    return "incomplete" if cut else "completed"


def as_turns(items: list[Out]) -> list[Turn]:
    """The answer as the conversation keeps it (its reasoning left out, as templates
    leave out earlier turns' reasoning)."""
    out: list[Turn] = []
    for item in items:
        if isinstance(item, MessageOut):
            out.append(MessageItem(role="assistant", content=item.text))
        elif isinstance(item, CallOut):
            out.append(FunctionCallItem(call_id=item.call.id, name=item.call.name,
                                        arguments=item.call.arguments, id=item.id))
    return out


# The engine path's errors name Chat Completions' fields: these are their names here.
_PARAMS = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
           "response_format": "text", "messages": "input"}
_WORDS = (("max_completion_tokens", "max_output_tokens"), ("response_format", "text.format"),
          ("].function.name", "].name"))


def renamed(exc: APIError) -> Body:
    """The error's body in this API's field names."""
    body = exc.body()
    message = exc.message
    for chat, ours in _WORDS:  # words no field of this API spells
        message = message.replace(chat, ours)
    body["error"].update(param=_PARAMS.get(exc.param or "", exc.param), message=message)
    return body


def usage(result: GenerationResult, reasoning_tokens: int) -> Body:
    output = len(result.tokens)
    return {
        "input_tokens": result.prompt_tokens,
        # OpenAI's name for prompt tokens served from a cache: here, the KV caches.
        "input_tokens_details": {"cached_tokens": result.stats.prompt_reused},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": result.prompt_tokens + output,
    }


class ResponsesDialect:
    """The Responses API as a `Dialect` (base.py); `store` keeps what `store: true`
    answers for `previous_response_id` and GET/DELETE /v1/responses/{id}."""

    def __init__(self, store: ResponsesStore) -> None:
        self.store = store

    def parse(self, body: bytes) -> Asked:
        # schema.parse reads any pydantic model with `limits`; its annotation names Chat's.
        request: ResponsesRequest = parse(body, ResponsesRequest)  # type: ignore[arg-type]
        history: tuple[Turn, ...] = ()
        if request.previous_response_id is not None:
            history = self.store.get(request.previous_response_id,
                                     "previous_response_id").conversation
        return Asked(request, history, request.chat(history))

    def chat(self, request: Asked) -> ChatRequest:
        return request.chat

    def wants(self, request: Asked) -> Wanted:
        return "text" if request.body.stream else "end"

    def work(self, request: Asked, work: Work) -> Work:
        return work

    def new_id(self, work: Work) -> str:
        return new_id("resp")

    def error(self, exc: APIError) -> Body:
        return renamed(exc)

    def complete(self, request: Asked, reply: Reply, whole: Whole, result: GenerationResult,
                 extra: Body) -> Body:
        return self.finish(request, reply, outputs(whole), whole, result, extra)

    def writer(self, request: Asked, reply: Reply) -> Writer:
        return Events(self, request, reply)

    # ------------------------------------------------ GET/DELETE /v1/responses/{id}
    def retrieve(self, rid: str) -> Body:
        return self.store.get(rid).body

    def delete(self, rid: str) -> Body:
        self.store.delete(rid)
        return {"id": rid, "object": "response.deleted", "deleted": True}

    # ------------------------------------------------------------------ helpers
    def finish(self, request: Asked, reply: Reply, items: list[Out], whole: Whole,
               result: GenerationResult, extra: Body) -> Body:
        """The final Response, kept in the store when the request asks it to be."""
        incomplete = whole.finish == "length"
        output = [i.body(item_status(i, items, incomplete)) for i in items]
        body = response(request, reply, "incomplete" if incomplete else "completed", output)
        body["usage"] = usage(result, reasoning_tokens(reply.work, whole, result, reply))
        body[EXTRA_KEY] = extra
        if request.body.store:
            self.store.put(reply.rid, stored((*request.conversation, *as_turns(items)), body))
        return body


def response(request: Asked, reply: Reply, status: Status, output: list[Body]) -> Body:
    """A Response object, its settings echoed as they apply."""
    body = request.body
    fmt = body.format
    text: Body = {"type": "text"} if fmt is None else {"type": fmt.type}
    if fmt is not None and fmt.type == "json_schema":
        text.update(name=fmt.name, schema=fmt.schema_, strict=fmt.strict)
    choice = body.tool_choice
    return {
        "id": reply.rid,
        "object": "response",
        "created_at": reply.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"}
        if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": reply.model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                      "summary": None},
        "store": body.store,
        "temperature": reply.work.sampling.temperature,
        "text": {"format": text},
        "tool_choice": "auto" if choice is None else
        choice if isinstance(choice, str) else choice.model_dump(),
        "tools": [t.model_dump() for t in body.tools or []],
        "top_p": reply.work.sampling.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": {},
        "background": False,
    }


class Events:
    """A streamed answer as OpenAI's events: each SSE named by its type, its data with
    `type` and `sequence_number`. Text and reasoning are items open while they grow;
    function calls come whole (the grammar holds them until they close)."""

    def __init__(self, dialect: ResponsesDialect, request: Asked, reply: Reply) -> None:
        self.dialect = dialect
        self.request = request
        self.reply = reply
        self.seq = 0
        self.items: list[Out] = []
        self.open: ReasoningOut | MessageOut | None = None

    def _event(self, kind: str, **fields: object) -> SSE:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return {"event": kind, "data": dumps(body)}

    def start(self) -> list[SSE]:
        body = response(self.request, self.reply, "in_progress", [])
        return [self._event("response.created", response=body),
                self._event("response.in_progress", response=body)]

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        out: list[SSE] = []
        for p in pieces:
            if isinstance(p, ReasoningDelta):
                out += self._grow(ReasoningOut, p.text)
            elif isinstance(p, TextDelta):
                out += self._grow(MessageOut, p.text)
            elif isinstance(p, Calls):
                out += self._close("completed")
                for call in p.calls:
                    out += self._call(call)
        return out

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        incomplete = whole.finish == "length"
        out = self.pieces(tail)
        if not self.items:
            out += self._grow(MessageOut, "")  # an answer of nothing: an empty message
        out += self._close("incomplete" if incomplete else "completed")
        body = self.dialect.finish(self.request, self.reply, self.items, whole, result, extra)
        return [*out, self._event(f"response.{body['status']}", response=body)]

    def error(self, exc: APIError) -> list[SSE]:
        """After the 200: `error`, then `response.failed` with what was written."""
        body = response(self.request, self.reply, "failed",
                        [i.body("incomplete") for i in self.items])
        error = renamed(exc)["error"]
        body["error"] = {"code": exc.code or exc.type, "message": error["message"]}
        return [self._event("error", code=exc.code, message=error["message"],
                            param=error["param"]),
                self._event("response.failed", response=body)]

    # ------------------------------------------------------------------ items
    def _grow(self, kind: type[ReasoningOut] | type[MessageOut], text: str) -> list[SSE]:
        out: list[SSE] = []
        item = self.open
        if not isinstance(item, kind):
            out += self._close("completed")
            item = kind(new_id(kind.prefix))
            out += self._added(item)
            out.append(self._event("response.content_part.added", **self._at(item),
                                   content_index=0, part={**item.part(), "text": ""}))
            self.open = item
        if text:
            item.text += text
            name = "response.reasoning_text.delta" if isinstance(item, ReasoningOut) \
                else "response.output_text.delta"
            more: Body = {} if isinstance(item, ReasoningOut) else {"logprobs": []}
            out.append(self._event(name, **self._at(item), content_index=0, delta=text,
                                   **more))
        return out

    def _close(self, status: Status) -> list[SSE]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = self._at(item)
        done = self._event("response.reasoning_text.done", **at, content_index=0,
                           text=item.text) if isinstance(item, ReasoningOut) else \
            self._event("response.output_text.done", **at, content_index=0, text=item.text,
                        logprobs=[])
        return [done,
                self._event("response.content_part.done", **at, content_index=0,
                            part=item.part()),
                self._event("response.output_item.done", output_index=at["output_index"],
                            item=item.body(status))]

    def _call(self, call: Call) -> list[SSE]:
        item = CallOut(new_id("fc"), call)
        out = self._added(item)
        at = self._at(item)
        return [*out,
                self._event("response.function_call_arguments.delta", **at,
                            delta=call.arguments),
                self._event("response.function_call_arguments.done", **at, name=call.name,
                            arguments=call.arguments),
                self._event("response.output_item.done", output_index=at["output_index"],
                            item=item.body("completed"))]

    def _added(self, item: Out) -> list[SSE]:
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=len(self.items) - 1,
                            item=item.body("in_progress", whole=False))]

    def _at(self, item: Out) -> dict[str, str | int]:
        return {"item_id": item.id, "output_index": self.items.index(item)}
