"""The HTTP API: starlette routes, one engine path for every API (apis/: OpenAI's Chat
Completions, Completions and Responses, Anthropic's Messages), streams as server-sent
events (sse-starlette), every failure as a JSON error in the asking API's shape."""

from __future__ import annotations

import asyncio
import functools
import hmac
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

from .. import Drafters, Event, Finished, GenerationResult
from ..engine.llama import Vocabulary
from .answer import Answer, read_whole
from .apis.base import SSE, Body, Dialect, Reply, Writer
from .apis.figures import figures
from .apis.messages import MessagesDialect
from .apis.openai import OpenAI
from .apis.responses import ResponsesDialect
from .apis.responses_store import ResponsesStore
from .connection import Batches, cancel_when, disconnected, prepend, read_body
from .guard import Guard
from .jobs import SHUTTING_DOWN, TEXT_EVENTS, Failure
from .metrics import exposition
from .page import page_routes
from .prompts import Defaults, Work, build_work
from .schema import APIError, ChatRequest, CompletionRequest
from .worker import Job, QueueFull, ShuttingDown, Unavailable, Worker

# Seconds a request in progress may take to finish once the server is told to stop.
GRACE_S = 30


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the pair's name; what clients send as `model`
    defaults: Defaults
    draft_max: int | str
    drafters: Drafters
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
        """Requests in progress at once (guard.Limit); more get a JSON 503 before any
        work. Room for those served and waiting, plus kept-alive and refused ones."""
        return self.parallel + self.max_waiting + 32


_INTERNAL = APIError(500, "internal server error", type="server_error")


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
            return error_response(_INTERNAL)

    return wrapper


class _API:
    def __init__(self, worker: Worker, config: ServeConfig, vocab: Vocabulary,
                 log: Callable[[str], None]) -> None:
        self.worker = worker
        self.config = config
        self.vocab = vocab
        self.log = log
        self.created = int(time.time())
        self.responses = ResponsesDialect(ResponsesStore())
        self.messages = MessagesDialect()

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

    def serving(self, dialect: Dialect[Any]) -> Callable[[Request], Awaitable[Response]]:
        """The route of one API: its errors in its own shape, whatever failed."""
        async def endpoint(request: Request) -> Response:
            try:
                return await self._generate(request, dialect)
            except APIError as exc:
                return JSONResponse(dialect.error(exc), status_code=exc.status,
                                    headers=exc.headers)
            except Exception as exc:
                self.log(f"internal error on {request.method} {request.url.path}: "
                         f"{type(exc).__name__}: {exc}")
                return JSONResponse(dialect.error(_INTERNAL), status_code=500)

        return endpoint

    @_endpoint
    async def stored_response(self, request: Request) -> Response:
        """GET or DELETE /v1/responses/{id}: a Response kept for previous_response_id."""
        self._authorize(request)
        rid = request.path_params["response_id"]
        return JSONResponse(self.responses.retrieve(rid) if request.method == "GET"
                            else self.responses.delete(rid))

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's count_tokens: the tokens of the prompt, templates and tools in."""
        messages = self.messages
        try:
            self._authorize(request)
            req = messages.counting(await read_body(request))
            self._check_model(req.model)
            work = await run_in_threadpool(build_work, self.vocab, self.config.n_ctx,
                                           self.config.defaults, req)
        except APIError as exc:
            return JSONResponse(messages.error(exc), status_code=exc.status,
                                headers=exc.headers)
        return JSONResponse({"input_tokens": len(work.tokens)})

    async def not_found(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        what = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
        error = APIError(exc.status_code, f"{what}: {request.method} {request.url.path}",
                         code="not_found" if exc.status_code == 404 else None)
        if request.url.path.startswith("/v1/messages"):  # Anthropic's clients read theirs
            return JSONResponse(self.messages.error(error), status_code=error.status)
        return error_response(error)

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
        # OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`.
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        sent = token.strip() if scheme.lower() == "bearer" else \
            request.headers.get("x-api-key", "")
        if not sent or not hmac.compare_digest(sent.encode(), key.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer KEY' "
                "(or 'x-api-key: KEY') with the key the server was started with (--api-key)",
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

    async def _generate(self, request: Request, dialect: Dialect[Any]) -> Response:
        self._authorize(request)
        parsed = dialect.parse(await read_body(request))
        req = dialect.chat(parsed)
        self._check_model(req.model)
        work = await run_in_threadpool(
            build_work, self.vocab, self.config.n_ctx, self.config.defaults, req
        )
        rid = dialect.new_id(work)
        stream = dialect.stream(parsed)
        try:
            job = self.worker.submit(work, f"{request.url.path} {rid}", stream)
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
        reply = Reply(work, rid, self.config.model_id, self.vocab.piece, int(time.time()))
        if stream:
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
        result = await self._complete(job, work, request)
        return JSONResponse(dialect.complete(parsed, reply, read_whole(work, result), result,
                                             self._figures(job, result)))

    def _figures(self, job: Job, result: GenerationResult) -> Body:
        w = self.worker
        return figures(result, draft_max=w.draft_max, drafters=w.drafters,
                       queue_s=job.queue_s)

    async def _complete(self, job: Job, work: Work, request: Request) -> GenerationResult:
        # A client that hangs up while waiting or generating cancels its job.
        watcher = asyncio.create_task(disconnected(request))
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
        return result

    @staticmethod
    async def _first_batch(job: Job, batches: Batches,
                           request: Request) -> list[Event | Failure]:
        """What the job hands over first (a client that hangs up meanwhile cancels it);
        a Failure alone is the request's error status."""
        def hung_up(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                job.cancel()

        watcher = asyncio.create_task(disconnected(request))
        watcher.add_done_callback(hung_up)
        try:
            first: list[Event | Failure] = await anext(batches, [])
        finally:
            watcher.cancel()
        if len(first) == 1 and isinstance(first[0], Failure):
            raise _api_error(first[0])
        return first

    async def _stream(self, job: Job, work: Work, writer: Writer, stopping: anyio.Event,
                      batches: Batches) -> AsyncIterator[SSE]:
        """The server stopping cuts the generation at the next round; the stream still
        ends properly (the API's last events, with the figures)."""
        answer, ended = Answer(work), False
        stopper = asyncio.create_task(cancel_when(stopping, job))
        try:
            for event in writer.start():
                yield event
            async for batch in batches:
                # Text that arrived together goes out together.
                text = "".join(i.text for i in batch if isinstance(i, TEXT_EVENTS))
                for event in writer.pieces(answer.feed(text)):
                    yield event
                end = batch[-1]
                if isinstance(end, Failure):  # after the 200: an error event, then the end
                    for event in writer.error(_api_error(end)):
                        yield event
                    return
                if isinstance(end, Finished):
                    unmet = _unmet(end.result, self.config.n_ctx, work)
                    if unmet is not None:
                        for event in writer.error(unmet):
                            yield event
                        return
                    tail, whole = answer.end(end.result)
                    for event in writer.end(tail, whole, end.result,
                                            self._figures(job, end.result)):
                        yield event
                    ended = True  # the job hands nothing more: its batches end
            if not ended:
                for event in writer.error(_api_error(SHUTTING_DOWN)):
                    yield event
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
        Route("/v1/chat/completions", api.serving(OpenAI(ChatRequest)), methods=["POST"]),
        Route("/v1/completions", api.serving(OpenAI(CompletionRequest)), methods=["POST"]),
        Route("/v1/responses", api.serving(api.responses), methods=["POST"]),
        Route("/v1/responses/{response_id}", api.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/messages", api.serving(api.messages), methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
    ]
    # The browser boundary (Host, Origin, Content-Type) before any route's work.
    guard = Middleware(Guard, bound_host=config.host, allowed_origins=config.allowed_origins)
    return Starlette(routes=routes + page_routes(worker, api.serving), middleware=[guard],
                     exception_handlers={HTTPException: api.not_found})


def _unmet(result: GenerationResult, n_ctx: int, work: Work) -> APIError | None:
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
