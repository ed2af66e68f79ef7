"""schemathesis against a real `specllama serve` on the tiny models, its requests drawn
from the server's own /openapi.json (tests/test_serve_openapi.py checks the document).

It draws bodies positive (what the document calls well-formed) and negative (one part of
one made wrong) and checks each answer: no 5xx, a status and a content type the document
lists, an answer that follows its schema (each API's error shape, the model card, the
token count, each event of a stream), and a 4xx for every body the document calls wrong.
A fixed seed (derandomize) and no example database: the same requests every run.
(schemathesis' lazy pytest loader, `from_fixture`, reads a node attribute pytest 9 no
longer has, so the cases are drawn with its Python API, `as_strategy`, under hypothesis'
own `given`.)
"""

from __future__ import annotations

import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from servers import ServerProcess

from specllama.server.openapi import OPERATIONS

# Python 3.11 and later (pyproject.toml's test extra installs it there)
schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.config import GenerationConfig  # noqa: E402

MAX_TOKENS = 4
# The fields that say how many tokens to generate, in each API's words.
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
# Cases per operation and mode: about 15 s for all of them on 2 cores. A longer run:
# SPECLLAMA_SCHEMATHESIS_EXAMPLES=200 (about 3 minutes).
EXAMPLES = int(os.environ.get("SPECLLAMA_SCHEMATHESIS_EXAMPLES", "12"))


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 512, "--draft-max", 3, "--temperature", 0.8,
                       "--max-tokens", MAX_TOKENS], tmp_path_factory.mktemp("schemathesis"))
    yield s
    s.kill()


# Not positive_data_acceptance: a well-formed body may be refused for what it means (a
# tool_choice naming no tool, a prompt past the window, a grammar that does not compile),
# which no schema says; tests/test_fuzz.py counts the features a generation answered.
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "negative_data_rejection")


def shaped(body: object, model: str) -> object:
    """The served model where a string names one (else every body is a 404, whatever
    else is wrong), short generations; neither makes a wrong body right."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = model
    for name in TOKEN_FIELDS:
        value = body.get(name)
        if type(value) is int and not 0 <= value <= MAX_TOKENS:
            body[name] = MAX_TOKENS if value > 0 or name == "n_predict" else value
    return body


@pytest.fixture(scope="module")
def api(server):
    config = schemathesis.Config.from_dict({
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
        "request-timeout": 60,
    })
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=config)

    @schema.hook
    def map_body(context, body):
        return shaped(body, server.model)

    return schema


# Negative cases where the document has something to make wrong: a body, an enum.
CASES = [(path, method, mode) for (path, method), op in sorted(OPERATIONS.items())
         for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         if mode == GenerationMode.POSITIVE or op.body or path == "/page/{name}"]


@pytest.mark.parametrize(("path", "method", "mode"), CASES,
                         ids=[f"{m.upper()} {p} {mode.value}" for p, m, mode in CASES])
def test_schemathesis_finds_the_server_keeping_its_document(api, path, method, mode):
    operation = api[path][method.upper()]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def answers(case):
        case.call_and_validate()

    answers()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_field_made_wrong_in_turn_is_refused(api, server, path):
    """schemathesis' coverage phase, its negative cases: each field of the body in turn
    of a wrong type, past a bound, or (a field the server refuses) at a value other than
    its no-op one; each must get a 4xx. The fields refused by name are all among them."""
    operation = api[path]["POST"]
    properties = api.raw_schema["components"]["schemas"][OPERATIONS[(path, "post")].body][
        "properties"]
    refused = {name: prop["enum"] for name, prop in properties.items()
               if prop.get("description", "").startswith("Not supported")}
    sent: set[str] = set()
    for case in api.iter_coverage_cases(operation, generation_modes=[GenerationMode.NEGATIVE],
                                        generation_config=GenerationConfig()):
        case.body = shaped(case.body, server.model)
        case.call_and_validate()
        if isinstance(case.body, dict):
            sent |= {name for name, no_op in refused.items()
                     if name in case.body and case.body[name] not in no_op}
    assert refused and sent == set(refused)


# ---------------------------------------------- what schemathesis found first (#64)


def test_a_boolean_is_no_number(server):
    """The request models were lax (pydantic's default): `true` passed as 1.0, "2" as 2,
    0 as false."""
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "model": server.model, "messages": [{"role": "user", "content": "x"}],
        "temperature": True, "max_tokens": "2", "stream": 0})
    assert r.status_code in (400, 422), r.text


def test_a_tiny_repeat_penalty_is_no_server_error(server):
    """A repeat_penalty under ~1e-38 made the float32 logits it divides infinite, and
    every sampled request a 500 (engine/penalties.py now caps them)."""
    r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": server.model, "prompt": "hello", "max_tokens": 2, "temperature": 0.8,
        "repeat_penalty": 1e-40})
    assert r.status_code < 500, r.text
