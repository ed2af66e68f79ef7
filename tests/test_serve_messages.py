"""Anthropic's Messages API (`/v1/messages`) through a real `specllama serve`, with the
official `anthropic` client: text, streams, tool_use -> tool_result, stop sequences, and
errors in Anthropic's shape. The answers' shapes are checked against the client's own
types, and the `speculative` figures show that drafting happened."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from pydantic import BaseModel, TypeAdapter
from servers import ServerProcess

from specllama import GenerationResult, Stats
from specllama.server.answer import Call, Calls, ReasoningDelta, TextDelta, Whole
from specllama.server.apierror import APIError
from specllama.server.apis.base import Reply
from specllama.server.apis.messages import MessagesDialect
from specllama.server.prompts import Work

KEY = "sk-local-test"
WEATHER = {"name": "get_weather", "description": "The weather in a city now.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
ADD = {"name": "add", "description": "Add two integers.",
       "input_schema": {"type": "object", "properties": {
           "a": {"type": "integer", "minimum": 0, "maximum": 999},
           "b": {"type": "integer", "minimum": 0, "maximum": 999}},
           "required": ["a", "b"], "additionalProperties": False}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # Anthropic's clients send it in the body; this one has no kwarg


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 120,
                       "--api-key", KEY], tmp_path_factory.mktemp("messages"))
    yield s
    s.kill()


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    # The client adds /v1/messages itself: the base URL is the server's root.
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


def as_the_client_reads(event: dict) -> None:
    """An event as the client's own types read it (it skips pings unread)."""
    if event["type"] != "ping":
        TypeAdapter(RawMessageStreamEvent).validate_python(event)


def valid(block) -> dict:
    """A tool_use block whose input follows its tool's input_schema."""
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, SCHEMAS[block.name])
    return block.input


def test_create_answers_text(server, client):
    r = client.messages.create(model=server.model, max_tokens=24, messages=ASK,
                               system="Answer briefly.", extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.model == server.model
    [block] = r.content
    assert block.type == "text" and block.text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) > 10
    assert 0 < r.usage.output_tokens <= 24
    figures = r.model_extra["speculative"]
    assert figures["drafted"] > 0 and figures["accepted"] > 0


def test_count_tokens_counts_the_prompt_as_the_answer_reads_it(server, client):
    """Claude-Code-style agents ask what a prompt costs before sending it."""
    ask = [{"role": "user", "content": "Tell me about the rivers of France."}]
    counted = client.messages.count_tokens(model=server.model, messages=ask,
                                           system="Answer briefly.")
    r = client.messages.create(model=server.model, max_tokens=2, messages=ask,
                               system="Answer briefly.")
    assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens
                                                           or 0)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.count_tokens(model=server.model, messages=ask,
                                     extra_body={"max_tokens": 5})


def test_a_repeated_prompt_is_read_from_the_cache(server, client):
    ask = [{"role": "user", "content": "Tell me about the sea, the sky and the hills."}]
    client.messages.create(model=server.model, max_tokens=4, messages=ask)
    again = client.messages.create(model=server.model, max_tokens=4, messages=ask)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens < again.usage.cache_read_input_tokens


def test_stream_sends_anthropics_events_in_order(server, client):
    with client.messages.stream(model=server.model, max_tokens=24, messages=ASK,
                                extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and kinds[-3:-1] == ["content_block_stop",
                                                                   "message_delta"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert final.content[0].type == "text" and final.content[0].text == text
    # the same answer as without streaming (greedy)
    whole = client.messages.create(model=server.model, max_tokens=24, messages=ASK,
                                   extra_body=GREEDY)
    assert whole.content[0].text == text and whole.stop_reason == final.stop_reason
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.usage.output_tokens == final.usage.output_tokens > 0
    assert delta.model_extra["speculative"]["drafted"] > 0


def test_each_event_names_its_type(server):
    """Anthropic's SSE: `event: NAME` and data whose `type` is NAME (the client drops
    events without a name)."""
    with httpx.stream("POST", f"{server.url}/v1/messages", headers={"x-api-key": KEY},
                      json={"model": server.model, "max_tokens": 8, "stream": True,
                            "messages": ASK}, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines
             if line.startswith("data: ")]
    assert names == [d["type"] for d in datas] and "ping" in names
    for data in datas:
        as_the_client_reads(data)


def test_tool_choice_any_gives_a_valid_tool_use_every_time(server, client):
    for seed in range(6):
        r = client.messages.create(
            model=server.model, max_tokens=120, messages=ASK, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"seed": seed, "temperature": 1.0})
        assert r.stop_reason == "tool_use", r
        [block] = r.content
        valid(block)
        # the call's opening and the name's quotes are forced: drafted free
        assert r.model_extra["speculative"]["forced"] > 0


def test_a_named_tool_is_the_one_used(server, client):
    for seed in range(3):
        r = client.messages.create(model=server.model, max_tokens=120, messages=ASK,
                                   tools=TOOLS, tool_choice={"type": "tool", "name": "add"},
                                   extra_body={"seed": seed, "temperature": 1.0})
        [block] = r.content
        assert block.name == "add" and set(valid(block)) == {"a", "b"}


def test_a_streamed_tool_use_arrives_as_input_json(server, client):
    with client.messages.stream(
            model=server.model, max_tokens=120, messages=ASK, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"seed": 3}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta")
    assert final.stop_reason == "tool_use"
    [block] = final.content
    assert json.loads(partial) == valid(block)


def test_a_tool_result_goes_back_in(server, client):
    """The agent's loop: the model asks for a tool, the tool's answer goes back as a
    tool_result, and the model answers in text."""
    first = client.messages.create(
        model=server.model, max_tokens=120, messages=ASK, tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"seed": 1})
    [call] = first.content
    valid(call)
    messages = [*ASK, {"role": "assistant", "content": first.content},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"},
                    {"type": "text", "text": "Thanks. Say it in one line."}]}]
    second = client.messages.create(model=server.model, max_tokens=8, messages=messages,
                                    tools=TOOLS, tool_choice={"type": "none"})
    assert [b.type for b in second.content] == ["text"]
    assert second.stop_reason in ("end_turn", "max_tokens")
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert prompt > first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_answer(server, client):
    free = client.messages.create(model=server.model, max_tokens=40, messages=ASK,
                                  extra_body=GREEDY).content[0].text
    stop = free[len(free) // 2:len(free) // 2 + 3]
    r = client.messages.create(model=server.model, max_tokens=40, messages=ASK,
                               stop_sequences=[stop], extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert free.startswith(r.content[0].text) and stop not in r.content[0].text


def test_max_tokens_is_the_stop_reason_when_it_cuts(server, client):
    r = client.messages.create(model=server.model, max_tokens=3, messages=ASK)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_output_format_gives_json_of_the_schema(server, client):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = client.messages.create(model=server.model, max_tokens=60, messages=ASK,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": schema}})
    jsonschema.validate(json.loads(r.content[0].text), schema)
    assert r.model_extra["speculative"]["forced"] > 0


def test_a_streamed_answer_parses_as_the_output_format(server, client):
    # Finite fields: the client leaves bounds (maximum, maxLength) out of the schema it
    # sends, and a random model would write digits forever.
    class Reading(BaseModel):
        unit: Literal["celsius", "fahrenheit"]
        sunny: bool

    with client.messages.stream(model=server.model, max_tokens=60, messages=ASK,
                                output_format=Reading) as stream:
        final = stream.get_final_message()
    assert isinstance(final.content[0].parsed_output, Reading)


def test_an_error_after_the_start_is_an_error_event(server, client):
    """A structured answer the context window cuts short is no answer: streamed, the
    200 is out already, so the stream ends with an `error` event (the client raises)."""
    long = [{"role": "user", "content": "sea " * 480}]  # ~980 of the 1024 tokens
    fmt = {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "minLength": 300}},
        "required": ["a"]}}}
    with pytest.raises(anthropic.APIStatusError) as info:
        with client.messages.stream(model=server.model, max_tokens=500, messages=long,
                                    output_config=fmt) as stream:
            list(stream)
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "context window" in error["message"] and "output_config.format" in error["message"]


def test_what_is_not_supported_is_a_400_naming_it(server, client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    refused = {
        "messages.0.content.0.type": {"messages": [{"role": "user", "content": [image]}]},
        "top_logprobs": {"messages": ASK, "extra_body": {"top_logprobs": 2}},
        "tools.0.type": {"messages": ASK, "tools": [
            {"type": "web_search_20250305", "name": "web_search"}]},
        "messages.1": {"messages": [*ASK, {"role": "assistant", "content": "The sky"}]},
        "temperature": {"messages": ASK, "extra_body": {"temperature": 1.5}},
        "tool_choice.name": {"messages": ASK, "tools": TOOLS,
                             "tool_choice": {"type": "tool", "name": "nope"}},
        # checked where Chat Completions' are (compiled), named as the client sent it
        "output_config.format": {"messages": ASK, "output_config": {"format": {
            "type": "json_schema", "schema": {"type": "nonsense"}}}},
    }
    for field, kwargs in refused.items():
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model=server.model, max_tokens=8, **kwargs)
        assert info.value.status_code == 400
        body = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith(field), (field, body)


def test_a_wrong_key_is_a_401_in_anthropics_shape(server):
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model=server.model, max_tokens=4, messages=ASK)
    assert info.value.body["error"]["type"] == "authentication_error"
    # the key as a bearer token works too (ANTHROPIC_AUTH_TOKEN)
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0)
    assert bearer.messages.create(model=server.model, max_tokens=4, messages=ASK).content


def test_an_unknown_model_is_a_404_in_anthropics_shape(client):
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert info.value.body["error"]["type"] == "not_found_error"


def test_the_guards_refusals_come_in_anthropics_shape_too(server):
    """Refused before any route (a POST that is not JSON, a foreign page, a wrong
    method): an Anthropic client still reads its own error shape."""
    url = f"{server.url}/v1/messages"
    for r, status in ((httpx.post(url, content=b"{}", headers={"x-api-key": KEY,
                       "content-type": "text/plain"}), 415),
                      (httpx.post(url, json={}, headers={"x-api-key": KEY,
                       "origin": "https://evil.example"}), 403),
                      (httpx.get(url, headers={"x-api-key": KEY}), 405)):
        assert r.status_code == status
        body = r.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body


# A Qwen3-style template: the generation prompt opens the reasoning, unless thinking is
# turned off (then it writes an empty reasoning block itself).
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def thinker(tiny_model_factory, tmp_path_factory):
    target = tiny_model_factory(seed=0, chat_template=THINKING)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=THINKING)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 1024,
                       "--draft-max", 3], tmp_path_factory.mktemp("thinker"))
    yield s
    s.kill()


def test_reasoning_comes_as_thinking_blocks_streamed_or_not(thinker):
    """A random model seldom closes its reasoning: the answer is a thinking block, cut
    at max_tokens; streamed, the same text arrives as thinking deltas."""
    client = anthropic.Anthropic(base_url=thinker.url, api_key="unused", max_retries=0)
    ask = {"model": thinker.model, "max_tokens": 16, "messages": ASK, "extra_body": GREEDY,
           "thinking": {"type": "enabled", "budget_tokens": 8}}
    r = client.messages.create(**ask)
    assert r.content[0].type == "thinking" and r.content[0].thinking
    assert "<think>" not in r.content[0].thinking
    with client.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    thought = "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                      and e.delta.type == "thinking_delta")
    assert thought == final.content[0].thinking == r.content[0].thinking
    hidden = client.messages.create(**{**ask, "thinking": {
        "type": "enabled", "budget_tokens": 8, "display": "omitted"}})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""


def test_thinking_disabled_answers_without_reasoning(thinker):
    client = anthropic.Anthropic(base_url=thinker.url, api_key="unused", max_retries=0)
    r = client.messages.create(model=thinker.model, max_tokens=16, messages=ASK,
                               thinking={"type": "disabled"})
    assert [b.type for b in r.content] == ["text"]


# ---------------------------------------------------------------- the parts, no server


def parsed(**over):
    dialect = MessagesDialect()
    body = {"model": "m", "max_tokens": 64, "messages": ASK, **over}
    body = {k: v for k, v in body.items() if v is not None}  # None: left out
    return dialect, dialect.parse(json.dumps(body).encode())


def test_a_conversation_maps_onto_chat_completions_turns():
    dialect, request = parsed(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "disabled"}, metadata={"user_id": "u"}, stop_sequences=["\n\n"],
        messages=[*ASK, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Paris, so...", "signature": "x"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris", "unit": "celsius"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                 "content": [{"type": "text", "text": "timeout"}]},
                {"type": "text", "text": "Try again."}]}])
    chat = dialect.chat(request)
    turns = [(m.role, m.text()) for m in chat.messages]
    assert turns == [("system", "Be brief."), ("user", ASK[0]["content"]),
                     ("assistant", "Let me look."),  # its thinking dropped
                     ("tool", "Error: timeout"), ("user", "Try again.")]
    [call] = chat.messages[2].tool_calls
    assert call.id == "toolu_1" and json.loads(call.function.arguments)["city"] == "Paris"
    assert chat.messages[3].tool_call_id == "toolu_1"
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.tools[1].function.parameters == ADD["input_schema"]
    assert chat.reasoning_effort == "none" and chat.stops == ("\n\n",)
    assert chat.max_tokens == 64 and not chat.stream


def test_thinking_and_effort_map_onto_reasoning_effort():
    def effort(**over):
        return MessagesDialect().chat(parsed(**over)[1]).reasoning_effort

    assert effort() is None
    assert effort(thinking={"type": "enabled", "budget_tokens": 32}) == "medium"
    assert effort(thinking={"type": "adaptive"}, output_config={"effort": "max"}) == "high"
    assert effort(thinking={"type": "disabled"}, output_config={"effort": "low"}) == "none"


def test_refusals_name_the_field():
    cases = {
        "max_tokens": {"max_tokens": None},
        "messages.0.content.1.type": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "document", "source": {"type": "text", "data": "x"}}]}]},
        "messages.0.content.0.content.0.type": {"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]},
        "messages.0.content.0": {"messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "t", "name": "add", "input": {}}]}]},
        "thinking.type": {"thinking": {"type": "between_tools"}},
        "thinking.budget_tokens": {"thinking": {"type": "enabled", "budget_tokens": 64}},
        "container": {"container": "c"},
        "output_config.format": {"tools": TOOLS, "output_config": {
            "format": {"type": "json_schema", "schema": {"type": "object"}}}},
        "tools.0.input_schema.type": {"tools": [{"name": "f", "input_schema": {}}]},
        "tools.2.name": {"tools": [*TOOLS, ADD]},
        "tool_choice": {"tool_choice": {"type": "any"}},
        "stop_sequences": {"stop_sequences": ["a", "b", "c", "d", "e"]},
    }
    for field, over in cases.items():
        with pytest.raises(APIError) as info:
            parsed(**over)
        assert info.value.status == 400, field
        assert info.value.message.startswith(field), (field, info.value.message)
        body = MessagesDialect().error(info.value)
        assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": info.value.message}}


def test_errors_keep_their_status_in_anthropics_types():
    error = MessagesDialect().error
    assert error(APIError(401, "k"))["error"]["type"] == "authentication_error"
    assert error(APIError(503, "busy"))["error"]["type"] == "overloaded_error"
    assert error(APIError(500, "x"))["error"]["type"] == "api_error"
    assert error(APIError(429, "x"))["error"]["type"] == "rate_limit_error"


def result(text: str, finish: str = "eos", stop: str | None = None) -> GenerationResult:
    return GenerationResult(tokens=[1] * 5, text=text, finish_reason=finish,
                            stats=Stats(prompt_reused=4), prompt_tokens=12, stop_string=stop)


def reply() -> Reply:
    work = Work("chat", list(range(12)), 64, None, ())
    return Reply(work, "msg_1", "pair", lambda t: b"", 0)


CALL = Call("call_abc", "add", '{"a": 1, "b": 2}')


def test_a_whole_answer_reads_as_the_clients_message():
    dialect, request = parsed(stop_sequences=["END"])
    whole = Whole("hmm", "Three.", (CALL,), "tool_calls")
    body = dialect.complete(request, reply(), whole, result("..."), {"drafted": 3})
    message = AnthropicMessage.model_validate(body)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == {"a": 1, "b": 2} and message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 8 and message.usage.cache_read_input_tokens == 4
    assert body["speculative"] == {"drafted": 3}
    ended = dialect.complete(request, reply(), Whole(None, "x", (), "stop", "END"),
                             result("x", "stop", "END"), {})
    assert (ended["stop_reason"], ended["stop_sequence"]) == ("stop_sequence", "END")
    cut = dialect.complete(request, reply(), Whole(None, "x", (), "length"),
                           result("x", "context"), {})
    assert cut["stop_reason"] == "model_context_window_exceeded"


def test_a_stream_opens_and_closes_one_block_at_a_time():
    dialect, request = parsed()
    writer = dialect.writer(request, reply())
    events = [*writer.start(),
              *writer.pieces([ReasoningDelta("let me "), ReasoningDelta("think")]),
              *writer.pieces([TextDelta("It is "), TextDelta("sunny.")]),
              *writer.end([Calls((CALL,))], Whole("let me think", "It is sunny.", (CALL,),
                                                  "tool_calls"), result("..."), {"drafted": 1})]
    datas = [json.loads(e["data"]) for e in events]
    assert [e["event"] for e in events] == [d["type"] for d in datas]
    for data in datas:
        as_the_client_reads(data)
    starts = [(d["index"], d["content_block"]["type"]) for d in datas
              if d["type"] == "content_block_start"]
    stops = [d["index"] for d in datas if d["type"] == "content_block_stop"]
    assert starts == [(0, "thinking"), (1, "text"), (2, "tool_use")] and stops == [0, 1, 2]
    deltas = [d["delta"] for d in datas if d["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta"] * 2 + ["text_delta"] * 2 + [
        "input_json_delta"]
    assert json.loads(deltas[-1]["partial_json"]) == {"a": 1, "b": 2}
    end = datas[-2]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == 5 and end["speculative"] == {"drafted": 1}
    [error] = writer.error(APIError(503, "engine lost"))
    assert error["event"] == "error"
    assert json.loads(error["data"])["error"] == {"type": "overloaded_error",
                                                  "message": "engine lost"}
