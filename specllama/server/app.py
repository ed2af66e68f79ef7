"""The HTTP API: the route table, and the routes that are not an API's generation
(health, metrics, models, stored responses, counting tokens).

Every API is served by one route body (serving.py) and answers its errors through one
responder (errors.py), in its own shape whatever failed: a refusal at the browser
boundary (guard.py), a bad body, the queue, the engine, or a defect of ours.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..engine.llama import Vocabulary
from .access import authorize, check_model
from .apierror import APIError
from .apis.infill import InfillDialect
from .apis.messages import MessagesDialect
from .apis.openai import OpenAI
from .apis.responses import ResponsesDialect
from .apis.responses_store import ResponsesStore
from .apis.roundstream import RoundsDialect
from .config import GRACE_S, ServeConfig
from .errors import Errors, turned_away
from .guard import Guard, Limit
from .handoff import QueueFull, ShuttingDown, Unavailable
from .metrics import exposition
from .openapi import Described
from .page import page_routes
from .prompts import build_work
from .schema import ChatRequest, CompletionRequest
from .serving import Serving
from .worker import Worker

__all__ = ["GRACE_S", "ServeConfig", "create_app"]


class _API:
    def __init__(self, worker: Worker, config: ServeConfig, vocab: Vocabulary) -> None:
        self.worker = worker
        self.config = config
        self.created = int(time.time())
        self.responses = ResponsesDialect(ResponsesStore())
        self.messages = MessagesDialect()
        self.serving = Serving(worker, config, vocab)

    async def metrics(self, request: Request) -> Response:
        """Prometheus' text format (server/metrics.py); behind the key: it shows usage."""
        authorize(request, self.config.api_key)
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
            authorize(request, self.config.api_key)
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

    async def models(self, request: Request) -> Response:
        authorize(request, self.config.api_key)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        authorize(request, self.config.api_key)
        check_model(request.path_params["model_id"], self.config.model_id)
        return JSONResponse(self._model_card())

    async def stored_response(self, request: Request) -> Response:
        """GET (and HEAD) /v1/responses/{id}: a Response kept for previous_response_id."""
        authorize(request, self.config.api_key)
        return JSONResponse(self.responses.retrieve(request.path_params["response_id"]))

    async def delete_response(self, request: Request) -> Response:
        """DELETE /v1/responses/{id}, its own route: only this method deletes."""
        authorize(request, self.config.api_key)
        return JSONResponse(self.responses.delete(request.path_params["response_id"]))

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's count_tokens: the tokens of the prompt, templates and tools in.
        It takes a place in the queue while it counts, as a generation would: counting
        is CPU work beside the one the engine needs."""
        req = await self.serving.request(request, self.messages.counting, lambda r: r.model)
        try:
            with self.worker.admitted():
                work = await run_in_threadpool(build_work, self.serving.vocab,
                                               self.config.n_ctx, self.config.defaults, req)
        except (QueueFull, ShuttingDown, Unavailable) as exc:
            raise turned_away(exc) from None
        return JSONResponse({"input_tokens": len(work.tokens)})

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """Starlette's 404 and 405, as the API's own JSON error."""
        assert isinstance(exc, HTTPException)
        what = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
        raise APIError(exc.status_code, f"{what}: {request.method} {request.url.path}",
                       code="not_found" if exc.status_code == 404 else None,
                       headers=dict(exc.headers or {}))

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


def create_app(worker: Worker, config: ServeConfig, vocab: Vocabulary,
               log: Callable[[str], None]) -> Starlette:
    api = _API(worker, config, vocab)
    errors = Errors(log)
    openai = errors.default
    serve, guarded = api.serving.endpoint, errors.guarded

    def route(path: str, shape: Any, endpoint: Any, *methods: str) -> Route:
        return errors.speaking(shape, Route(path, guarded(endpoint),
                                            methods=list(methods) or None))

    chat, completion = OpenAI(ChatRequest), OpenAI(CompletionRequest)
    rounds = RoundsDialect(worker.draft_max, worker.drafters)
    infill = InfillDialect(vocab, config.model_id)  # llama-server's, for code editors
    described = Described()  # GET /openapi.json: public, as /health is (openapi.py says why)
    routes = [
        Route("/health", api.health),
        route("/openapi.json", openai, described.endpoint, "GET"),
        route("/metrics", openai, api.metrics),
        route("/v1/models", openai, api.models),
        route("/v1/models/{model_id:path}", openai, api.model),
        route("/v1/chat/completions", chat, serve(chat), "POST"),
        route("/v1/completions", completion, serve(completion), "POST"),
        route("/v1/responses", api.responses, serve(api.responses), "POST"),
        route("/v1/responses/{response_id}", api.responses, api.stored_response, "GET"),
        route("/v1/responses/{response_id}", api.responses, api.delete_response, "DELETE"),
        route("/v1/messages", api.messages, serve(api.messages), "POST"),
        route("/v1/messages/count_tokens", api.messages, api.count_tokens, "POST"),
        route("/v1/rounds", rounds, serve(rounds), "POST"),
        route("/infill", infill, serve(infill), "POST"),
        *page_routes(),
    ]
    described.describe(routes, keyed=config.api_key is not None)

    async def not_found(request: Request, exc: Exception) -> Response:
        return await guarded(lambda r: api.not_found(r, exc))(request)

    middleware = [
        # A flood of requests gets a 503 in the API's shape instead of stalling everyone.
        Middleware(Limit, limit=config.limit_concurrency, errors=errors),
        # The browser boundary (Host, Origin, Content-Type) before any route's work.
        Middleware(Guard, bound_host=config.host, allowed_origins=config.allowed_origins,
                   errors=errors),
    ]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: not_found})
