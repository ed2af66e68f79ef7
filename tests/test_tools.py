"""Tool calls through a real `specllama serve` on 127.0.0.1, with the official `openai`
client and LangChain: every call parses and validates against its tool's schema."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from servers import ServerProcess

from specllama.server.apierror import APIError
from specllama.server.schema import ChatRequest, Message
from specllama.server.tools import OPEN, generic_messages, parse_calls, tool_use

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 999},
        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}
TOOLS = [WEATHER, ADD, NOW]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
           for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def valid(call) -> dict:
    """A call of the API's shape whose arguments follow its tool's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 120],
                      tmp_path_factory.mktemp("tools"))
    yield s
    s.kill()


def test_required_gives_valid_calls_every_time(server):
    client = server.client()
    for seed in range(12):
        r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", seed=seed, temperature=1.0,
                                           parallel_tool_calls=False)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        valid(choice.message.tool_calls[0])
        # the call's opening and the name's quotes are forced: drafted free
        assert r.model_extra["speculative"]["forced"] > 0


def test_parallel_calls_are_each_valid(server):
    """A random model seldom ends its list of calls: cut at max_tokens, the answer keeps
    the calls it finished (finish_reason "length", as OpenAI says of a cut answer)."""
    client = server.client()
    for seed in range(4):
        r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", seed=seed, temperature=1.0)
        choice = r.choices[0]
        assert choice.finish_reason in ("tool_calls", "length")
        assert choice.message.tool_calls and choice.message.content is None
        for call in choice.message.tool_calls:
            valid(call)


def test_a_named_function_is_the_one_called(server):
    client = server.client()
    for seed in range(4):
        r = client.chat.completions.create(
            model=server.model, messages=ASK, tools=TOOLS, seed=seed, temperature=1.0,
            tool_choice={"type": "function", "function": {"name": "add"}})
        [call] = r.choices[0].message.tool_calls
        assert call.function.name == "add"
        assert set(valid(call)) == {"a", "b"}


def test_auto_answers_text_or_a_valid_call(server):
    client = server.client()
    kinds = set()
    for seed in range(16):
        r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           seed=seed, temperature=1.5, max_tokens=60)
        choice = r.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason in ("tool_calls", "length")
            for call in choice.message.tool_calls:
                valid(call)
            kinds.add("call")
        else:
            assert not choice.message.content.startswith("<"), choice.message.content
            kinds.add("text")
    assert kinds  # which ones a random model picks is its business


def test_none_answers_text(server):
    r = server.client().chat.completions.create(model=server.model, messages=ASK,
                                                tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_call_arrives_as_tool_call_deltas(server):
    stream = server.client().chat.completions.create(
        model=server.model, messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
        seed=3, parallel_tool_calls=False)
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in stream:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += d.id or ""
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    assert finish == "tool_calls" and content == "" and calls
    for c in calls.values():
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_the_tools_answer_goes_back_in(server):
    client = server.client()
    first = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                           tool_choice="required", seed=1,
                                           parallel_tool_calls=False)
    message = first.choices[0].message
    answers = [{"role": "tool", "tool_call_id": c.id, "content": '{"sky": "clear"}'}
               for c in message.tool_calls]
    second = client.chat.completions.create(
        model=server.model, tools=TOOLS, tool_choice="none", max_tokens=8,
        messages=[*ASK, message.model_dump(exclude_none=True), *answers])
    assert second.choices[0].message.content is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_bad_tools_are_400s_naming_the_field(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    assert info.value.body["param"] == "tool_choice"
    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, messages=ASK, tools=[broken])
    assert info.value.body["param"] == "tools"


def test_langchain_runs_a_tool_calling_loop(server):
    """LangChain's OpenAI chat model with tools bound: it calls, the tool runs, its answer
    goes back, and the model answers in text."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Numbers(BaseModel):  # bounded: a random model would write digits forever
        a: int = Field(ge=0, le=999)
        b: int = Field(ge=0, le=999)

    @tool(args_schema=Numbers)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model=server.model,
                     temperature=0.7, max_tokens=200, max_retries=0, seed=2)
    messages = [HumanMessage("What is 2 plus 3?")]
    reply = llm.bind_tools([add], tool_choice="required",
                           parallel_tool_calls=False).invoke(messages)
    assert reply.tool_calls and all(c["name"] == "add" for c in reply.tool_calls)
    messages.append(reply)
    for call in reply.tool_calls:
        result = add.invoke(call["args"])
        assert result == call["args"]["a"] + call["args"]["b"]
        messages.append(ToolMessage(str(result), tool_call_id=call["id"]))
    final = llm.bind_tools([add], tool_choice="none").invoke(messages)
    assert isinstance(final.content, str) and not final.tool_calls


# ---------------------------------------------------------------- the parts, no server


def request(**over) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": ASK, "tools": TOOLS, **over})


def test_the_answer_side_reads_calls_and_only_calls():
    text = (f'{OPEN}{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}\n</tool_call>\n'
            f'{OPEN}{{"name": "now", "arguments": {{}}}}\n</tool_call>')
    calls = parse_calls(text)
    assert [c["function"]["name"] for c in calls] == ["add", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert parse_calls("The weather is fine.") is None
    assert parse_calls(f'{OPEN}{{"name": "add", "arguments": {{"a"') is None  # cut short
    cut = parse_calls(text[:-8], cut=True)  # at max_tokens: the finished calls
    assert [c["function"]["name"] for c in cut] == ["add"]
    for tail in ("\n<tool_", "\n<", "\n"):  # cut inside the next opening tag
        cut = parse_calls(text + tail, cut=True)
        assert [c["function"]["name"] for c in cut] == ["add", "now"], tail
    assert parse_calls(text + "\n<tool_", cut=False) is None
    assert parse_calls(text + " and more") is None
    tricky = f'{OPEN}{{"name": "f", "arguments": {{"x": "a</tool_call>b"}}}}\n</tool_call>'
    assert json.loads(parse_calls(tricky)[0]["function"]["arguments"]) == {"x": "a</tool_call>b"}


def test_the_choice_decides_the_grammar():
    use, spec = tool_use(request(tool_choice="required"))
    assert use.choice == "required" and use.parallel and "TEXT" not in spec.text
    use, spec = tool_use(request())
    assert use.choice == "auto" and "start: calls | TEXT" in spec.text
    use, spec = tool_use(request(tool_choice={"type": "function", "function": {"name": "add"}},
                                 parallel_tool_calls=True))
    assert use.choice == "named" and not use.parallel and '"get_weather"' not in spec.text
    assert tool_use(request(tool_choice="none")) == (None, None)
    assert tool_use(request(tools=None)) == (None, None)
    with pytest.raises(APIError):
        tool_use(request(tools=None, tool_choice="required"))
    use, _ = tool_use(request(tool_choice="required", parallel_tool_calls=False))
    assert not use.parallel


def test_a_template_without_tools_gets_them_in_a_system_message():
    messages = [Message(role="system", content="Be brief."), *[Message(**m) for m in ASK],
                Message.model_validate({"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "now", "arguments": "{}"}}]}),
                Message(role="tool", tool_call_id="call_1", content="noon")]
    turns = generic_messages(messages, request().tools)
    assert turns[0]["role"] == "system" and turns[0]["content"].startswith("Be brief.\n\n")
    assert '"name": "get_weather"' in turns[0]["content"] and OPEN in turns[0]["content"]
    assert turns[2] == {"role": "assistant",
                        "content": f'{OPEN}{{"name": "now", "arguments": {{}}}}\n</tool_call>'}
    assert turns[3] == {"role": "user", "content": "<tool_response>\nnoon\n</tool_response>"}


# A ChatML template with a tools section, as Qwen2.5's writes it (shortened).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_with_tools_renders_them_itself(tiny_model_factory):
    from specllama.engine.llama import Vocabulary
    from specllama.server.prompts import chat_tokens

    vocab = Vocabulary(tiny_model_factory(seed=0, chat_template=TOOLS_TEMPLATE))
    try:
        req = ChatRequest.model_validate({"model": "m", "tools": TOOLS, "messages": [
            *ASK, {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "3"}]})
        tokens, stop, _ = chat_tokens(vocab, req)
        text = vocab.detokenize(tokens)
        assert stop == () and "# Tools\n<tools>" in text and '"name": "get_weather"' in text
        assert '{"name": "add", "arguments": {"a": 1, "b": 2}}' in text  # arguments as JSON
        assert "You can call these functions" not in text  # not the generic format too
    finally:
        vocab.close()


@pytest.mark.slow
def test_smollm2_calls_validly_every_time(smollm2_path, tmp_path):
    """The real 135M model, as a user runs the default pair: `required` gives valid calls
    every time, greedy and sampled at T = 0.8 with 10 seeds. One call per answer ends
    with the call; a list of calls may run on until max_tokens (the 135M model repeats
    itself), and keeps the calls it finished."""
    server = ServerProcess(["--threads", 2, "--n-ctx", 2048], tmp_path)
    try:
        client = server.client(timeout=300)
        for seed in [None, *range(10)]:
            for parallel in (False, True):
                r = client.chat.completions.create(
                    model=server.model, messages=ASK, tools=TOOLS, tool_choice="required",
                    max_tokens=200, seed=seed, temperature=0 if seed is None else 0.8,
                    parallel_tool_calls=parallel)
                choice = r.choices[0]
                assert choice.finish_reason == "tool_calls" or parallel, (seed, choice)
                assert choice.message.tool_calls and (parallel or len(
                    choice.message.tool_calls) == 1), (seed, parallel, choice)
                for call in choice.message.tool_calls:
                    valid(call)
                assert r.model_extra["speculative"]["forced"] > 0
    finally:
        server.kill()


def test_calls_in_parallel_end_where_one_repeats(tiny_target):
    """The stop rule rides on the request's stops when several calls may come; one call
    (parallel_tool_calls false, a named function) needs none: the grammar ends it."""
    from specllama import Repeat, SamplingParams
    from specllama.engine.llama import Vocabulary
    from specllama.server.prompts import Defaults, build_work

    vocab = Vocabulary(str(tiny_target))
    defaults = Defaults(SamplingParams(), 16)

    def stops(**more):
        req = ChatRequest(model="m", messages=ASK, tools=TOOLS, **more)
        return [s for s in build_work(vocab, 4096, defaults, req).stop if isinstance(s, Repeat)]

    assert stops(tool_choice="required") == [Repeat(OPEN, "\n</tool_call>")]
    assert stops(tool_choice="auto", stop=["x"]) == [Repeat(OPEN, "\n</tool_call>")]
    assert stops(tool_choice="required", parallel_tool_calls=False) == []
    assert stops(tool_choice={"type": "function", "function": {"name": "add"}}) == []
    assert stops(tool_choice="none") == []


@pytest.mark.slow
def test_the_default_pair_makes_each_call_once(smollm2_path, tmp_path):
    """Greedy, SmolLM2 asked for the weather in parallel wrote the same two calls over
    and over until max_tokens; the answer now ends where a call repeats."""
    s = ServerProcess(["--pair", "smollm2", "--threads", 1, "--max-tokens", 200], tmp_path)
    try:
        r = s.client().chat.completions.create(
            model=s.model, messages=ASK, tools=TOOLS, tool_choice="required",
            temperature=0)
        choice = r.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert len(calls) == len(set(calls)) >= 1, calls
        assert choice.finish_reason == "tool_calls" and r.usage.completion_tokens < 200
        for call in choice.message.tool_calls:
            valid(call)
    finally:
        s.kill()


def test_a_call_cut_by_max_tokens_leaves_no_markup_in_the_text(server):
    """Cut inside its first call, the answer has no call and no text: the call's opening
    is not the answer's text (an agent would take it for its final output)."""
    client = server.client()
    kw = dict(model=server.model, messages=ASK, tools=TOOLS, tool_choice="required",
              max_tokens=12, temperature=0)
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert not choice.message.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
