"""Bodies at the edges of what Anthropic's Messages and OpenAI's Responses APIs take,
through a real `specllama serve`: past a cap, a key that is not text, and a store of
responses that must hold what it counts. Each comes back as a 400 (or a 200) in the
API's own JSON shape, never a 500 or memory that grows with every request."""

from __future__ import annotations

import json
import sys

import httpx
import pytest
from servers import ServerProcess

from specllama.server.schema import MAX_MESSAGES, MAX_PARTS

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 40],
                      tmp_path_factory.mktemp("edges"))
    yield s
    s.kill()


def post(server, path: str, body: dict | str) -> httpx.Response:
    """A body sent as it is written: a str is JSON text (escapes and all)."""
    content = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return httpx.post(f"{server.url}{path}", content=content.encode(), timeout=120,
                      headers={"content-type": "application/json"})


def anthropic_error(r: httpx.Response) -> str:
    """A 400 in Anthropic's shape: its message."""
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def tool_results(n: int) -> list[dict]:
    return [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "ok"}
            for i in range(n)]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("extra", [
    {"messages": [{"role": "user", "content": tool_results(MAX_MESSAGES + 1)}]},
    # The system prompt is one more turn: 2,048 tool results and it are one too many.
    {"messages": [{"role": "user", "content": tool_results(MAX_MESSAGES)}],
     "system": "Answer briefly."},
], ids=["tool-results", "tool-results-and-system"])
def test_more_turns_than_the_engine_takes_is_a_400_naming_messages(server, path, extra):
    """Each tool_result block is a turn of its own in Chat Completions' terms: one user
    message of 2,049 of them is past the 2,048 messages the engine takes."""
    body = {"model": server.model, **extra}
    if path == "/v1/messages":
        body["max_tokens"] = 5
    message = anthropic_error(post(server, path, body))
    assert message.startswith("messages:") and str(MAX_MESSAGES) in message


def text_block(**over) -> dict:
    return {"type": "text", "text": "", **over}


@pytest.mark.parametrize("body, where, what", [
    ({"system": [text_block()] * (MAX_PARTS + 1), "messages": HI},
     "system", "content blocks"),
    ({"messages": [{"role": "user", "content": [{
        "type": "tool_result", "tool_use_id": "toolu_1",
        "content": [text_block()] * 150_000}]}]},
     "messages.0.content.0.content", "content blocks"),
    ({"messages": [{"role": "user", "content": [text_block(
        text="hi", citations=[{}] * 1_000_000)]}]},
     "messages.0.content.0.citations", "citations"),
    ({"system": [text_block(text="Be brief.", citations=[{}] * 1_000_000)], "messages": HI},
     "system.0.citations", "citations"),
], ids=["system", "tool-result-content", "citations", "system-citations"])
def test_lists_of_countless_tiny_items_are_refused_by_name(server, body, where, what):
    """A 4 MiB body of a million `{}` is refused before anything reads the items."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        sent = {"model": server.model, **body}
        if path == "/v1/messages":
            sent["max_tokens"] = 5
        message = anthropic_error(post(server, path, sent))
        assert message.startswith(f"{where}:") and f"{MAX_PARTS} {what}" in message


def test_a_key_that_is_not_text_is_a_400_naming_it_escaped(server):
    """A key of one lone UTF-16 surrogate (`\\ud800`, which UTF-8 cannot write): each API
    answers its own JSON 400, the key written as its escape."""
    key = '"\\ud800": 1, '
    messages = json.dumps(HI)
    for path, body in (
            ("/v1/messages", f'{{{key}"model": "{server.model}", "messages": {messages}, '
                             '"max_tokens": 5}'),
            ("/v1/messages/count_tokens",
             f'{{{key}"model": "{server.model}", "messages": {messages}}}')):
        assert "\\ud800" in anthropic_error(post(server, path, body))
    r = post(server, "/v1/responses", f'{{{key}"model": "{server.model}", "input": "hi"}}')
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert "\\ud800" in error["message"] and error["param"] == "\\ud800"


@pytest.mark.slow  # (twelve 4 MiB schemas compiled: about 90 s on 2 cores)
def test_stored_responses_hold_what_the_store_counts(server):
    """The store's cap (64 MiB of JSON) bounds the memory it holds: a 4 MiB schema of
    empty lists (under `examples`, which the grammar ignores) is 1.4 M Python objects
    decoded, but kept as the JSON it came in. Twelve stored ones would pin twelve such
    graphs; the server's memory grows by less than three."""
    schema = {"type": "object", "properties": {"yes": {"type": "boolean"}},
              "required": ["yes"], "examples": []}
    body = {"model": server.model, "input": "Yes or no?", "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "yes_no", "schema": schema}}}
    room = 4 * 2**20 - len(json.dumps(body)) - 64  # the server reads 4 MiB at most
    schema["examples"] = [[]] * (room // 3)  # "[]," each
    # What one decoded schema takes: each empty list, and its slot in the outer one.
    graph = len(schema["examples"]) * (sys.getsizeof([]) + 8)

    def send(store: bool) -> str:
        r = post(server, "/v1/responses", {**body, "store": store})
        assert r.status_code == 200, r.text
        return r.json()["id"]

    for _ in range(2):  # the grammar compiled, the allocator warm: what any request costs
        send(store=False)
    before = server.rss_kib() * 1024
    ids = [send(store=True) for _ in range(12)]
    grown = server.rss_kib() * 1024 - before
    # The twelve bodies' JSON is 0.6 of one graph; the rest, the allocator's slack.
    assert grown < 3 * graph, (grown >> 20, graph >> 20)
    kept = httpx.get(f"{server.url}/v1/responses/{ids[-1]}", timeout=120).json()
    assert kept["text"]["format"]["schema"] == schema
