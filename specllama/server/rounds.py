"""The round-event stream, POST /v1/rounds: a chat turn as the engine decides it, round
by round (roundevents.py names the events), for the live page (page.py) and any client.

The body is a Chat Completions request (it always streams), plus two fields of its own:
`draft_max` ("auto" or 0-16) and `drafters` (names in order, as `--drafters`), for this
turn only. The route is app.py's (`serving`): the key, the model, the queue, the
engine's failures and a client hanging up are handled as for every API.

The worker hands a request only its text and its end (handoff.Job); the Tap, around the
engine the worker drives, asks the engine for every event of a rounds turn and keeps
them for the turn's writer, which reads them as each batch of text arrives (an empty
TextFlushed after each DraftProposed makes one: the drafts go out while the target
verifies them).
"""

from __future__ import annotations

import contextvars
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar

from pydantic import Field

from .. import (
    DraftProposed,
    Event,
    Finished,
    GenerationResult,
    InvalidParameterError,
    SpeculativeDecoder,
    Stats,
    TextFlushed,
)
from ..engine.drafting.chain import Drafters
from ..policy.compare import Comparison, compare_with_target
from .answer import Piece, Whole
from .apis.base import SSE, Body, Reply
from .jobs import Evaluated, Order, Outcome
from .prompts import Work
from .roundevents import TurnEvents, sse
from .schema import APIError, ChatRequest, parse
from .worker import Decoding

DRAFT_MAX_LIMIT = 16


class RoundsRequest(ChatRequest):
    """A chat request, streamed round by round, with this turn's draft settings."""

    draft_max: int | str | None = None  # "auto" or 0-DRAFT_MAX_LIMIT (checked in parse)
    drafters: str | Annotated[list[str], Field(max_length=8)] | None = None
    limits: ClassVar[dict[str, int]] = {**ChatRequest.limits, "drafters": 8}


@dataclass(frozen=True)
class Turn:
    """A rounds turn as the Tap sees it: its settings, and its events for the writer
    (appended on the worker's thread, read on the event loop: a deque does both)."""

    draft_max: int | str | None
    drafters: Drafters | None
    events: deque[Event | Comparison] = field(default_factory=deque)

    def take(self) -> list[Event | Comparison]:
        out = []
        while self.events:
            out.append(self.events.popleft())
        return out


class Tap:
    """The engine the worker drives (worker.Decoding), asking every event of the turns
    it was told of (`expect`), with their draft settings; other orders pass unchanged."""

    def __init__(self, engine: Decoding) -> None:
        self.engine = engine
        self._turns: dict[int, tuple[weakref.ref[Work], Turn]] = {}
        self._lock = threading.Lock()

    def expect(self, work: Work, turn: Turn) -> None:
        """`turn` is `work`'s, until `work` is gone (its request ended, however)."""
        key = id(work)
        with self._lock:
            self._turns[key] = (weakref.ref(work), turn)
        weakref.finalize(work, self._forget, key)

    def turn(self, work: Work) -> Turn | None:
        with self._lock:
            ref, turn = self._turns.get(id(work), (None, None))
        return turn if ref is not None and ref() is work else None

    def _forget(self, key: int) -> None:
        with self._lock:
            self._turns.pop(key, None)

    # ---------------------------------------------------------------- Decoding
    starts = property(lambda self: self.engine.starts)
    parallel = property(lambda self: self.engine.parallel)
    pid = property(lambda self: self.engine.pid)

    def prepare(self) -> str | None:
        return self.engine.prepare()

    def run(self, order: Order, put: Callable[[Event | Evaluated], None],
            cancelled: Callable[[], bool]) -> Outcome:
        turn = self.turn(order.work)
        if turn is None:
            return self.engine.run(order, put, cancelled)
        order = replace(order, events="all", drafters=order.drafters if turn.drafters is None
                        else turn.drafters,
                        draft_max=order.draft_max if turn.draft_max is None else turn.draft_max)
        ends: list[Finished] = []

        def tee(item: Event | Evaluated) -> None:
            if isinstance(item, Finished):  # held: the comparison goes out before it
                ends.append(item)
            elif not isinstance(item, Evaluated):
                turn.events.append(item)
                put(item)
            if isinstance(item, DraftProposed):  # no text: wakes the writer, which sends
                put(TextFlushed(""))  # the drafts while the target verifies them

        outcome = self.engine.run(order, tee, cancelled)
        for end in ends:
            turn.events.append(self._compare(end.result.stats))
            turn.events.append(end)
            put(end)
        return outcome

    def cancel(self, order_id: int) -> None:
        self.engine.cancel(order_id)

    def start(self) -> object:
        return self.engine.start()

    def kill(self) -> None:
        self.engine.kill()

    def close(self) -> None:
        self.engine.close()

    def _compare(self, stats: Stats) -> Comparison:
        """The run against the target alone, asked of the engine once the turn is over
        (an engine process or slots answer calls; a lone slot's decoder is asked itself)."""
        if not stats.drafted:
            return Comparison("off")
        call: Callable[..., Any] | None = getattr(self.engine, "call", None)
        decoder = getattr(self.engine, "decoder", None)
        try:
            value = call("compare", stats) if call is not None else (
                compare_with_target(decoder, stats)
                if isinstance(decoder, SpeculativeDecoder) else None)
        except Exception:  # a figure for the page: never the turn's failure
            return Comparison("off")
        return value if isinstance(value, Comparison) else Comparison("off")


# The turn's settings, from `chat` (before the prompt is built) to `new_id` (after), in
# the request's own task: requests in between have theirs.
_SETTINGS: contextvars.ContextVar[Turn | None] = contextvars.ContextVar("rounds_turn",
                                                                         default=None)


class RoundsDialect:
    """POST /v1/rounds as one of app.py's APIs (apis/base.Dialect)."""

    def __init__(self, tap: Tap, draft_max: int | str, drafters: Drafters) -> None:
        """draft_max, drafters: the server's, for a turn that names none."""
        self.tap = tap
        self.draft_max, self.drafters = draft_max, drafters

    def parse(self, body: bytes) -> RoundsRequest:
        request: RoundsRequest = parse(body, RoundsRequest)
        k = request.draft_max
        if k is not None and k != "auto" and not (
                isinstance(k, int) and 0 <= k <= DRAFT_MAX_LIMIT):
            raise APIError(400, f"draft_max must be \"auto\" or 0 to {DRAFT_MAX_LIMIT}, got "
                           f"{k!r}", param="draft_max")
        if request.drafters is not None:
            try:
                Drafters.parse(request.drafters)
            except InvalidParameterError as exc:
                raise APIError(400, str(exc), param="drafters") from None
        return request

    def chat(self, request: RoundsRequest) -> ChatRequest:
        drafters = None if request.drafters is None else Drafters.parse(request.drafters)
        _SETTINGS.set(Turn(request.draft_max, drafters))
        return request

    def stream(self, request: RoundsRequest) -> bool:
        return True  # the events are the answer

    def new_id(self, work: Work) -> str:
        turn = _SETTINGS.get()
        if turn is not None:  # before the job is queued: the Tap knows it when it runs
            self.tap.expect(work, turn)
        return f"rounds-{uuid.uuid4().hex}"

    def error(self, exc: APIError) -> Body:
        return exc.body()

    def complete(self, request: RoundsRequest, reply: Reply, whole: Whole,
                 result: GenerationResult, extra: Body) -> Body:
        raise APIError(400, "/v1/rounds always streams")  # (stream() is always True)

    def writer(self, request: RoundsRequest, reply: Reply) -> RoundsWriter:
        turn = self.tap.turn(reply.work) or Turn(None, None)
        label = request.messages[-1].text() if request.messages else None
        drafters = self.drafters if turn.drafters is None else turn.drafters
        settings = {"model": reply.model, "temperature": reply.work.sampling.temperature,
                    "seed": request.seed, "draft_max": self.draft_max if turn.draft_max is
                    None else turn.draft_max, "drafters": list(drafters)}
        return RoundsWriter(turn, TurnEvents(reply.piece), settings, label)


class RoundsWriter:
    """The turn's events as they come (apis/base.Writer); the text pieces app.py hands
    over only say when to read them."""

    def __init__(self, turn: Turn, events: TurnEvents, settings: Body,
                 label: str | None) -> None:
        self.turn, self.events, self.settings, self.label = turn, events, settings, label

    def start(self) -> list[SSE]:
        return []

    def pieces(self, pieces: list[Piece]) -> list[SSE]:
        return [e for item in self.turn.take() for e in self.events.feed(item)]

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        out = self.pieces(tail)
        return [*out, self.events.final(result, extra, self.settings, self.label)]

    def error(self, exc: APIError) -> list[SSE]:
        return [*self.pieces([]), sse("error", exc.body())]
