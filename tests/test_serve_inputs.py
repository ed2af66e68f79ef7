"""Inputs that got past validation (issue #52), through a real `specllama serve` on
127.0.0.1 with the tiny pair, httpx and the official `openai` client: each was a 500, a
silently dropped field or a stalled event loop, and is now an answer or a 400 naming the
field."""

from __future__ import annotations

import json

import httpx
import pytest
from servers import ServerProcess

from specllama.server.apierror import APIError
from specllama.server.schema import MAX_MESSAGES, MAX_PARTS, MAX_TOOLS, ChatRequest

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Repeats itself, so lookups draft as well as the draft model.
REPEATS = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
N_CTX = 1024


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", N_CTX, "--draft-max", 3, "--max-tokens", 32],
                      tmp_path_factory.mktemp("inputs"))
    yield s
    s.kill()


def post(server, path: str, body: dict | None = None, *, content: bytes | None = None,
         **json_body) -> httpx.Response:
    if content is None:
        content = json.dumps({"model": server.model, **(body or {}), **json_body}).encode()
    return httpx.post(f"{server.url}{path}", content=content, timeout=60,
                      headers={"content-type": "application/json"})


def chat(server, **body) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"messages": ASK, **body})


def refused(r: httpx.Response, param: str, *words: str, code: str | None = None) -> dict:
    """A one-line OpenAI-shaped 400 naming `param`."""
    assert r.status_code == 400, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    for word in words:
        assert word in error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return error


# ------------------------------------------------------------ temperatures near 0


@pytest.mark.parametrize("temperature", [1e-38, 1e-45])
def test_a_temperature_near_0_answers_as_greedy(server, temperature):
    """1/T overflowed to NaN: every lookup and forced draft was accepted, then the next
    draw failed with a 500. Now p is the argmax one-hot, as at temperature 0."""
    client = server.client()
    for messages in (ASK, [{"role": "user", "content": REPEATS}]):
        greedy, tiny = (client.chat.completions.create(
            model=server.model, messages=messages, temperature=t, seed=3, max_tokens=24)
            for t in (0, temperature))
        assert tiny.choices[0].message.content == greedy.choices[0].message.content
        assert tiny.usage.completion_tokens == greedy.usage.completion_tokens
    # forced drafts: a constraint forces the JSON's punctuation
    greedy, tiny = (chat(server, temperature=t, seed=3, max_tokens=24,
                         response_format={"type": "json_object"}) for t in (0, temperature))
    assert tiny.status_code == greedy.status_code == 200, tiny.text
    assert tiny.json()["choices"][0] == greedy.json()["choices"][0]
    # and the legacy endpoint
    greedy, tiny = (post(server, "/v1/completions", prompt=REPEATS, temperature=t,
                         max_tokens=24) for t in (0, temperature))
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


# ------------------------------------------------------------- tools and their inputs


def test_tools_with_a_json_format_answer_with_calls_or_json_of_the_format(server):
    """An agent's tools beside its output type (the OpenAI Agents SDK sends both): under
    "auto" each answer is calls or JSON of the format, one grammar admitting either;
    "required" is calls alone. A format that does not compile is still its own 400."""
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
        "additionalProperties": False}}}
    kinds = set()
    for seed in range(6):
        r = chat(server, tools=[WEATHER], response_format=schema, temperature=1.0, seed=seed,
                 max_tokens=200)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        if message.get("tool_calls"):
            kinds.add("calls")
            for call in message["tool_calls"]:
                assert set(json.loads(call["function"]["arguments"])) == {"city"}
        elif r.json()["choices"][0]["finish_reason"] == "stop":
            kinds.add("json")
            assert set(json.loads(message["content"])) == {"a"}
    assert "json" in kinds, kinds  # (the tiny model rarely opens a call unasked)
    called = 0
    for seed in range(3):
        r = chat(server, tools=[WEATHER], response_format=schema, tool_choice="required",
                 temperature=1.0, seed=seed, max_tokens=200)
        choice = r.json()["choices"][0]
        called += bool(choice["message"].get("tool_calls"))
        # nothing but a call: a call cut by max_tokens keeps none, and no text either
        assert choice["message"].get("tool_calls") or choice["finish_reason"] == "length", \
            r.text
    assert called
    invalid = {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "no-such-type"}}}
    for choice in (None, "none"):
        extra = {} if choice is None else {"tool_choice": choice}
        refused(chat(server, tools=[WEATHER], response_format=invalid, **extra),
                "response_format", "not valid", code="invalid_json_schema")
    refused(chat(server, tools=[WEATHER], grammar='root ::= "x"'), "grammar",
            "cannot be combined with tools")
    r = chat(server, tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"},
             temperature=0, max_tokens=8)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("{")


def called(arguments: str) -> list[dict]:
    return [*ASK, {"role": "assistant", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.mark.parametrize("what, arguments, words", [
    ("a number of 5,000 digits", '{"city": ' + "9" * 5000 + "}", "too many digits"),
    ("100,000 nested lists", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("100,000 nested objects", '{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
])
def test_earlier_call_arguments_past_what_python_reads_are_400s(server, what, arguments, words):
    refused(chat(server, tools=[WEATHER], messages=called(arguments)), "messages",
            "messages[1].tool_calls[0].function.arguments", words)
    # arguments that are not JSON at all still go in as sent
    assert chat(server, tools=[WEATHER], messages=called("not json"),
                max_tokens=2).status_code == 200


@pytest.mark.parametrize("depth", [900, 960, 985, 995])
def test_arguments_nested_near_the_limit_are_an_answer_or_a_400(server, depth):
    """Around the depth json.loads reaches, whichever side of it: never a 500 (the
    prompt is then longer than the window, or the arguments too deep to read)."""
    r = chat(server, tools=[WEATHER], max_tokens=2,
             messages=called("[" * depth + "]" * depth))
    error = refused(r, "messages")
    assert error["code"] == "context_length_exceeded" or "nested too deeply" in \
        error["message"], error


def test_arguments_past_what_python_reads_in_a_template_with_tools(tiny_model_factory):
    """A template that renders calls itself (test_tools.TOOLS_TEMPLATE): the 400 names
    the message, not the template."""
    from test_tools import TOOLS_TEMPLATE

    from specllama.engine.llama import Vocabulary
    from specllama.server.prompts import chat_tokens

    vocab = Vocabulary(tiny_model_factory(seed=0, chat_template=TOOLS_TEMPLATE))
    try:
        for arguments in ('{"city": ' + "9" * 5000 + "}", "[" * 100_000 + "]" * 100_000):
            req = ChatRequest.model_validate({"model": "m", "tools": [WEATHER],
                                              "messages": called(arguments)})
            with pytest.raises(APIError) as info:
                chat_tokens(vocab, req)
            assert info.value.status == 400 and info.value.param == "messages"
            assert "messages[1].tool_calls[0].function.arguments" in info.value.message
    finally:
        vocab.close()


def test_duplicate_tool_names_are_refused(server):
    other = {"type": "function", "function": {"name": "now"}}
    for choice in (None, "none", "required"):
        extra = {} if choice is None else {"tool_choice": choice}
        refused(chat(server, tools=[WEATHER, other, WEATHER], **extra), "tools",
                "tools[2].function.name", "'get_weather'", "tools[0]")
    assert chat(server, tools=[WEATHER, other], max_tokens=2).status_code == 200


def padded(server, room: int) -> list[dict]:
    """Messages whose prompt, with the tools, leaves about `room` tokens of the window."""
    def prompt_tokens(n: int) -> int:
        r = chat(server, tools=[WEATHER], tool_choice="none", max_tokens=1,
                 messages=[{"role": "user", "content": "ab " * n}])
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    base, more = prompt_tokens(0), prompt_tokens(100)
    n = (N_CTX - room - base) * 100 // (more - base)
    while prompt_tokens(n) > N_CTX - room:
        n -= 1
    assert N_CTX - room - 6 <= prompt_tokens(n) <= N_CTX - room
    return [{"role": "user", "content": "ab " * n}]


def test_a_tool_call_the_window_cannot_hold_names_tools(server):
    """The tools' grammar went unmet when the context filled: the 400 names tools, not
    response_format (which the request never sent)."""
    messages = padded(server, room=8)
    r = chat(server, tools=[WEATHER], tool_choice="required", messages=messages,
             max_tokens=N_CTX - 1, temperature=0)
    error = refused(r, "tools", "context window", code="context_length_exceeded")
    assert "response_format" not in error["message"]
    # streamed: the 200 has gone out, so the error is an event
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": server.model, "messages": messages, "tools": [WEATHER],
            "tool_choice": "required", "max_tokens": N_CTX - 1, "temperature": 0,
            "stream": True}) as stream:
        events = [json.loads(line[5:]) for line in stream.iter_lines()
                  if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1 and errors[0]["param"] == "tools", events[-1]


# ------------------------------------------------------------------- parse limits


def many(count: int, item: str) -> str:
    return "[" + ",".join([item] * count) + "]"


@pytest.mark.parametrize("field, count, item, param", [
    ("messages", 250_000, '{"role":"user"}', "messages"),
    ("stop", 1_000_000, '"a"', "stop"),
    ("tools", 80_000, '{"type":"function","function":{"name":"f"}}', "tools"),
    ("parts", 150_000, '{"type":"text","text":"a"}', "messages"),
    ("logit_bias", 300_000, None, "logit_bias"),
])
def test_a_body_of_a_million_items_is_refused_by_name(server, field, count, item, param):
    """A body under the 4 MiB limit whose arrays hold hundreds of thousands of items is
    refused from their length, before anything walks them (it took seconds of the
    event loop: see the issue)."""
    head = f'{{"model": "{server.model}", '
    ask = '"messages": [{"role": "user", "content": "hi"}]'
    if field == "parts":
        body = f'{head}"messages": [{{"role": "user", "content": {many(count, item)}}}]}}'
    elif field == "logit_bias":
        entries = ",".join(f'"{i}": 1' for i in range(count))
        body = f"{head}{ask}, \"logit_bias\": {{{entries}}}}}"
    elif field == "messages":
        body = f'{head}"messages": {many(count, item)}}}'
    else:
        body = f'{head}{ask}, "{field}": {many(count, item)}}}'
    assert len(body) <= 4 * 2**20
    r = post(server, "/v1/chat/completions", content=body.encode())
    code = "unsupported_parameter" if field == "logit_bias" else "array_above_max_length"
    refused(r, param, code=code)
    assert chat(server, max_tokens=2).status_code == 200  # still serving


def test_the_caps_are_openais_and_stop_at_them(server):
    hi = {"role": "user", "content": "hi"}
    over = [
        ({"messages": [hi] * (MAX_MESSAGES + 1)}, "messages", "maximum length 2048"),
        ({"stop": ["a"] * 5}, "stop", "maximum length 4"),
        ({"tools": [{"type": "function", "function": {"name": f"f{i}"}}
                    for i in range(MAX_TOOLS + 1)]}, "tools", "maximum length 128"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 64}]
          * (MAX_PARTS // 64 + 1)}, "messages", "messages[64].content", "4096 content parts"),
    ]
    for body, param, *words in over:
        refused(chat(server, **body), param, *words, code="array_above_max_length")
    # at the caps: past the size checks (the window may still refuse the prompt)
    at = [
        {"messages": [hi] * MAX_MESSAGES},
        {"stop": ["a"] * 4},
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}}
                   for i in range(MAX_TOOLS)]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 64}]
         * (MAX_PARTS // 64)},
    ]
    for body in at:
        r = chat(server, max_tokens=2, **body)
        assert r.status_code in (200, 400), r.text[:300]
        if r.status_code == 400:
            assert r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    prompt = post(server, "/v1/completions", prompt=["a", "b"])
    refused(prompt, "prompt", code="array_above_max_length")
