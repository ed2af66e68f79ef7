"""`specllama serve` as clients use it: a real server process on 127.0.0.1 with the tiny
models, the official `openai` client, httpx and a raw socket."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from click.testing import CliRunner
from servers import AppOnThread, ServerProcess, starting
from tinymodels import write_tiny_mamba

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.server import Defaults, ServeConfig
from specllama.server.app import create_app
from specllama.server.jobs import Slot
from specllama.server.schema import MAX_CHOICES
from specllama.server.worker import Worker

PROMPT = "Hello world"


@pytest.fixture(scope="module")
def start(tiny_target, tiny_draft, tmp_path_factory):
    """start(*extra_args) -> a running ServerProcess on the tiny pair; all killed at the end."""
    with starting(tmp_path_factory, "serve", "--target", tiny_target, "--draft", tiny_draft,
                  "--threads", 1, "--n-ctx", 512, "--draft-max", 3, "--temperature", 0.8,
                  "--max-tokens", 24) as make:
        yield make


@pytest.fixture(scope="module")
def server(start) -> ServerProcess:
    return start()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


def ask(server, path: str, body=None, *, content: bytes | None = None, headers=None,
        method: str = "POST") -> httpx.Response:
    if content is None and body is not None:
        content = json.dumps(body).encode()
    return httpx.request(method, f"{server.url}{path}", content=content, timeout=30,
                         headers={"content-type": "application/json", **(headers or {})})


def chat_body(server, **over) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": PROMPT}], **over}


# ------------------------------------------------------------------------------ the API


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [server.model]
    card = client.models.retrieve(server.model)
    assert card.model_extra["speculative"]["draft_max"] == 3
    health = server.health()
    assert health["status"] == "ok" and health["model"] == server.model


def test_chat_streamed_equals_not_streamed_for_a_seed(server, client):
    kw = dict(model=server.model, messages=[{"role": "user", "content": PROMPT}],
              temperature=0.9, seed=7, max_tokens=20)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 20 and whole.usage.prompt_tokens > 0
    figures = whole.model_extra["speculative"]
    assert figures["target_steps"] >= 1 and figures["draft_max"] == 3
    assert 0 <= figures["acceptance_rate"] <= 1 and figures["tokens_per_step"] >= 1
    assert {"drafted", "accepted", "acceptance_by_position", "tokens_per_s", "policy"} <= set(
        figures)

    chunks = list(client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    assert chunks[-1].model_extra["speculative"]["accepted"] == figures["accepted"]


def test_completion_streamed_equals_not_streamed_for_a_seed(server, client):
    kw = dict(model=server.model, prompt=PROMPT, temperature=1.0, top_p=0.9, seed=3,
              max_tokens=16)
    whole = client.completions.create(**kw)
    streamed = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert "speculative" in streamed[-1].model_extra


def test_the_sse_wire_format(server):
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30, json={
        "model": server.model, "prompt": PROMPT, "max_tokens": 4, "stream": True,
    }) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "text_completion" for line in data[:-1])


def generate_json(tiny_target, tiny_draft, *args) -> dict:
    result = CliRunner().invoke(cli, [
        "generate", "--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
        "--n-ctx", "512", "--json", "--temperature", "0", "--draft-max", "0", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_greedy_output_equals_specllama_generate(server, client, tiny_target, tiny_draft):
    raw = generate_json(tiny_target, tiny_draft, "--raw", "--max-tokens", 20, PROMPT)
    got = client.completions.create(model=server.model, prompt=PROMPT, temperature=0,
                                    max_tokens=20)
    assert got.choices[0].text == raw["text"]

    chat = generate_json(tiny_target, tiny_draft, "--chat", "--max-tokens", 20, PROMPT)
    got = client.chat.completions.create(model=server.model, temperature=0, max_tokens=20,
                                         messages=[{"role": "user", "content": PROMPT}])
    assert got.choices[0].message.content == chat["text"]
    assert got.usage.prompt_tokens == chat["prompt_tokens"]


def test_a_request_drafts_from_the_answers_before_it(server, client):
    """The server's history: a request that writes what an earlier one wrote copies it,
    counted as drafted from the session, and the text is the same (greedy)."""
    body = {"model": server.model, "prompt": "a dog and a cat and a bird", "max_tokens": 24,
            "temperature": 0}
    first = client.completions.create(**body)
    second = client.completions.create(**body)
    assert second.choices[0].text == first.choices[0].text
    figures = second.model_extra["speculative"]
    assert figures["origin_drafted"].get("session", 0) > 0, figures
    assert figures["origin_accepted"].get("session", 0) > 0, figures


def test_stop_and_max_tokens(server, client):
    kw = dict(model=server.model, prompt=PROMPT, temperature=0)
    full = client.completions.create(**kw, max_tokens=20).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = client.completions.create(**kw, max_tokens=20, stop=[stop, "\u00a7never"])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    short = client.completions.create(**kw, max_tokens=2)
    assert short.usage.completion_tokens <= 2
    assert full.startswith(short.choices[0].text)


def test_a_multi_turn_chat_reuses_the_cached_prefix(server, client):
    def say(messages):
        return client.chat.completions.create(model=server.model, messages=messages,
                                              temperature=0, max_tokens=12)

    first_turn = [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello the cat"}]
    first = say(first_turn)
    second_turn = [*first_turn, {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "and the dog"}]
    second = say(second_turn)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    assert second.model_extra["speculative"]["prompt_tokens_reused"] == cached
    # The same conversation after an unrelated request: the prompt cache's copy of it
    # serves it (without one it is evaluated again: test_promptcache.py), the same reply.
    client.completions.create(model=server.model, prompt="one two", max_tokens=4)
    again = say(second_turn)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == second.choices[0].message.content
    assert server.health()["cache"]["consistent"] is True


def test_a_client_that_disconnects_mid_stream(server, client):
    long = dict(model=server.model, prompt="the cat and the dog", temperature=0, max_tokens=400)
    reference = client.completions.create(**long)
    assert reference.usage.completion_tokens > 50  # long enough to leave in the middle
    before = server.health()["requests"]["cancelled"]
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**long, "stream": True},
                      timeout=30) as r:
        received = 0
        for line in r.iter_lines():
            received += line.startswith("data: ")
            if received == 2:
                break  # leaving the block closes the connection
    health = server.wait_idle()
    assert health["requests"]["cancelled"] == before + 1
    assert health["cache"]["consistent"] is True
    after = client.completions.create(**long)
    assert after.choices[0].text == reference.choices[0].text
    assert server.health()["cache"]["consistent"] is True


def test_an_abandoned_non_streaming_request_is_cancelled(server):
    before = server.health()["requests"]["cancelled"]
    sock = socket.create_connection((server.url.split("//")[1].split(":")[0],
                                     int(server.url.rsplit(":", 1)[1])))
    body = json.dumps({"model": server.model, "prompt": "the cat and the dog",
                       "temperature": 0, "max_tokens": 480}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json"
                 b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.05)
    sock.close()
    health = server.wait_idle()
    assert health["requests"]["cancelled"] == before + 1, health
    assert health["cache"]["consistent"] is True


# ---------------------------------------------------------------- several choices (n)


def by_index(chunks, chat: bool) -> dict[int, str]:
    """A stream's text per choice, reassembled by `index` as OpenAI's clients do."""
    texts: dict[int, str] = {}
    for c in chunks:
        for choice in c.choices:
            piece = (choice.delta.content or "") if chat else choice.text
            texts[choice.index] = texts.get(choice.index, "") + piece
    return texts


def test_n_greedy_choices_are_each_the_one_answer(server, client):
    kw = dict(model=server.model, messages=[{"role": "user", "content": PROMPT}],
              temperature=0, max_tokens=16)
    one = client.chat.completions.create(**kw)
    three = client.chat.completions.create(**kw, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert {c.finish_reason for c in three.choices} == {one.choices[0].finish_reason}
    # usage as OpenAI counts n: the prompt once, the choices' tokens summed
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == one.usage.prompt_tokens + 3 * one.usage.completion_tokens
    # each choice has its own figures, the answer's are their sums; later choices find
    # the prompt in the caches
    each = [c.model_extra["speculative"] for c in three.choices]
    summed = three.model_extra["speculative"]
    assert summed["choices"] == 3 and "finish_reason" not in summed
    assert summed["drafted"] == sum(f["drafted"] for f in each)
    assert all(f["prompt_tokens_reused"] >= one.usage.prompt_tokens - 1 for f in each[1:])

    chunks = list(client.chat.completions.create(
        **kw, n=3, stream=True, stream_options={"include_usage": True}))
    assert by_index(chunks, chat=True) == {i: one.choices[0].message.content for i in range(3)}
    roles = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role]
    finals = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert roles == [0, 1, 2] and finals == [(i, one.choices[0].finish_reason) for i in range(3)]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        three.usage.completion_tokens
    assert chunks[-1].model_extra["speculative"]["choices"] == 3


def test_n_sampled_choices_are_seed_plus_index(server, client):
    """Choice i of a request with seed s is the answer of seed s + i asked alone: each
    its own draw, reproducible; without a seed each draws afresh."""
    kw = dict(model=server.model, prompt=PROMPT, temperature=1.0, max_tokens=12)
    texts = [c.text for c in client.completions.create(**kw, n=3, seed=11).choices]
    assert texts == [client.completions.create(**kw, seed=11 + i).choices[0].text
                     for i in range(3)]
    streamed = list(client.completions.create(**kw, n=3, seed=11, stream=True))
    assert by_index(streamed, chat=False) == dict(enumerate(texts))
    assert [c.choices[0].index for c in streamed if c.choices[0].finish_reason] == [0, 1, 2]
    assert any(len({c.text for c in client.completions.create(**kw, n=3, seed=s).choices}) > 1
               for s in (1, 2, 3))
    unseeded = client.completions.create(**kw, n=4)
    assert len({c.text for c in unseeded.choices}) > 1


def test_later_choices_leave_no_copies_in_the_prompt_cache(server, client):
    """Before a later choice the caches hold the prompt and an earlier choice's answer:
    not copied into the prompt cache (a request leaves one copy, whatever its n)."""
    kw = dict(model=server.model, temperature=1.0, seed=5, max_tokens=48,
              extra_body={"ignore_eos": True})  # 48 tokens: each answer worth a copy
    client.completions.create(**kw, prompt="a bird and a fish")
    before = server.wait_idle()["prompt_cache"]["entries"]
    four = client.completions.create(**kw, prompt="three birds", n=4)
    assert len({c.text for c in four.choices}) > 1
    assert server.wait_idle()["prompt_cache"]["entries"] <= before + 1  # the fish's copy


def test_a_client_that_disconnects_stops_the_choices_left(server, client):
    long = dict(model=server.model, prompt="the cat and the dog", temperature=0, max_tokens=400)
    reference = client.completions.create(**long)
    health = server.wait_idle()
    before, tokens = health["requests"]["cancelled"], health["requests"]["tokens"]
    with httpx.stream("POST", f"{server.url}/v1/completions",
                      json={**long, "n": 8, "stream": True}, timeout=30) as r:
        received = 0
        for line in r.iter_lines():
            received += line.startswith("data: ")
            if received == 2:
                break
    health = server.wait_idle()
    assert health["requests"]["cancelled"] == before + 1
    assert health["requests"]["tokens"] - tokens < reference.usage.completion_tokens
    assert health["cache"]["consistent"] is True


# --------------------------------------------------------------------------- bad requests


def test_bad_requests_get_openai_shaped_errors(server):
    cases = [
        # (what, path, body or raw bytes, status, param, code)
        ("malformed JSON", "/v1/chat/completions", b'{"model": ', 400, None, None),
        ("empty body", "/v1/chat/completions", b"", 400, None, None),
        ("not UTF-8", "/v1/chat/completions", b'{"model": "\xff\xfe"}', 400, None, None),
        ("unknown model", "/v1/chat/completions", chat_body(server, model="gpt-9"), 404,
         "model", "model_not_found"),
        ("negative max_tokens", "/v1/chat/completions", chat_body(server, max_tokens=-5), 400,
         "max_tokens", None),
        ("temperature out of range", "/v1/chat/completions", chat_body(server, temperature=2.5),
         400, "temperature", None),
        ("top_p out of range", "/v1/completions",
         {"model": server.model, "prompt": "hi", "top_p": 0}, 400, "top_p", None),
        ("temperature not a number", "/v1/chat/completions",
         chat_body(server, temperature="hot"), 422, "temperature", None),
        ("no messages", "/v1/chat/completions", {"model": server.model}, 422, "messages", None),
        ("empty messages", "/v1/chat/completions", chat_body(server, messages=[]), 400,
         "messages", None),
        ("unknown role", "/v1/chat/completions",
         chat_body(server, messages=[{"role": "wizard", "content": "hi"}]), 422, "messages", None),
        ("a JSON list", "/v1/completions", [1, 2], 422, None, None),
        ("more choices than the cap", "/v1/completions",
         {"model": server.model, "prompt": "hi", "n": MAX_CHOICES + 1}, 400, "n", None),
        ("n_cmpl of none", "/v1/chat/completions", chat_body(server, n_cmpl=0), 400, "n_cmpl",
         None),
        ("several choices of one round-event turn", "/v1/rounds", chat_body(server, n=2), 400,
         "n", None),
        ("negative n", "/v1/completions", {"model": server.model, "prompt": "hi", "n": -1},
         400, "n", None),
        ("prompt longer than the context", "/v1/completions",
         {"model": server.model, "prompt": "the cat " * 600}, 400, "prompt",
         "context_length_exceeded"),
    ]
    for what, path, body, status, param, code in cases:
        raw = body if isinstance(body, bytes) else None
        r = ask(server, path, None if raw is not None else body, content=raw)
        assert r.status_code == status, (what, r.status_code, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, what
        assert error["type"] == "invalid_request_error", what
        assert error["param"] == param and error["code"] == code, (what, error)
        assert "Traceback" not in error["message"] and error["message"], what
    assert server.health()["status"] == "ok"


def test_deep_nesting_and_lone_surrogates_are_the_clients_mistakes(server):
    """Bodies that once got a 500 from the parser or the tokenizer: each is a 400 naming
    the problem."""
    deep = "[" * 5000 + "]" * 5000
    head = f'{{"model": "{server.model}", "messages": [{{"role": "user", "content": '
    cases = [
        # (what, raw body, param, words the message must hold)
        ("nested 5,000 deep in a message", f"{head}{deep}}}]}}", None, "nested too deeply"),
        ("a body that is only nesting", deep, None, "nested too deeply"),
        ("a lone surrogate in a message", head + '"\\ud800 hi"}]}', "messages",
         "messages.0.content: holds a lone UTF-16 surrogate"),
        ("a lone low surrogate in a stop string",
         f'{{"model": "{server.model}", "prompt": "hi", "stop": ["\\udc00"]}}', "stop",
         "stop.0: holds a lone UTF-16 surrogate"),
        ("a number of 5,000 digits",
         f'{{"model": "{server.model}", "prompt": "hi", "max_tokens": {"9" * 5000}}}', None,
         "a number with too many digits"),
    ]
    for what, body, param, words in cases:
        path = "/v1/completions" if '"prompt"' in body else "/v1/chat/completions"
        r = ask(server, path, content=body.encode())
        assert r.status_code == 400, (what, r.status_code, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, what
        assert words in error["message"], (what, error["message"])
    # A surrogate pair is one character (U+1F600), not a lone surrogate.
    paired = head + '"\\ud83d\\ude00 hi"}], "max_tokens": 2}'
    assert ask(server, "/v1/chat/completions", content=paired.encode()).status_code == 200
    assert server.health()["status"] == "ok"


def test_unknown_routes_methods_and_oversized_bodies(server):
    r = ask(server, "/v1/embeddings", {"model": server.model, "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = ask(server, "/v1/chat/completions", method="GET")
    assert r.status_code == 405 and "error" in r.json()
    r = ask(server, "/v1/completions", content=b" " * (4 * 2**20 + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # Declaring a body far too large is refused before it is sent.
    host, port = server.url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: 1000000000\r\n\r\n{")
        head = sock.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413")
    assert server.health()["status"] == "ok"


def test_the_openai_client_raises_its_own_errors(server, client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model, prompt="hi", temperature=9)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model, prompt="hi", n=MAX_CHOICES + 1)
    assert info.value.body["param"] == "n" and "\n" not in info.value.body["message"]
    assert info.value.body["message"] == f"n: {MAX_CHOICES + 1} choices asked, at most " \
        f"{MAX_CHOICES} here"
    assert "Traceback" not in server.stderr  # after every bad request and disconnect above


def test_api_key(start):
    server = start("--api-key", "s3cret")
    body = {"model": server.model, "prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = ask(server, "/v1/completions", body, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert ask(server, "/v1/models", method="GET").status_code == 401
    assert ask(server, "/metrics", method="GET").status_code == 401
    assert ask(server, "/metrics", method="GET",
               headers={"Authorization": "Bearer s3cret"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    assert server.client(api_key="s3cret").completions.create(**body).choices[0].text is not None
    assert server.health() == {"status": "ok"}  # health checks need no key; figures do
    assert server.stop() == 0


# ------------------------------------------------------------------- the server's faults


class InProcessServer:
    """The API on a real socket of 127.0.0.1, served from this process around a decoder
    the test built (what `specllama serve` runs, less its signal handling)."""

    def __init__(self, decoder: SpeculativeDecoder, model: str) -> None:
        self.model, self.log = model, []
        self.worker = Worker(Slot(decoder), max_waiting=8, draft_max=0, drafters=("lookup",),
                             log=self.log.append)
        config = ServeConfig(model, Defaults(SamplingParams(temperature=0.0), 8),
                             draft_max=0, drafters=("lookup",), n_ctx=decoder.n_ctx)
        app = create_app(self.worker, config, decoder.target, self.log.append)
        self.worker.start()
        self.http = AppOnThread(app)
        self.url = self.http.url

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def stop(self) -> None:
        self.http.stop()
        self.worker.close()


@pytest.fixture
def refusing_cache(tmp_path):
    """A server whose target's KV cache llama.cpp refuses to cut back: a recurrent (Mamba)
    model that claims it can drop a suffix, as in test_rewind.py. A request that shares
    only a prefix with the previous one makes the engine cut there, for real."""
    mamba = write_tiny_mamba(tmp_path / "tiny-mamba.gguf")
    decoder = SpeculativeDecoder.load(mamba, n_ctx=128, n_threads=1, p_min=0.0)
    decoder.target.rewinder.best = "trim"
    server = InProcessServer(decoder, "mamba")
    yield server
    server.stop()
    decoder.close()


def test_a_server_side_fault_is_a_500_not_the_clients_mistake(refusing_cache):
    server = refusing_cache
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    prompt = "a" * 12
    client.completions.create(model="mamba", prompt=prompt)
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model="mamba", prompt=prompt[:6] + " " + prompt)
    assert info.value.status_code == 500
    error = info.value.body
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error"
    assert error["message"].startswith("generation failed: tiny-mamba.gguf: llama.cpp could "
                                       "not drop cached tokens")
    assert server.health()["requests"]["failed"] == 1

    # Streaming: a fault before any text is the request's status too, not a 200.
    r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": "mamba", "prompt": prompt[:3] + " " + prompt, "stream": True,
    })
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert server.health()["requests"]["failed"] == 2


def test_a_generation_refused_before_it_begins_fails_that_request_only(tiny_target):
    """decoder.stream() itself raising (here: a draft length out of range) used to end the
    worker thread, and every later request waited forever."""
    decoder = SpeculativeDecoder.load(tiny_target, n_ctx=128, n_threads=1)
    server = InProcessServer(decoder, "tiny")
    server.worker.draft_max = -1
    try:
        for _ in range(2):
            r = httpx.post(f"{server.url}/v1/completions", timeout=30,
                           json={"model": "tiny", "prompt": "the cat"})
            assert r.status_code == 400, r.text
            assert "draft_max" in r.json()["error"]["message"], r.text
        assert server.health()["requests"]["failed"] == 2
    finally:
        server.stop()
        decoder.close()


def test_the_cost_measurement_runs_on_the_decoding_thread(tiny_target):
    """llama.cpp's OpenMP keeps a team of threads per thread that ever decoded: once the
    main thread had measured auto's costs, the worker's decodes ran at 0.6x (0.33x for
    a whole server), so `prepare` (the measurement) runs on the worker's thread, and
    start() returns only once it has."""
    decoder = SpeculativeDecoder.load(tiny_target, n_ctx=128, n_threads=1)
    seen: list[int] = []
    engine = Slot(decoder, prepare=lambda: (time.sleep(0.2),
                                              seen.append(threading.get_ident())))
    worker = Worker(engine, max_waiting=1, draft_max=0, drafters=("lookup",))
    try:
        worker.start()
        assert seen == [worker._threads[0].ident]
    finally:
        worker.close()
        decoder.close()


# ------------------------------------------------------------------------- the command


def test_a_public_host_without_a_key_warns(tmp_path):
    result = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--port", "0",
                                      "--target", str(tmp_path / "missing.gguf"),
                                      "--draft", "lookup"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2
    assert lines[0] == ("warning: serving on 0.0.0.0 without --api-key: anyone who can reach "
                        "this machine can use it")
    assert lines[1].startswith("specllama: error: ")


def test_a_taken_port_is_a_one_line_error(tiny_target):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--port", str(port), "--target",
                                          str(tiny_target), "--draft", "lookup"])
    assert result.exit_code == 2
    assert result.stderr == f"specllama: error: cannot listen on 127.0.0.1:{port}: " \
                            "Address already in use\n"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_stream_stops_cleanly_with_the_totals(start, sig):
    server = start()
    client = server.client()
    client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
        "model": server.model, "prompt": "the cat and the dog", "temperature": 0,
        "max_tokens": 480, "stream": True,
    }) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        server.proc.send_signal(sig)
        rest = [line for line in lines if line.startswith("data: ")]  # ends: cut or finished
    assert server.proc.wait(60) == 0, server.stderr
    assert "Traceback" not in server.stderr
    assert re.search(r"stopped: \d+ completed, \d+ cancelled, 0 failed", server.stderr)
    assert "target steps" in server.stderr  # the totals table
    assert rest[-1] == "data: [DONE]"  # the stream ended properly, cut short or not
    assert all("error" not in json.loads(line[6:]) for line in rest[:-1])


# ---------------------------------------------------------------------------- load test


@pytest.mark.parametrize("queue", [8, 0])
def test_load_8_clients_5_requests_each(start, queue):
    """Every request completes or gets 503 with Retry-After; none hangs or is lost; the
    server's memory stays flat. With room for 8 waiting, 8 clients never see a 503; with
    none, clients that find the server busy do."""
    server = start("--queue", queue)
    client = server.client(timeout=120)
    warm = dict(model=server.model, prompt=PROMPT, max_tokens=16)
    for _ in range(8):
        client.completions.create(**warm)
    rss_before = server.rss_kib()

    def one(i: int, j: int):
        t0 = time.perf_counter()
        kw = dict(model=server.model, max_tokens=16, seed=i * 10 + j)
        try:
            if j % 2:
                stream = client.chat.completions.create(
                    **kw, messages=[{"role": "user", "content": f"{PROMPT} {i} {j}"}],
                    stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            else:
                text = client.completions.create(**kw, prompt=f"{PROMPT} {i} {j}").choices[0].text
            return "ok", time.perf_counter() - t0, text
        except openai.APIStatusError as exc:
            return exc.status_code, time.perf_counter() - t0, exc.response.headers.get(
                "retry-after")

    def client_loop(i: int):
        return [one(i, j) for j in range(5)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client_loop, i) for i in range(8)]
        results = [r for f in futures for r in f.result(timeout=600)]
    wall = time.perf_counter() - t0
    ok = [r for r in results if r[0] == "ok"]
    busy = [r for r in results if r[0] == 503]
    assert len(results) == 40 and len(ok) + len(busy) == 40, results
    assert ok, "no request got through"
    assert bool(busy) == (queue == 0), busy
    assert all(r[2] and int(r[2]) >= 1 for r in busy), busy
    health = server.wait_idle()
    assert health["requests"]["completed"] == 8 + len(ok)
    assert health["requests"]["rejected"] == len(busy)
    assert health["requests"]["failed"] == 0 and health["cache"]["consistent"] is True
    rss_after = server.rss_kib()
    latencies = sorted(r[1] for r in ok)
    p50 = latencies[len(latencies) // 2]
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    print(f"\nload, --queue {queue}: 40 requests from 8 clients in {wall:.1f} s: "
          f"{len(ok)} completed, {len(busy)} answered 503 (Retry-After), 0 failed; "
          f"latency p50 {p50 * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms; RSS {rss_before // 1024} -> {rss_after // 1024} MiB")
    assert rss_after - rss_before < 32 * 1024, (rss_before, rss_after)
    assert server.stop() == 0


# ------------------------------------------------------------------- the default pair


@pytest.mark.slow
def test_the_default_pair_answers_as_generate_does(smollm2_path, tmp_path):
    question = "What is 2 + 2?"
    server = ServerProcess(["--threads", 2, "--n-ctx", 1024, "--draft-max", 3], tmp_path)
    try:
        assert server.model == "smollm2"
        reply = server.client(timeout=300).chat.completions.create(
            model="smollm2", temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": question}])
        assert server.stop() == 0
    finally:
        server.kill()
    result = CliRunner().invoke(
        cli, ["generate", question, "--json", "--temperature", "0", "--max-tokens", "24",
              "--threads", "2", "--n-ctx", "1024", "--draft-max", "3"],
        env={"SPECLLAMA_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exit_code == 0, result.output
    assert reply.choices[0].message.content == json.loads(result.stdout)["text"]
    figures = reply.model_extra["speculative"]
    assert figures["drafted"] > 0 and figures["tokens_per_step"] > 1


def _hand_over(stream: bool, n: int = 3000) -> tuple[list[list], int]:
    """A worker thread puts n text events (each followed by a round's verdict, which no
    request reads), then the end; returns the batches the event loop got and how often
    it was woken."""
    from specllama import Finished, GenerationResult, RoundVerified, Stats, TextFlushed
    from specllama.server.handoff import END as _END
    from specllama.server.handoff import Job

    verdict = RoundVerified(drafted=(), origins=(), accepted=0, token=1, kind="plain",
                            emitted=1, p=(), q=(), source="model", draft_s=0.0, target_s=0.0,
                            seconds=0.0)
    result = GenerationResult([1] * n, "x" * n, "length", Stats(), 3)

    async def main() -> tuple[list[list], int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        plain = loop.call_soon_threadsafe

        def counting(*args):
            nonlocal wakeups
            wakeups += 1
            return plain(*args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        job = Job(None, loop, "test", "text" if stream else "end")  # type: ignore[arg-type]

        def worker() -> None:
            for i in range(n):
                job.put(TextFlushed(f"{i},"))
                job.put(verdict)
            job.put(Finished(result))
            job.put(_END)

        thread = threading.Thread(target=worker)
        thread.start()
        batches = [batch async for batch in job.batches()]
        thread.join()
        return batches, wakeups

    return asyncio.run(main())


def test_a_stream_gets_every_piece_of_text_in_order_and_wakes_the_loop_per_batch():
    from specllama import Finished, TextFlushed

    batches, wakeups = _hand_over(stream=True)
    items = [item for batch in batches for item in batch]
    assert isinstance(items[-1], Finished)
    assert all(isinstance(i, TextFlushed) for i in items[:-1])  # no verdicts crossed over
    assert "".join(i.text for i in items[:-1]) == "".join(f"{i}," for i in range(3000))
    # Every batch took a wake-up, and no piece of text took more than one.
    assert len(batches) <= wakeups <= len(items) + 1


def test_a_non_streaming_request_is_handed_only_its_end():
    from specllama import Finished

    batches, wakeups = _hand_over(stream=False)
    assert [[type(i) for i in b] for b in batches] == [[Finished]]
    assert wakeups <= 2  # the end, and the end of the job
