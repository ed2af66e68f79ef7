"""OpenAI's Responses API (`/v1/responses`) through a real `specllama serve` on 127.0.0.1,
with the official `openai` client: text, streams of named events, function tools and
their loop through `previous_response_id`, the store, JSON schemas, and refusals."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from servers import ServerProcess
from test_reasoning import OPENS

from specllama import GenerationResult, SamplingParams, Stats
from specllama.server.answer import Call, Calls, ReasoningDelta, TextDelta, Whole
from specllama.server.apierror import APIError
from specllama.server.apis.base import Reply
from specllama.server.apis.responses import ResponsesDialect
from specllama.server.apis.responses_schema import MessageItem
from specllama.server.apis.responses_store import ResponsesStore, stored
from specllama.server.prompts import Work
from specllama.server.reasoning import Markers

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "strict": True, "parameters": {
               "type": "object", "properties": {
                   "city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
ADD = {"type": "function", "name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 999},
        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
ASK = "What is the weather in Paris?"
YES_NO = {"type": "object", "properties": {"yes": {"type": "boolean"}}, "required": ["yes"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 40],
                      tmp_path_factory.mktemp("responses"))
    yield s
    s.kill()


def valid(call) -> dict:
    """A function_call item whose arguments follow its tool's schema."""
    assert call.type == "function_call" and call.id.startswith("fc_")
    assert call.call_id.startswith("call_") and call.status == "completed"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.name])
    return arguments


def test_create_answers_text(server):
    r = server.client().responses.create(model=server.model, input="Say hello.",
                                         instructions="Answer briefly.", temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == server.model
    assert r.status in ("completed", "incomplete")
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and r.output_text == message.content[0].text
    assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    # the settings as they applied, and specllama's figures under their own key
    assert r.temperature == 0 and r.store is True and r.tool_choice == "auto"
    assert r.model_extra["speculative"]["target_steps"] > 0


def test_items_in_the_input_are_the_conversation(server):
    """Messages of every role, with text parts, as a client sends a conversation back."""
    client = server.client()
    conversation = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]},
        {"role": "user", "content": "And again?"},
    ]
    long = client.responses.create(model=server.model, input=conversation, temperature=0,
                                   max_output_tokens=4)
    short = client.responses.create(model=server.model, input="And again?", temperature=0,
                                    max_output_tokens=4)
    assert long.usage.input_tokens > short.usage.input_tokens + 8


def test_a_stream_sends_openais_events_in_order(server):
    """A short JSON answer (the schema ends it) streamed: the events in OpenAI's order,
    numbered, and the text the same as the answer not streamed (greedy)."""
    client = server.client()
    ask = {"model": server.model, "input": "Is it raining?", "temperature": 0,
           "text": {"format": {"type": "json_schema", "name": "yes_no", "schema": YES_NO}}}
    with client.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.id == events[0].response.id
    assert final.status == "completed" and final.usage.output_tokens > 0
    jsonschema.validate(json.loads(text), YES_NO)
    assert client.responses.create(**ask).output_text == text


def test_each_event_is_named_by_its_type(server):
    """The raw stream: `event:` lines equal to the data's type, and no [DONE]."""
    body = {"model": server.model, "input": "Hi", "stream": True, "max_output_tokens": 4}
    names, types = [], []
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event:"):
                names.append(line.removeprefix("event:").strip())
            elif line.startswith("data:"):
                types.append(json.loads(line.removeprefix("data:"))["type"])
    assert names == types and names[-1] == "response.incomplete"


def test_required_gives_valid_function_calls(server):
    client = server.client()
    for seed in range(6):
        r = client.responses.create(model=server.model, input=ASK, tools=TOOLS,
                                    tool_choice="required", parallel_tool_calls=False,
                                    temperature=1.0, max_output_tokens=80,
                                    extra_body={"seed": seed})  # specllama's, as in Chat
        [call] = r.output
        valid(call)
        assert r.output_text == ""


def test_a_named_function_is_the_one_called(server):
    r = server.client().responses.create(
        model=server.model, input=ASK, tools=TOOLS, temperature=1.0, extra_body={"seed": 2},
        tool_choice={"type": "function", "name": "add"}, max_output_tokens=80)
    [call] = r.output
    assert call.name == "add" and set(valid(call)) == {"a", "b"}


def test_a_streamed_call_arrives_whole(server):
    with server.client().responses.stream(
            model=server.model, input=ASK, tools=TOOLS, tool_choice="required",
            extra_body={"seed": 3},
            parallel_tool_calls=False, max_output_tokens=80) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    [call] = final.output
    valid(call)


def test_the_tool_loop_continues_with_previous_response_id(server):
    """Call, run the function, send back only its output: the server has the rest."""
    client = server.client()
    first = client.responses.create(model=server.model, input=ASK, tools=TOOLS,
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_output_tokens=80, extra_body={"seed": 1})
    [call] = first.output
    valid(call)
    answer = {"type": "function_call_output", "call_id": call.call_id,
              "output": '{"sky": "clear", "temperature": 21}'}
    second = client.responses.create(model=server.model, previous_response_id=first.id,
                                     input=[answer], tools=TOOLS, tool_choice="none",
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id and second.output[0].type == "message"
    # the first request, its call and the call's output went into the prompt
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # the same conversation sent whole (as a client without the store does) reads the same
    again = client.responses.create(
        model=server.model, input=[{"role": "user", "content": ASK}, call.model_dump(),
                                   answer], tools=TOOLS, tool_choice="none",
        max_output_tokens=8)
    assert again.usage.input_tokens == second.usage.input_tokens


def test_store_false_keeps_nothing(server):
    client = server.client()
    r = client.responses.create(model=server.model, input="Hi", store=False,
                                max_output_tokens=4)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=server.model, input="More", previous_response_id=r.id)
    assert info.value.body["param"] == "previous_response_id"
    assert info.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_a_stored_response_can_be_read_and_deleted(server):
    client = server.client()
    r = client.responses.create(model=server.model, input="Hi", max_output_tokens=4)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=server.model, input="More", previous_response_id=r.id)


def test_json_schema_format_gives_valid_json(server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "rain": {"type": "boolean"}},
              "required": ["city", "rain"], "additionalProperties": False}
    client = server.client()
    for seed in range(3):
        r = client.responses.create(
            model=server.model, input="The weather in Paris, as JSON.", extra_body={"seed": seed},
            temperature=1.0, max_output_tokens=60,
            text={"format": {"type": "json_schema", "name": "weather", "schema": schema,
                             "strict": True}})
        assert r.status == "completed" and r.text.format.type == "json_schema"
        jsonschema.validate(json.loads(r.output_text), schema)


def test_max_output_tokens_leaves_it_incomplete(server):
    r = server.client().responses.create(model=server.model, input="Tell me a long story.",
                                         max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 3


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools"),
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 5}, "top_logprobs"),
    ({"reasoning": {"effort": "low", "summary": "detailed"}}, "reasoning"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"extra_body": {"frequency_penalty": 0.5}}, "frequency_penalty"),  # unknown here
])
def test_what_is_not_supported_is_a_400_naming_it(server, extra, param):
    body = {"input": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as info:
        server.client().responses.create(model=server.model, **body)
    assert info.value.body["param"] == param
    assert "not supported" in info.value.body["message"]


def test_tools_with_a_json_format_answer_with_calls_or_json(server):
    """An agent's output type beside its tools: calls, or JSON of the format."""
    for seed in range(3):
        r = server.client().responses.create(
            model=server.model, input=ASK, tools=TOOLS, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "a", "schema": YES_NO}},
            max_output_tokens=200, extra_body={"seed": seed})
        calls = [i for i in r.output if i.type == "function_call"]
        if calls:
            assert all(set(json.loads(c.arguments)) <= set(SCHEMAS[c.name]["properties"])
                       for c in calls)
        elif r.status == "completed":
            assert set(json.loads(r.output_text)) == {"yes"}


def test_the_engine_paths_errors_name_this_apis_fields(server):
    """Checks shared with Chat Completions answer in this API's field names."""
    client = server.client()
    # More than the window holds is served as what fits (as llama-server serves it).
    r = client.responses.create(model=server.model, input="Hi", max_output_tokens=5000,
                                temperature=0)
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=server.model, input=ASK, tools=[ADD, ADD])
    assert info.value.body["param"] == "tools" and "tools[1].name" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=server.model, input="Hi", text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}})
    assert info.value.body["param"] == "text"
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="another-model", input="Hi")
    assert info.value.body["param"] == "model"


@pytest.fixture(scope="module")
def thinker(tiny_model_factory, tmp_path_factory):
    """A pair whose chat template opens a reasoning block (as QwQ's and DeepSeek-R1's do)."""
    target = tiny_model_factory(seed=0, chat_template=OPENS)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=OPENS)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 512,
                       "--draft-max", 3, "--max-tokens", 24], tmp_path_factory.mktemp("thinker"))
    yield s
    s.kill()


def test_the_reasoning_is_its_own_item(thinker):
    """A random model never closes its reasoning: all of it is reasoning, cut at the limit."""
    client = thinker.client()
    r = client.responses.create(model=thinker.model, input="Is it?", temperature=0)
    [reasoning] = r.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text
    assert r.status == "incomplete" and reasoning.status == "incomplete"
    assert r.output_text == ""
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens
    with client.responses.stream(model=thinker.model, input="Is it?", temperature=0) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == reasoning.content[0].text
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].content[0].text == reasoning.content[0].text


def test_thinking_off_answers_in_the_format(thinker):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = thinker.client().responses.create(
        model=thinker.model, input="Is it?", temperature=1, reasoning={"effort": "none"},
        max_output_tokens=40, extra_body={"seed": 1},
        text={"format": {"type": "json_schema", "name": "ok", "schema": schema}})
    [message] = r.output
    assert message.type == "message" and r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.reasoning.effort == "none" and r.usage.output_tokens_details.reasoning_tokens == 0


# ------------------------------------------------------------- the parts, one by one
def test_the_store_drops_the_least_recently_used():
    store = ResponsesStore(max_responses=2)
    entry = stored((MessageItem(role="user", content="hi"),), {"id": "x"})
    for rid in ("resp_a", "resp_b"):
        store.put(rid, entry)
    store.get("resp_a")  # used: now the newest
    store.put("resp_c", entry)
    assert len(store) == 2 and store.get("resp_a") and store.get("resp_c")
    with pytest.raises(APIError) as info:
        store.get("resp_b", "previous_response_id")
    assert info.value.status == 404 and info.value.param == "previous_response_id"


def test_the_store_holds_its_bytes_limit():
    one = stored((MessageItem(role="user", content="x" * 1000),), {"id": "x"})
    store = ResponsesStore(max_bytes=3 * one.size)
    for i in range(10):
        assert store.put(f"resp_{i}", one)
    assert len(store) == 3 and store.bytes <= 3 * one.size
    assert store.get("resp_9") and not store.put("resp_big", stored(
        (MessageItem(role="user", content="x" * 4000),), {"id": "x"}))
    assert ResponsesStore(max_responses=0).put("resp_0", one) is False


def test_reasoning_streams_as_its_own_item_the_client_reads():
    """Reasoning, then text: a reasoning item with reasoning_text deltas, then the
    message; the `openai` client's own stream state accepts the events whole."""
    store = ResponsesStore()
    dialect = ResponsesDialect(store)
    asked = dialect.parse(json.dumps({"model": "m", "input": "Why?"}).encode())
    work = Work("chat", [1, 2, 3], 16, SamplingParams(temperature=0.0), (),
                reasoning=Markers("<think>", "</think>"))
    reply = Reply(work, dialect.new_id(work), "m", lambda t: b"ab", 0)
    result = GenerationResult(tokens=[7] * 11, text="<think>hmm</think>Yes.",
                              finish_reason="eos", stats=Stats(), prompt_tokens=3)
    writer = dialect.writer(asked, reply)
    events = [*writer.start(),
              *writer.pieces([ReasoningDelta("hm"), ReasoningDelta("m"), TextDelta("Ye")]),
              *writer.end([TextDelta("s.")], Whole("hmm", "Yes.", (), "stop"), result, {})]
    bodies = [json.loads(e["data"]) for e in events]
    assert [e["event"] for e in events] == [b["type"] for b in bodies]
    assert [b["type"] for b in bodies][2:8] == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done"]
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for body in bodies:
        state.handle_event(_event(body))
    final = bodies[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"][0]["text"] == "hmm"
    # tokens of 2 bytes here: "<think>hmm</think>" is 9 of them
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 9
    assert store.get(final["id"]).conversation[-1].text() == "Yes."


def test_a_call_after_reasoning_is_its_own_item():
    dialect = ResponsesDialect(ResponsesStore())
    asked = dialect.parse(json.dumps({"model": "m", "input": ASK, "tools": TOOLS}).encode())
    work = Work("chat", [1], 16, SamplingParams(temperature=0.0), ())
    reply = Reply(work, "resp_1", "m", lambda t: b"x", 0)
    result = GenerationResult(tokens=[7], text="", finish_reason="eos", stats=Stats(),
                              prompt_tokens=1)
    call = Call("call_1", "add", '{"a": 1, "b": 2}')
    whole = Whole("so", None, (call,), "tool_calls")
    body = dialect.complete(asked, reply, whole, result, {})
    assert [o["type"] for o in body["output"]] == ["reasoning", "function_call"]
    writer = dialect.writer(asked, reply)
    events = [*writer.start(), *writer.pieces([ReasoningDelta("so"), Calls((call,))]),
              *writer.end([], whole, result, {})]
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for e in events:
        state.handle_event(_event(json.loads(e["data"])))
    final = json.loads(events[-1]["data"])["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "function_call"]
    assert final["output"][1]["arguments"] == call.arguments


def test_an_error_after_the_200_ends_the_stream_as_failed():
    dialect = ResponsesDialect(ResponsesStore())
    asked = dialect.parse(json.dumps({"model": "m", "input": "Hi"}).encode())
    work = Work("chat", [1], 16, SamplingParams(temperature=0.0), ())
    reply = Reply(work, "resp_1", "m", lambda t: b"x", 0)
    writer = dialect.writer(asked, reply)
    events = [*writer.start(), *writer.pieces([TextDelta("Hel")]),
              *writer.error(APIError(503, "the engine stopped", type="server_error",
                                     code="engine_unavailable"))]
    assert [e["event"] for e in events][-2:] == ["error", "response.failed"]
    failed = json.loads(events[-1]["data"])["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_unavailable"
    assert failed["output"][0]["content"][0]["text"] == "Hel"
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for e in events:
        state.handle_event(_event(json.loads(e["data"])))
    with pytest.raises(APIError):  # nothing was kept
        dialect.retrieve("resp_1")


def _event(body: dict) -> ResponseStreamEvent:
    """An event as the `openai` client reads it off the wire."""
    from openai._models import construct_type

    return construct_type(type_=ResponseStreamEvent, value=body)
