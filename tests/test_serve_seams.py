"""The server's seams, through real servers on 127.0.0.1: one error responder answering
in each API's shape (the guard's refusals included), a place in the queue taken before
a request's own work, a body that must arrive in time, stored responses that only
DELETE deletes, and the round-event stream's settings checked by the settings table."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
from servers import AppOnThread, ServerProcess, starting

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.server import Defaults, ServeConfig, Slot
from specllama.server.app import create_app
from specllama.server.worker import Worker

ALLOWED = "http://app.example:3000"


@pytest.fixture(scope="module")
def start(tiny_target, tiny_draft, tmp_path_factory):
    with starting(tmp_path_factory, "seams", "--target", tiny_target, "--draft", tiny_draft,
                  "--threads", 1, "--n-ctx", 512, "--draft-max", 2, "--max-tokens", 6) as make:
        yield make


@pytest.fixture(scope="module")
def server(start) -> ServerProcess:
    return start("--allowed-origins", ALLOWED)


def anthropic_shaped(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def openai_shaped(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


# ------------------------------------------------------------ one error responder
def test_every_refusal_on_anthropics_routes_is_in_anthropics_shape(server):
    url = server.url
    body = json.dumps({"model": server.model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]})
    # the guard's, before any route: no JSON content type, a foreign origin
    anthropic_shaped(httpx.post(f"{url}/v1/messages", content=body, timeout=10,
                                headers={"content-type": "text/plain"}), 415)
    anthropic_shaped(httpx.post(f"{url}/v1/messages/count_tokens", json={}, timeout=10,
                                headers={"origin": "https://evil.example"}), 403)
    # routing's: a method the route lacks, a path under the API that does not exist
    anthropic_shaped(httpx.get(f"{url}/v1/messages", timeout=10), 405)
    anthropic_shaped(httpx.post(f"{url}/v1/messages/batches", json={}, timeout=10), 404)
    # the route's own: a body that is not JSON, a model not served, for both routes
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        anthropic_shaped(httpx.post(url + path, content=b"{", timeout=10,
                                    headers={"content-type": "application/json"}), 400)
        wrong = {**json.loads(body), "model": "nope"}
        if path.endswith("count_tokens"):  # (it takes no max_tokens)
            del wrong["max_tokens"]
        anthropic_shaped(httpx.post(url + path, json=wrong, timeout=10), 404)


def test_the_openai_routes_and_unknown_ones_answer_in_openais_shape(server):
    url = server.url
    openai_shaped(httpx.get(f"{url}/v1/chat/completions", timeout=10), 405)
    openai_shaped(httpx.post(f"{url}/v1/nothing", json={}, timeout=10), 404)
    openai_shaped(httpx.post(f"{url}/v1/completions", content=b"[", timeout=10,
                             headers={"content-type": "application/json"}), 400)
    error = openai_shaped(httpx.get(f"{url}/v1/responses/resp_missing", timeout=10), 404)
    assert "resp_missing" in error["message"]


# ----------------------------------------------------------------- stored responses
def test_head_reads_a_stored_response_and_only_delete_deletes_it(server):
    """Starlette answers HEAD on a GET route: it must never reach the delete."""
    client = server.client()
    rid = client.responses.create(model=server.model, input="Hello",
                                  max_output_tokens=4).id
    url = f"{server.url}/v1/responses/{rid}"
    for _ in range(2):  # a page elsewhere may send HEAD (no-cors) with no Origin at all
        assert httpx.head(url, timeout=10).status_code == 200
    assert httpx.get(url, timeout=10).json()["id"] == rid
    deleted = httpx.delete(url, timeout=10)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert httpx.get(url, timeout=10).status_code == 404


def test_an_allowed_origin_may_delete_a_stored_response(server):
    client = server.client()
    rid = client.responses.create(model=server.model, input="Hi", max_output_tokens=3).id
    url = f"{server.url}/v1/responses/{rid}"
    asked = httpx.options(url, timeout=10, headers={
        "Origin": ALLOWED, "Access-Control-Request-Method": "DELETE"})
    assert asked.status_code == 204
    assert "DELETE" in {m.strip() for m in asked.headers["access-control-allow-methods"]
                        .split(",")}
    gone = httpx.delete(url, timeout=10, headers={"Origin": ALLOWED})
    assert gone.status_code == 200 and gone.headers["access-control-allow-origin"] == ALLOWED


# ---------------------------------------------------------- the round-event stream
def rounds_final(server: ServerProcess, **fields) -> dict:
    body = {"model": server.model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hello"}], **fields}
    with httpx.stream("POST", server.url + "/v1/rounds", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1]["final"]
    return data[-1]


def test_a_turns_draft_settings_are_checked_by_the_settings_table(server):
    """The table's range (as --draft-max and /set take it), not a limit of the page's."""
    last = rounds_final(server, draft_max=20, drafters="model")
    assert last["speculative"]["draft_max"] == 20
    assert last["speculative"]["drafters"] == ["model"]  # the turn's, not the server's
    assert last["trace"]["settings"]["drafters"] == ["model"]
    assert last["comparison"] is not None
    r = httpx.post(server.url + "/v1/rounds", timeout=10, json={
        "model": server.model, "draft_max": 65, "messages": [{"role": "user", "content": "x"}]})
    error = openai_shaped(r, 400)
    assert error["param"] == "draft_max" and "[0, 64]" in error["message"]


# ------------------------------------------------------- a server built in this process
@pytest.fixture
def in_process(tiny_target):
    """One slot, no queue, a body allowed 1 s: a real server on 127.0.0.1, built here so
    the test can hold the slot with a generation of its own."""
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=4096, n_threads=1), None)
    worker = Worker(Slot(decoder), max_waiting=0, draft_max=0, drafters=())
    config = ServeConfig("tiny", Defaults(SamplingParams(temperature=0.0), 8), draft_max=0,
                         drafters=(), n_ctx=4096, max_waiting=0, body_timeout_s=1.0)
    log: list[str] = []
    app = create_app(worker, config, decoder.target, log.append)
    worker.start()
    http = AppOnThread(app)
    yield http.url, worker
    http.stop()
    worker.close()


def test_a_full_queue_turns_requests_away_before_their_own_work(in_process):
    """A grammar that would not compile, and count_tokens, get the queue's 503 while
    the only slot is busy: neither compiles nor tokenizes first."""
    url, worker = in_process
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model="tiny", prompt="a", max_tokens=3000, stream=True)
    next(iter(stream))  # the slot is generating
    try:
        bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}
        r = httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "response_format": bad_schema})
        assert openai_shaped(r, 503)["code"] == "queue_full"
        r = httpx.post(f"{url}/v1/messages/count_tokens", timeout=10, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert anthropic_shaped(r, 503)["type"] == "overloaded_error"
    finally:
        stream.close()
    for _ in range(100):  # the slot is free once the cancelled job has ended
        if not worker.busy:
            break
        time.sleep(0.05)
    r = httpx.post(f"{url}/v1/messages/count_tokens", timeout=10, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_frees_its_place(in_process):
    url, _ = in_process
    host, port = url.split("//")[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    answer = b""
    try:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
        sock.settimeout(10)
        started = time.monotonic()
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        waited = time.monotonic() - started
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.9 < waited < 5
    ok = httpx.post(f"{url}/v1/completions", timeout=30,
                    json={"model": "tiny", "prompt": "a", "max_tokens": 2})
    assert ok.status_code == 200


def test_a_request_past_the_limit_in_progress_is_refused_in_its_apis_shape(in_process):
    """The limit (guard.Limit, inside the app now) answers with the one responder."""
    url, _ = in_process
    host, port = url.split("//")[1].rsplit(":", 1)
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    socks = []
    try:
        for _ in range(33):  # parallel 1 + queue 0 + 32
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head)
            socks.append(sock)
        deadline = time.monotonic() + 60  # until the server has read every one's headers
        while time.monotonic() < deadline:
            r = httpx.post(f"{url}/v1/messages", json={}, timeout=10)
            if r.status_code == 503:
                break
            threading.Event().wait(0.05)
        assert anthropic_shaped(r, 503)["type"] == "overloaded_error"
    finally:
        for sock in socks:
            sock.close()
