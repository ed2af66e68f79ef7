"""The HTTP API: starlette routes answering in OpenAI's shapes, streams as server-sent
events (sse-starlette), every failure as an OpenAI-shaped JSON error."""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import Event, Finished
from ..engine.llama import Vocabulary
from .guard import Guard
from .jobs import SHUTTING_DOWN, TEXT_EVENTS, Failure
from .metrics import exposition
from .prompts import Defaults, Work, build_work
from .responses import Chunks, completion, figures, new_id
from .schema import APIError, ChatRequest, CompletionRequest, parse
from .worker import Job, QueueFull, ShuttingDown, Unavailable, Worker

MAX_BODY = 4 * 2**20
# Seconds a request in progress may take to finish once the server is told to stop.
GRACE_S = 30
# A body over MAX_BODY is still read (and dropped) up to this size, so the client gets
# its 413 instead of a connection reset halfway through sending.
_DRAIN_LIMIT = 4 * MAX_BODY


Batches = AsyncIterator[list[Event | Failure]]


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the pair's name; what clients send as `model`
    defaults: Defaults
    draft_max: int | str
    drafters: tuple[str, ...]
    n_ctx: int  # the context window the engine was loaded with
    api_key: str | None = None
    max_waiting: int = 8  # requests queued behind those being served; more get 503
    parallel: int = 1  # requests served at once
    target: str = ""  # file names, shown by /v1/models
    draft: str = ""
    host: str = "127.0.0.1"  # the address bound (--host): a Host header may name it
    allowed_origins: tuple[str, ...] = ()  # web origins besides this server's (guard.py)

    @property
    def limit_concurrency(self) -> int:
        """Connections uvicorn serves at once; more get 503 before any work. Room for
        those served and waiting, plus /health probes, kept-alive and refused ones."""
        return self.parallel + self.max_waiting + 32


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _endpoint(
    method: Callable[[Any, Request], Awaitable[Response]],
) -> Callable[[Any, Request], Awaitable[Response]]:
    """APIError -> its JSON answer; anything unexpected -> a 500 in the same shape and
    one line in the server's log, never a traceback to the client or a dead server."""

    @functools.wraps(method)
    async def wrapper(self: _API, request: Request) -> Response:
        try:
            return await method(self, request)
        except APIError as exc:
            return error_response(exc)
        except Exception as exc:
            self.log(f"internal error on {request.method} {request.url.path}: "
                     f"{type(exc).__name__}: {exc}")
            return error_response(APIError(500, "internal server error", type="server_error"))

    return wrapper


class _API:
    def __init__(self, worker: Worker, config: ServeConfig, vocab: Vocabulary,
                 log: Callable[[str], None]) -> None:
        self.worker = worker
        self.config = config
        self.vocab = vocab
        self.log = log
        self.created = int(time.time())

    # ------------------------------------------------------------------ routes
    @_endpoint
    async def metrics(self, request: Request) -> Response:
        """Prometheus' text format (server/metrics.py); behind the key: it shows usage."""
        self._authorize(request)
        return PlainTextResponse(exposition(self.worker),
                                 media_type="text/plain; version=0.0.4")

    async def health(self, request: Request) -> Response:
        """Alive or not for anyone (probes need no key); the figures only with the key,
        when there is one: they show other clients' usage."""
        now = self.worker.snapshot()
        failure = None if now.down is None else now.down.failure()
        status, headers = (200, None) if failure is None else (
            503, {"Retry-After": str(failure.retry_after)})
        body: dict[str, Any] = {"status": "ok" if failure is None else "unavailable"}
        try:
            self._authorize(request)
        except APIError:
            return JSONResponse(body, status_code=status, headers=headers)
        body["model"] = self.config.model_id
        if failure is not None:
            body.update(reason=failure.message, retry_after=failure.retry_after)
        body.update(busy=now.busy, serving=now.serving, parallel=now.parallel,
                    waiting=now.waiting, requests=now.totals.as_dict(),
                    cache=now.cache, prompt_cache=asdict(now.prompt_cache),
                    engine_pid=now.engine_pid)
        return JSONResponse(body, status_code=status, headers=headers)

    @_endpoint
    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    @_endpoint
    async def model(self, request: Request) -> Response:
        self._authorize(request)
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._model_card())

    @_endpoint
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, ChatRequest)

    @_endpoint
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, CompletionRequest)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        what = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
        return error_response(APIError(
            exc.status_code, f"{what}: {request.method} {request.url.path}",
            code="not_found" if exc.status_code == 404 else None,
        ))

    # ---------------------------------------------------------------- helpers
    def _model_card(self) -> dict[str, Any]:
        w = self.worker
        return {
            "id": self.config.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "specllama",
            "speculative": {
                "target": self.config.target,
                "draft": self.config.draft,
                "n_ctx": self.config.n_ctx,
                "draft_max": w.draft_max,
                "drafters": list(w.drafters),
            },
        }

    def _authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise APIError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY' "
                "with the key the server was started with (--api-key)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _check_model(self, model: str) -> None:
        if model != self.config.model_id:
            raise APIError(
                404,
                f"the model {model!r} does not exist here; this server serves "
                f"{self.config.model_id!r}",
                param="model",
                code="model_not_found",
            )

    async def _generate(self, request: Request, kind: type[Any]) -> Response:
        self._authorize(request)
        req = parse(await _read_body(request), kind)
        self._check_model(req.model)
        work = await run_in_threadpool(
            build_work, self.vocab, self.config.n_ctx, self.config.defaults, req
        )
        rid = new_id(work.kind)
        try:
            job = self.worker.submit(work, f"{request.url.path} {rid}", req.stream)
        except QueueFull as exc:
            raise APIError(
                503,
                "the server is busy: too many requests are waiting; retry later",
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(exc.retry_after)},
            ) from None
        except ShuttingDown:
            raise _api_error(SHUTTING_DOWN) from None
        except Unavailable as exc:
            raise _api_error(exc.failure) from None
        if req.stream:
            # The 200 goes out once the job runs: one that never does (the engine lost
            # while it waited, the server stopping) gets its 503 as a status.
            batches = job.batches()
            first = await self._first_batch(job, batches, request)
            # On shutdown sse-starlette sets `stopping` and waits for the stream to end.
            stopping = anyio.Event()
            return EventSourceResponse(
                self._stream(job, work, rid, req.include_usage, stopping,
                             _prepend(first, batches)),
                sep="\n",
                shutdown_event=stopping,
                shutdown_grace_period=GRACE_S,
            )
        return JSONResponse(await self._complete(job, work, rid, request))

    def _figures(self, job: Job, result: Any) -> dict[str, Any]:
        w = self.worker
        return figures(result, draft_max=w.draft_max, drafters=w.drafters,
                       queue_s=job.queue_s)

    async def _complete(self, job: Job, work: Work, rid: str, request: Request) -> dict[str, Any]:
        # A client that hangs up while waiting or generating cancels its job.
        watcher = asyncio.create_task(_disconnected(request))
        watcher.add_done_callback(lambda _: job.cancel())
        result = None
        try:
            async for batch in job.batches():
                for item in batch:
                    if isinstance(item, Failure):
                        raise _api_error(item)
                    if isinstance(item, Finished):
                        result = item.result
        finally:
            watcher.cancel()
        if result is None:
            raise _api_error(SHUTTING_DOWN)
        unmet = _unmet(result, self.config.n_ctx, work)
        if unmet is not None:
            raise unmet
        return completion(work, rid, self.config.model_id, result, self._figures(job, result),
                          self.vocab.piece)

    @staticmethod
    async def _first_batch(job: Job, batches: Batches,
                           request: Request) -> list[Event | Failure]:
        """What the job hands over first (a client that hangs up meanwhile cancels it);
        a Failure alone is the request's error status."""
        def hung_up(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                job.cancel()

        watcher = asyncio.create_task(_disconnected(request))
        watcher.add_done_callback(hung_up)
        try:
            first: list[Event | Failure] = await anext(batches, [])
        finally:
            watcher.cancel()
        if len(first) == 1 and isinstance(first[0], Failure):
            raise _api_error(first[0])
        return first

    async def _stream(
        self, job: Job, work: Work, rid: str, include_usage: bool, stopping: anyio.Event,
        batches: Batches,
    ) -> AsyncIterator[dict[str, str]]:
        """The server stopping cuts the generation at the next round; the stream still
        ends properly (a last chunk with the figures, then [DONE])."""
        chunks = Chunks(work, rid, self.config.model_id, include_usage)
        stopper = asyncio.create_task(_cancel_when(stopping, job))
        try:
            first = chunks.start()
            if first is not None:
                yield _sse(first)
            async for batch in batches:
                # Text that arrived together goes out as one chunk.
                text = "".join(i.text for i in batch if isinstance(i, TEXT_EVENTS))
                chunk = chunks.text(text) if text else None
                if chunk is not None:
                    yield _sse(chunk)
                end = batch[-1]
                if isinstance(end, Failure):  # after the 200: an error event, then the end
                    yield _sse(_api_error(end).body())
                    break
                if isinstance(end, Finished):
                    unmet = _unmet(end.result, self.config.n_ctx, work)
                    if unmet is not None:
                        yield _sse(unmet.body())
                        break
                    for chunk in chunks.end(end.result, self._figures(job, end.result),
                                            self.vocab.piece):
                        yield _sse(chunk)
            yield {"data": "[DONE]"}
        finally:
            # The client went away (sse-starlette cancels this generator) or the
            # stream ended: either way the job must not run on.
            stopper.cancel()
            job.cancel()


def create_app(worker: Worker, config: ServeConfig, vocab: Vocabulary,
               log: Callable[[str], None]) -> Starlette:
    api = _API(worker, config, vocab, log)
    routes = [
        Route("/health", api.health),
        Route("/metrics", api.metrics),
        Route("/v1/models", api.models),
        Route("/v1/models/{model_id:path}", api.model),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    # The browser boundary (Host, Origin, Content-Type) before any route's work.
    guard = Middleware(Guard, bound_host=config.host, allowed_origins=config.allowed_origins)
    return Starlette(routes=routes, middleware=[guard],
                     exception_handlers={HTTPException: api.not_found})


async def _read_body(request: Request) -> bytes:
    too_large = APIError(
        413, f"the request body is larger than {MAX_BODY} bytes", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _DRAIN_LIMIT:
        raise too_large
    size, parts = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size <= MAX_BODY:
            parts.append(chunk)
        elif size > _DRAIN_LIMIT:
            break
    if size > MAX_BODY:
        raise too_large
    return b"".join(parts)


async def _cancel_when(event: anyio.Event, job: Job) -> None:
    await event.wait()
    job.cancel()


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _prepend(first: list[Event | Failure], rest: Batches) -> Batches:
    if first:
        yield first
    async for batch in rest:
        yield batch


def _sse(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body, ensure_ascii=False)}


def _unmet(result: Any, n_ctx: int, work: Work) -> APIError | None:
    """A response_format (or the tools' call format) the context window had no room to
    complete: the client's 400, not a truncated document that looks like an answer."""
    if result.finish_reason != "context" or result.constraint_met is not False:
        return None
    what = "response_format" if work.tools is None else "tools"
    return APIError(400, f"the context window ({n_ctx} tokens) filled before the output "
                    f"completed the {what} ({len(result.tokens)} tokens generated); "
                    "shorten the prompt", param=what, code="context_length_exceeded")


def _api_error(failure: Failure) -> APIError:
    headers = {} if failure.retry_after is None else {"Retry-After": str(failure.retry_after)}
    return APIError(failure.status, failure.message, code=failure.code, headers=headers,
                    type="server_error" if failure.status >= 500 else "invalid_request_error")
