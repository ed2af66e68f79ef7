"""What each HTTP API (Chat Completions, Responses, Messages) provides: its request
read onto the one request type the engine serves (`ChatRequest`/`CompletionRequest`),
and the answer's pieces (answer.py) written back in its own shapes.

The routes (app.py) do the rest once for all: authorization, the model check, the
queue, cancellation, the engine and its failures.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ... import GenerationResult
from ..answer import Piece, Whole
from ..apierror import APIError
from ..jobs import Wanted
from ..prompts import Work
from ..schema import ChatRequest, CompletionRequest

# One server-sent event as sse-starlette takes it: {"event": name (optional), "data": text}.
SSE = dict[str, str]
Body = dict[str, Any]  # a JSON body, as the API's clients read it

R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


@dataclass(frozen=True)
class Reply:
    """One request's answer in the making: what every API's writer needs."""

    work: Work
    rid: str  # the answer's id, from Dialect.new_id
    model: str  # the name clients send as `model`
    piece: Callable[[int], bytes]  # a token's bytes (log-probabilities)
    created: int  # Unix seconds


class Writer(Protocol):
    """A streamed answer, as events."""

    def start(self) -> list[SSE]: ...

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        """The text that arrived together, as the answer's pieces; `items`: the batch
        it came in, as the job handed it over (every event, for a dialect that reads
        them all: `wants`)."""
        ...

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        """`tail`: the pieces held back until the end; `extra`: specllama's figures.
        Once per choice, in order (Several): the writer counts them."""
        ...

    def error(self, exc: APIError) -> list[SSE]:
        """An error after the 200 went out: its event(s), the stream's last."""
        ...


class Dialect(Protocol, Generic[R]):
    """One HTTP API. `R` is its own parsed request (what it needs again to answer)."""

    def parse(self, body: bytes) -> R:
        """The body read and checked: APIError (in any API's terms) when it is wrong."""
        ...

    def chat(self, request: R) -> ChatRequest | CompletionRequest:
        """The request as the engine serves it."""
        ...

    def wants(self, request: R) -> Wanted:
        """What of the generation the answer reads: its end (an answer that does not
        stream), its text as it comes, or every event (the round-event stream)."""
        ...

    def work(self, request: R, work: Work) -> Work:
        """The work as this API asks it (its own settings on it); most return it as is."""
        ...

    def new_id(self, work: Work) -> str: ...

    def error(self, exc: APIError) -> Body:
        """The body of an error answer (the status is exc.status)."""
        ...

    def complete(self, request: R, reply: Reply, whole: Whole, result: GenerationResult,
                 extra: Body) -> Body:
        """The answer of a request that does not stream."""
        ...

    def writer(self, request: R, reply: Reply) -> Writer: ...


@dataclass(frozen=True)
class Answered:
    """One choice of a request that does not stream, ended."""

    whole: Whole
    result: GenerationResult
    extra: Body  # specllama's figures for this choice


@runtime_checkable
class Several(Protocol[R_contra]):
    """A Dialect whose API asks for several choices of one prompt (OpenAI's `n`,
    llama-server's `n_cmpl`: the request's `choices`); another always answers one."""

    def complete_all(self, request: R_contra, reply: Reply,
                     answers: Sequence[Answered]) -> Body | list[Body]:
        """The answer of a request that does not stream, one choice or more."""
        ...


def dumps(body: Body) -> str:
    """A JSON body for an event's data: UTF-8 text as it is, not escaped."""
    return json.dumps(body, ensure_ascii=False)


def reasoning_tokens(work: Work, whole: Whole, result: GenerationResult, reply: Reply) -> int:
    """The output tokens up to the end of the reasoning (its close marker included):
    counted from the tokens' pieces, as the engine does not tell the two apart. Counted
    in characters as the text decodes them, not in bytes: a byte the text could not
    decode is one U+FFFD there, three bytes long."""
    if work.reasoning is None or whole.reasoning is None:
        return 0
    text = result.text
    end = text.find(work.reasoning.close)
    limit = len(text) if end < 0 else end + len(work.reasoning.close)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    count = size = 0
    for token in result.tokens:
        if size >= limit:
            break
        size += len(decoder.decode(reply.piece(token)))
        count += 1
    return count
