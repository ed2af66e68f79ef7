"""The one route body every API is served through (apis/: OpenAI's Chat Completions,
Completions and Responses, Anthropic's Messages, the round-event stream): the key, the
body, the API's parse, the model, a place in the queue, the prompt, the job, then the
answer streamed as server-sent events (sse-starlette) or written whole. A request for
several choices (n, n_cmpl) is one job whose choices end one after another (worker.py).

The order matters: a place in the queue is taken before the request's own work
(tokenizing, templates, a grammar's compile), so a server with no room turns a request
away before spending anything on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import Finished, GenerationResult
from ..engine.llama import Vocabulary
from .access import authorize, check_model
from .answer import Answer, read_whole
from .apierror import APIError
from .apis.base import SSE, Answered, Body, Dialect, Reply, Several, Writer
from .apis.figures import figures
from .config import GRACE_S, ServeConfig
from .connection import Batches, cancel_when, disconnected, prepend, read_body
from .errors import Endpoint, from_failure, turned_away
from .handoff import Job, QueueFull, ShuttingDown, Unavailable
from .jobs import SHUTTING_DOWN, TEXT_EVENTS, Failure, Item
from .prompts import Work, build_work
from .worker import Worker

R = TypeVar("R")


class Serving:
    def __init__(self, worker: Worker, config: ServeConfig, vocab: Vocabulary) -> None:
        self.worker, self.config, self.vocab = worker, config, vocab

    def endpoint(self, dialect: Dialect[Any]) -> Endpoint:
        """The route of one API (its errors answered by app.py's responder)."""
        async def endpoint(request: Request) -> Response:
            return await self.generate(request, dialect)

        return endpoint

    async def request(self, request: Request, parse: Callable[[bytes], R],
                      model: Callable[[R], str]) -> R:
        """The checks every API's request passes first: the key, a body that arrives in
        time, the API's own parse, the model; the request as `parse` read it."""
        authorize(request, self.config.api_key)
        parsed = parse(await read_body(request, self.config.body_timeout_s))
        check_model(model(parsed), self.config.model_id)
        return parsed

    async def generate(self, request: Request, dialect: Dialect[Any]) -> Response:
        parsed = await self.request(request, dialect.parse, lambda r: dialect.chat(r).model)
        wanted = dialect.wants(parsed)
        try:
            with self.worker.admitted() as submit:
                work = dialect.work(parsed, await run_in_threadpool(
                    build_work, self.vocab, self.config.n_ctx, self.config.defaults,
                    dialect.chat(parsed)))
                if work.choices > 1 and not isinstance(dialect, Several):  # (parse sees to it)
                    raise APIError(400, "this API answers one choice a request", param="n")
                rid = dialect.new_id(work)
                job = submit(work, f"{request.url.path} {rid}", wanted)
        except (QueueFull, ShuttingDown, Unavailable) as exc:
            raise turned_away(exc) from None
        reply = Reply(work, rid, self.config.model_id, self.vocab.piece, int(time.time()))
        if wanted == "end":
            results = await self._complete(job, work, request)
            return JSONResponse(_body(dialect, parsed, reply, [
                Answered(read_whole(work, r), r, self._figures(job, r)) for r in results]))
        # The 200 goes out once the job runs: one that never does (the engine lost
        # while it waited, the server stopping) gets its 503 as a status.
        batches = job.batches()
        first = await self._first_batch(job, batches, request)
        # On shutdown sse-starlette sets `stopping` and waits for the stream to end.
        stopping = anyio.Event()
        return EventSourceResponse(
            self._stream(job, work, dialect.writer(parsed, reply), stopping,
                         prepend(first, batches)),
            sep="\n",
            shutdown_event=stopping,
            shutdown_grace_period=GRACE_S,
        )

    def _figures(self, job: Job, result: GenerationResult) -> Body:
        """The `speculative` figures, with the draft settings this request ran under."""
        w, work = self.worker, job.work
        return figures(result, draft_max=w.draft_max if work.draft_max is None
                       else work.draft_max, drafters=w.drafters if work.drafters is None
                       else work.drafters, queue_s=job.queue_s)

    async def _complete(self, job: Job, work: Work,
                        request: Request) -> list[GenerationResult]:
        """Each choice's result, in order; any failure is the request's error."""
        # A client that hangs up while waiting or generating cancels its job.
        watcher = asyncio.create_task(disconnected(request))
        watcher.add_done_callback(lambda _: job.cancel())
        results: list[GenerationResult] = []
        try:
            async for batch in job.batches():
                for item in batch:
                    if isinstance(item, Failure):
                        raise from_failure(item)
                    if isinstance(item, Finished):
                        results.append(item.result)
        finally:
            watcher.cancel()
        if len(results) < work.choices:  # (cut short by the server stopping)
            raise from_failure(SHUTTING_DOWN)
        for result in results:
            unmet = _unmet(result, self.config.n_ctx, work)
            if unmet is not None:
                raise unmet
        return results

    @staticmethod
    async def _first_batch(job: Job, batches: Batches,
                           request: Request) -> list[Item | Failure]:
        """What the job hands over first (a client that hangs up meanwhile cancels it);
        a Failure alone is the request's error status."""
        def hung_up(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                job.cancel()

        watcher = asyncio.create_task(disconnected(request))
        watcher.add_done_callback(hung_up)
        try:
            first: list[Item | Failure] = await anext(batches, [])
        finally:
            watcher.cancel()
        if len(first) == 1 and isinstance(first[0], Failure):
            raise from_failure(first[0])
        return first

    async def _stream(self, job: Job, work: Work, writer: Writer, stopping: anyio.Event,
                      batches: Batches) -> AsyncIterator[SSE]:
        """The server stopping cuts the generation at the next round; the stream still
        ends properly (the API's last events, with the figures). Several choices come
        one after another, each ended by its Finished."""
        answer, left = Answer(work), work.choices
        stopper = asyncio.create_task(cancel_when(stopping, job))
        try:
            for event in writer.start():
                yield event
            async for batch in batches:
                for part in _parts(batch):
                    if not left:  # after the last choice's end the job hands nothing more
                        return
                    # Text that arrived together goes out together.
                    text = "".join(i.text for i in part if isinstance(i, TEXT_EVENTS))
                    for event in writer.pieces(answer.feed(text), part):
                        yield event
                    events, over = self._last(part[-1], job, work, writer, answer)
                    for event in events:
                        yield event
                    if over:  # an error event ends the stream
                        return
                    if isinstance(part[-1], Finished):
                        left, answer = left - 1, Answer(work)
            if left:
                for event in writer.error(from_failure(SHUTTING_DOWN)):
                    yield event
        finally:
            # The client went away (sse-starlette cancels this generator) or the
            # stream ended: either way the job must not run on.
            stopper.cancel()
            job.cancel()

    def _last(self, end: object, job: Job, work: Work, writer: Writer,
              answer: Answer) -> tuple[list[SSE], bool]:
        """A choice's last events when `end` ends it (else none), and whether they end
        the stream: after the 200, a failure is an error event, the stream's last."""
        if isinstance(end, Failure):
            return writer.error(from_failure(end)), True
        if not isinstance(end, Finished):
            return [], False
        unmet = _unmet(end.result, self.config.n_ctx, work)
        if unmet is not None:
            return writer.error(unmet), True
        tail, whole = answer.end(end.result)
        return writer.end(tail, whole, end.result, self._figures(job, end.result)), False


def _body(dialect: Dialect[Any], parsed: Any, reply: Reply,
          answers: list[Answered]) -> Body | list[Body]:
    """The answer of a request that does not stream, in its API's shape."""
    if isinstance(dialect, Several):
        return dialect.complete_all(parsed, reply, answers)
    (one,) = answers  # (generate asks another API for one choice)
    return dialect.complete(parsed, reply, one.whole, one.result, one.extra)


def _parts(batch: list[Item | Failure]) -> list[list[Item | Failure]]:
    """A batch cut after each Finished and Failure: no part holds two choices' items."""
    parts: list[list[Item | Failure]] = [[]]
    for item in batch:
        parts[-1].append(item)
        if isinstance(item, Finished | Failure):
            parts.append([])
    return [part for part in parts if part]


def _unmet(result: GenerationResult, n_ctx: int, work: Work) -> APIError | None:
    """A response_format (or the tools' call format) the context window had no room to
    complete: the client's 400, not a truncated document that looks like an answer."""
    if result.finish_reason != "context" or result.constraint_met is not False:
        return None
    what = work.constraint_from
    return APIError(400, f"the context window ({n_ctx} tokens) filled before the output "
                    f"completed the {what} ({len(result.tokens)} tokens generated); "
                    "shorten the prompt", param=what, code="context_length_exceeded")
