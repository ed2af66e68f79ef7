"""GET /openapi.json: a valid OpenAPI 3.1 document of every route the server has, public
like /health, its request bodies the request models' own (tests/test_serve_schemathesis.py
draws requests from it against a real server)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from openapi_spec_validator import validate
from servers import AppOnThread
from starlette.routing import Route

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.server import Defaults, ServeConfig
from specllama.server.app import create_app
from specllama.server.jobs import Slot
from specllama.server.worker import Worker


@pytest.fixture(scope="module")
def serve(tiny_target) -> Iterator:
    """serve(api_key) -> (url, route table) of an app built and served here; no
    generation is asked of it, so its worker never starts."""
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=256, n_threads=1), None)
    servers: list[AppOnThread] = []

    def make(api_key: str | None = None) -> tuple[str, list]:
        worker = Worker(Slot(decoder), max_waiting=0, draft_max=0, drafters=())
        config = ServeConfig("tiny", Defaults(SamplingParams(temperature=0.0), 8),
                             draft_max=0, drafters=(), n_ctx=256, api_key=api_key)
        app = create_app(worker, config, decoder.target, lambda line: None)
        servers.append(AppOnThread(app))
        return servers[-1].url, app.routes

    yield make
    for http in servers:
        http.stop()


def test_the_document_is_valid_openapi_and_covers_every_route(serve):
    url, routes = serve()
    r = httpx.get(f"{url}/openapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    document = r.json()
    validate(document)  # OpenAPI 3.1, the schemas included
    assert document["openapi"] == "3.1.0"
    listed = {(path, method) for path, item in document["paths"].items() for method in item}
    table = {(route.path_format, method.lower()) for route in routes
             if isinstance(route, Route) for method in route.methods or {"GET"}
             if method != "HEAD"}  # (Starlette's HEAD beside each GET)
    assert ("/v1/chat/completions", "post") in table and table == listed
    # the request bodies are the models' own; the errors in each API's shape
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatRequest"}
    assert set(chat["responses"]["200"]["content"]) == {"application/json",
                                                       "text/event-stream"}
    assert "messages" in document["components"]["schemas"]["ChatRequest"]["required"]
    refused = document["paths"]["/v1/messages"]["post"]["responses"]["400"]["$ref"]
    assert document["components"]["responses"][refused.rpartition("/")[2]]["content"][
        "application/json"]["schema"] == {"$ref": "#/components/schemas/AnthropicError"}
    # no key: no route asks for one
    assert not any("security" in op for item in document["paths"].values()
                   for op in item.values())


def test_a_keyed_server_publishes_it_and_names_the_routes_that_need_the_key(serve):
    url, _ = serve("s3cret")
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    r = httpx.get(f"{url}/openapi.json", timeout=10)  # public, as /health is
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert paths["/v1/messages"]["post"]["security"] == [{"bearer": []}, {"apiKey": []}]
    assert [p for p, item in paths.items() for op in item.values() if "security" not in op] \
        == ["/health", "/openapi.json", "/", "/page/{name}"]


def test_refused_fields_are_described_at_their_no_op_value_only(serve):
    url, _ = serve()
    schemas = httpx.get(f"{url}/openapi.json", timeout=10).json()["components"]["schemas"]
    chat, completion = (schemas[name]["properties"] for name in ("ChatRequest",
                                                                 "CompletionRequest"))
    assert chat["logit_bias"]["enum"] == [None, {}]
    assert chat["typical_p"]["enum"] == [None, 1]  # (1 and 1.0: one value in JSON)
    # refused on Chat Completions, honoured on Completions (fill in the middle)
    assert chat["suffix"]["enum"] == [None, ""] and "enum" not in json.dumps(
        completion["suffix"])
    responses = schemas["ResponsesRequest"]
    assert responses["additionalProperties"] is False  # an unknown field is a 400 there
    assert responses["properties"]["truncation"]["enum"] == [None, "disabled"]
    assert {"type": "null"} in chat["stream"]["anyOf"]  # null: the default
    assert {"type": "string", "description": "a string: one user message"} in \
        responses["properties"]["input"]["anyOf"]
    assert "max_tokens" not in schemas["CountTokensRequest"]["properties"]
