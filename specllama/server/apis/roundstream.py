"""The round-event stream, POST /v1/rounds: a chat turn as the engine decides it, round
by round (roundevents.py names the events), for the live page (page.py) and any client.

The body is a Chat Completions request (it always streams; a `prediction` drafts as it
does there), plus two fields of its own for this turn only, checked by the settings table
as `/set` checks them (engine/settings.py): `draft_max` ("auto", "heuristic" or a length)
and `drafters` (names in order, as `--drafters`; "none" or [] for the target alone, but
for a prediction's drafts).

It is one of the server's APIs like the others (app.py's one route body: the key, the
model, the queue, the engine's failures and a client hanging up). What sets it apart
travels with the request: its draft settings on the Work, to the slot's order
(worker.py), and `wants` "all", so the job hands over every event, the drafts while the
target verifies them, and the slot adds the turn's comparison with the target alone
just before it ends (jobs.Slot).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, ClassVar

from pydantic import Field

from ... import GenerationResult, InvalidParameterError
from ...engine.drafting.chain import Drafters
from ...engine.settings import validate_setting
from ..answer import Piece, Whole
from ..apierror import APIError
from ..prompts import Work
from ..schema import ChatRequest, parse
from .base import SSE, Body, Reply, Wanted
from .roundevents import TurnEvents, sse


class RoundsRequest(ChatRequest):
    """A chat request, streamed round by round, with this turn's draft settings."""

    draft_max: int | str | None = None  # checked by the settings table (parse)
    drafters: str | Annotated[list[str], Field(max_length=8)] | None = None
    limits: ClassVar[dict[str, int]] = {**ChatRequest.limits, "drafters": 8}
    max_choices: ClassVar[int] = 1  # the live page shows one turn's rounds

    def settings(self) -> tuple[int | str | None, Drafters | None]:
        """draft_max and drafters as the engine takes them (None: the server's); an
        APIError naming the field the table refuses."""
        values = []
        for name in ("draft_max", "drafters"):
            value = getattr(self, name)
            try:
                values.append(None if value is None else validate_setting(name, value))
            except InvalidParameterError as exc:
                raise APIError(400, str(exc), param=name) from None
        return values[0], values[1]


class RoundsDialect:
    """POST /v1/rounds as one of app.py's APIs (apis/base.Dialect)."""

    def __init__(self, draft_max: int | str, drafters: Drafters) -> None:
        """draft_max, drafters: the server's, for a turn that names none."""
        self.draft_max, self.drafters = draft_max, drafters

    def parse(self, body: bytes) -> RoundsRequest:
        request: RoundsRequest = parse(body, RoundsRequest)
        request.settings()  # refused now, before any work
        return request

    def chat(self, request: RoundsRequest) -> ChatRequest:
        return request

    def work(self, request: RoundsRequest, work: Work) -> Work:
        draft_max, drafters = request.settings()
        return replace(work, draft_max=draft_max, drafters=drafters)

    def wants(self, request: RoundsRequest) -> Wanted:
        return "all"  # the events are the answer

    def new_id(self, work: Work) -> str:
        return f"rounds-{uuid.uuid4().hex}"

    def error(self, exc: APIError) -> Body:
        return exc.body()

    def complete(self, request: RoundsRequest, reply: Reply, whole: Whole,
                 result: GenerationResult, extra: Body) -> Body:
        raise APIError(400, "/v1/rounds always streams")  # (wants() is always "all")

    def writer(self, request: RoundsRequest, reply: Reply) -> RoundsWriter:
        work = reply.work
        label = request.messages[-1].text() if request.messages else None
        drafters = self.drafters if work.drafters is None else work.drafters
        settings = {"model": reply.model, "temperature": work.sampling.temperature,
                    "seed": request.seed, "draft_max": self.draft_max if work.draft_max is
                    None else work.draft_max, "drafters": list(drafters)}
        return RoundsWriter(TurnEvents(reply.piece), settings, label)


class RoundsWriter:
    """The turn's events as they come (apis/base.Writer): each batch's events, not its
    text pieces."""

    def __init__(self, events: TurnEvents, settings: Body, label: str | None) -> None:
        self.events, self.settings, self.label = events, settings, label

    def start(self) -> list[SSE]:
        return []

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        return [e for item in items for e in self.events.feed(item)]

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        return [self.events.final(result, extra, self.settings, self.label)]

    def error(self, exc: APIError) -> list[SSE]:
        return [sse("error", exc.body())]
