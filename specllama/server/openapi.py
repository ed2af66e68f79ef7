"""GET /openapi.json: an OpenAPI 3.1 description of every route of the server, built once
per app from its route table (app.py).

The request bodies are the JSON Schemas of the pydantic models the APIs parse them with
(schema.py, apis/*_schema.py), with what their parsers check beyond the models set down
beside them (openapi_bodies.py): the fields refused unless at their no-op value, the
string shorthands, the caps. The answers: the error shape of each API, and the small
fixed answers (a model card, a token count), as the models below; a generation's answer
is described in words (the routes write it as a dict, no model gives its schema).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import __version__
from .openapi_bodies import JSON, request_schemas
from .page import FILES


class _Answer(BaseModel):
    # An answer may carry more than the keys described (specllama's figures, ...).
    model_config = ConfigDict(extra="allow")


class OpenAIErrorDetail(_Answer):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(_Answer):
    """OpenAI's error body, for every route but Anthropic's."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(_Answer):
    type: str
    message: str


class AnthropicError(_Answer):
    """Anthropic's error body, on /v1/messages and /v1/messages/count_tokens."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class ModelCard(_Answer):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Answer):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Answer):
    """Without the key (when the server has one) only `status`; with it the figures."""

    status: Literal["ok", "unavailable"]


class TokenCount(_Answer):
    input_tokens: int


class DeletedResponse(_Answer):
    id: str
    object: Literal["response.deleted"]
    deleted: bool


ANSWERS: tuple[type[BaseModel], ...] = (OpenAIError, AnthropicError, ModelCard, ModelList,
                                        Health, TokenCount, DeletedResponse)

STATUSES = {
    400: "Refused: not UTF-8 JSON, a value out of range, a field this server does not honour "
         "(named in `param`, code `unsupported_parameter`), a prompt longer than the context "
         "window, a constraint that does not compile, ...",
    401: "A missing or wrong API key (a server started with --api-key).",
    403: "A Host or Origin header the browser guard refuses (forbidden_host, forbidden_origin).",
    404: "A model other than the one served (model_not_found), or no such stored response.",
    408: "The request body took too long to arrive.",
    413: "A request body over 4 MiB.",
    415: "A POST whose Content-Type is not application/json.",
    422: "JSON of the wrong shape: a missing field, a wrong type.",
    500: "A defect of the server's (logged), or the engine failing while it generated.",
    503: "No room: the queue is full, too many requests in progress, the engine restarting or "
         "the server stopping; Retry-After says when to try again.",
}
# Any route may meet the guard (403: Host, Origin), the limit on requests in progress (503)
# and a defect (500), /health the guard alone (guard.py).
_ANY_ROUTE = (403, 500, 503)
_POST = (400, 401, 404, 408, 413, 415)
STREAMS = "With `stream: true`, server-sent events (text/event-stream) instead"

# One server-sent event (OpenAPI 3.1 describes a text/event-stream by its events): its
# name where the API names them, its data a JSON object; OpenAI's streams end with [DONE].
_DATA: JSON = {"type": "string", "contentMediaType": "application/json",
               "contentSchema": {"type": "object"}}
SHAPES: JSON = {  # the events, and /infill's answer (one body or several)
    "Event": {"type": "object", "required": ["data"], "description": "A server-sent event.",
              "properties": {"event": {"type": "string"}, "data": _DATA}},
    "InfillAnswer": {"description": "llama-server's /completion body; with n_cmpl above 1 a "
                     "list of them, each with its index.", "anyOf": [
                         {"type": "object"}, {"type": "array", "items": {"type": "object"}}]},
    "ChunkEvent": {"type": "object", "required": ["data"], "description": "A chunk (or an "
                   "error) as a server-sent event; the last one's data is [DONE].",
                   "properties": {"data": {"anyOf": [{"const": "[DONE]"}, _DATA]}}},
}


@dataclass(frozen=True)
class Operation:
    """One route's method, as the document describes it."""

    summary: str
    ok: str  # what a 200 holds
    tag: str
    body: str | None = None  # the request body's schema, in components
    answer: str | None = None  # a 200's JSON schema, in components; None: described only
    media: tuple[str, ...] = ("application/json",)  # a 200's content types
    events: str = "Event"  # a text/event-stream's event, in components
    errors: str = "OpenAIError"  # the error body's schema, in components
    statuses: tuple[int, ...] = (401,)  # besides every route's (_ANY_ROUTE)
    keyed: bool = True  # needs --api-key's key when the server has one


_JSON_OR_SSE = ("application/json", "text/event-stream")
_ANTHROPIC = "AnthropicError"

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/health", "get"): Operation(
        "Liveness", "Alive; the figures too with the key (or when there is none). 503 while "
        "the engine is down.", "specllama", answer="Health", statuses=(), keyed=False),
    ("/openapi.json", "get"): Operation("This document", "The OpenAPI document.", "specllama",
                                        statuses=(), keyed=False),
    ("/metrics", "get"): Operation("Prometheus metrics", "Prometheus' text format.",
                                   "specllama", media=("text/plain",)),
    ("/v1/models", "get"): Operation("The model served", "One model.", "OpenAI",
                                     answer="ModelList"),
    ("/v1/models/{model_id}", "get"): Operation(
        "One model", "The model card, with the pair under `speculative`.", "OpenAI",
        answer="ModelCard", statuses=(401, 404)),
    ("/v1/chat/completions", "post"): Operation(
        "Chat Completions", f"A chat.completion. {STREAMS}: chunks, then `data: [DONE]`.",
        "OpenAI", body="ChatRequest", media=_JSON_OR_SSE, events="ChunkEvent",
        statuses=(*_POST, 422)),
    ("/v1/completions", "post"): Operation(
        "Completions (legacy)", f"A text_completion. {STREAMS}: chunks, then `data: [DONE]`.",
        "OpenAI", body="CompletionRequest", media=_JSON_OR_SSE, events="ChunkEvent",
        statuses=(*_POST, 422)),
    ("/v1/responses", "post"): Operation(
        "Responses", f"A Response. {STREAMS}: OpenAI's named events, response.created to "
        "response.completed, .incomplete or .failed.", "OpenAI", body="ResponsesRequest",
        media=_JSON_OR_SSE, statuses=(*_POST, 422)),
    ("/v1/responses/{response_id}", "get"): Operation(
        "A stored Response", "The Response as it was answered.", "OpenAI",
        statuses=(401, 404)),
    ("/v1/responses/{response_id}", "delete"): Operation(
        "Delete a stored Response", "Deleted.", "OpenAI", answer="DeletedResponse",
        statuses=(401, 404)),
    ("/v1/messages", "post"): Operation(
        "Anthropic's Messages", f"A Message. {STREAMS}: Anthropic's events, message_start to "
        "message_stop.", "Anthropic", body="MessagesRequest", media=_JSON_OR_SSE,
        errors=_ANTHROPIC, statuses=_POST),
    ("/v1/messages/count_tokens", "post"): Operation(
        "Count a prompt's tokens", "The prompt's tokens, templates and tools in.", "Anthropic",
        body="CountTokensRequest", answer="TokenCount", errors=_ANTHROPIC, statuses=_POST),
    ("/v1/rounds", "post"): Operation(
        "The round-event stream", "Server-sent events, round by round (docs/apis.md, "
        "Round events); it always streams.", "specllama", body="RoundsRequest",
        media=("text/event-stream",), statuses=(*_POST, 422)),
    ("/infill", "post"): Operation(
        "Fill in the middle (llama-server's)", "llama-server's /completion answer. With "
        "`stream: true`, server-sent events, the last with `stop: true`.", "llama-server",
        body="InfillRequest", answer="InfillAnswer", media=_JSON_OR_SSE,
        statuses=(*_POST, 422)),
    ("/", "get"): Operation("The live page", "The page.", "specllama", media=("text/html",),
                            statuses=(), keyed=False),
    ("/page/{name}", "get"): Operation(
        "The live page's files", "The file.", "specllama",
        media=tuple(media.partition(";")[0] for media in FILES.values()), statuses=(404,),
        keyed=False),
}

PARAMETERS: dict[str, JSON] = {
    "model_id": {"type": "string", "description": "The model's id (it may hold '/')."},
    "response_id": {"type": "string", "description": "A Response's id (`resp_...`)."},
    "name": {"enum": list(FILES), "description": "One of the page's files."},
}
_PARAMETER = re.compile(r"{(\w+)}")

DESCRIPTION = """Exact speculative decoding over llama.cpp: OpenAI's Chat Completions, \
Completions and Responses, Anthropic's Messages, llama-server's /infill and specllama's \
round-event stream, on one model pair.

Request bodies are JSON (`Content-Type: application/json`, at most 4 MiB). Errors come \
in the shape of the API asked (OpenAI's `{"error": {...}}`, Anthropic's `{"type": \
"error", ...}` on /v1/messages). No route answers 429: a server with no room answers 503 \
with Retry-After. With --api-key every route but /health, /openapi.json and the live page \
needs `Authorization: Bearer KEY` (or `x-api-key: KEY`)."""

SECURITY_SCHEMES: JSON = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "--api-key's key"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key",
               "description": "--api-key's key, as Anthropic's clients send it"},
}


def document(routes: Sequence[BaseRoute], *, keyed: bool) -> JSON:
    """The OpenAPI document of `routes` (each must be in OPERATIONS: a KeyError names one
    that is not); `keyed`: the server has an API key, which the keyed routes require."""
    _, defs = models_json_schema([(m, "serialization") for m in ANSWERS],
                                 ref_template="#/components/schemas/{model}")
    schemas = {**defs["$defs"], **request_schemas(), **SHAPES}
    paths: dict[str, JSON] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            key = (route.path_format, method.lower())
            if key not in OPERATIONS:
                raise KeyError(f"{method} {route.path_format} is not in openapi.OPERATIONS")
            paths.setdefault(route.path_format, {})[key[1]] = _operation(key, keyed)
    return {
        "openapi": "3.1.0",
        "info": {"title": "specllama serve", "version": __version__,
                 "description": DESCRIPTION, "license": {"name": "MIT", "identifier": "MIT"}},
        "tags": [{"name": name} for name in ("OpenAI", "Anthropic", "llama-server",
                                             "specllama")],
        "paths": paths,
        "components": {"schemas": schemas, "responses": _errors(),
                       "securitySchemes": SECURITY_SCHEMES},
    }


def _operation(key: tuple[str, str], keyed: bool) -> JSON:
    path, method = key
    op = OPERATIONS[key]
    ok: JSON = {"description": op.ok, "content": {
        media: {"schema": _schema(media, op.answer, op.events)} for media in op.media}}
    out: JSON = {"operationId": f"{method}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_')}",
                 "summary": op.summary, "tags": [op.tag], "responses": {"200": ok}}
    names = _PARAMETER.findall(path)
    if names:
        out["parameters"] = [{"name": n, "in": "path", "required": True,
                              "schema": PARAMETERS[n]} for n in names]
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _ref(op.body)}}}
    if keyed and op.keyed:
        out["security"] = [{"bearer": []}, {"apiKey": []}]
    health = path == "/health"
    for status in sorted({*op.statuses, *((403,) if health else _ANY_ROUTE)}):
        out["responses"][str(status)] = {"$ref": f"#/components/responses/{op.errors}{status}"}
    if health:  # its own 503: the status, the reason and Retry-After
        out["responses"]["503"] = {"description": "The engine is down; it is being started "
                                   "again.", "headers": _RETRY_AFTER,
                                   "content": {"application/json": {"schema": _ref("Health")}}}
    return out


_RETRY_AFTER: JSON = {"Retry-After": {"description": "Seconds to wait before trying again.",
                                      "schema": {"type": "string"}}}


def _errors() -> JSON:
    """Each error status in each API's shape, for the operations to refer to."""
    out: JSON = {}
    for shape in ("OpenAIError", _ANTHROPIC):
        for status, words in STATUSES.items():
            out[f"{shape}{status}"] = {"description": words, "content": {
                "application/json": {"schema": _ref(shape)}}}
            if status == 503:
                out[f"{shape}{status}"]["headers"] = _RETRY_AFTER
    return out


def _schema(media: str, answer: str | None, events: str) -> JSON:
    """A 200's schema: its model's or any JSON object, one event of a stream, or text."""
    if media == "text/event-stream":
        return _ref(events)
    if media != "application/json":
        return {"type": "string"}
    return {"type": "object"} if answer is None else _ref(answer)


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


class Described:
    """The route GET /openapi.json. Public like /health (no key): the document tells
    nothing of the model or of other clients, and the tools that read it (client
    generators, Swagger UI, schemathesis) fetch it before they hold a key; vLLM's
    /openapi.json answers without its --api-key too."""

    def __init__(self) -> None:
        self.body = b"{}"

    def describe(self, routes: Sequence[BaseRoute], *, keyed: bool) -> None:
        """Built once, when the app's route table is complete."""
        self.body = json.dumps(document(routes, keyed=keyed)).encode()

    async def endpoint(self, request: Request) -> Response:
        return Response(self.body, media_type="application/json")

