"""Reasoning through a real `specllama serve`, with the real clients of its three APIs, on
a tiny model that closes its reasoning: `write_tiny_model(think=...)` gives `<think>`
and `</think>` one user-defined token each (as Qwen3's are) and draws `</think>` often
enough that nearly every answer at temperature 1 closes its reasoning within a few dozen
tokens. So the path past the close is taken for real: the reasoning lands in its own
field (`reasoning_content`, a `reasoning` item, a `thinking` block), streamed or not;
the answer after it obeys a JSON schema; tool calls after it validate; and the requests'
switches (`reasoning_effort`, `reasoning.effort`, `thinking`) do what docs/serve.md says.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from servers import ServerProcess
from test_reasoning import OPENS
from tinymodels import THINK_TOKENS

from specllama.engine.llama import Vocabulary
from specllama.server.reasoning import Markers, with_tokens

# The close's pull (tinymodels._add_think). Measured with this pair at temperature 1,
# the template opening the reasoning, 40 seeds and 80 tokens: 1.3 closes for 37/40
# (median 20 tokens of reasoning), 1.4 for 40/40 (median 16), 1.6 for 40/40 (median 5:
# too short to say much), 2.0 at once. At 1.4 over 100 seeds and 160 tokens: all close,
# 85 within 40 tokens, 99 within 80, 2 with no reasoning at all. The pull holds after
# the close too: a free answer writes `</think>` again (99/100; text then, as the split
# takes the first) and seldom ends (3/100 end before 160 tokens), so free answers run
# to max_tokens here; a schema's or a call's grammar ends them.
THINK = 1.4
# A template that opens the reasoning in its generation prompt, and writes an empty
# reasoning block there instead when thinking is turned off (`enable_thinking`, as
# Qwen3's and Qwen3.5's do). OPENS (test_reasoning.py) opens it with no switch, as QwQ's
# and DeepSeek-R1's do.
SWITCH = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content.split('</think>')[-1].lstrip() }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
OPEN, CLOSE = THINK_TOKENS
ASK = "Is it raining in Paris?"
PROMPT = f"<|im_start|>user\n{ASK}<|im_end|>\n<|im_start|>assistant\n{OPEN}\n"  # SWITCH's
SCHEMA = {"type": "object", "properties": {
    "raining": {"type": "boolean"},
    "mm": {"type": "integer", "minimum": 0, "maximum": 99},
    "sky": {"enum": ["clear", "cloudy", "grey"]}},
    "required": ["raining", "mm", "sky"], "additionalProperties": False}
ADD = {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 999},
    "b": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
SCHEMAS = {"add": ADD, "get_weather": WEATHER}
CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}}
              for n, p in SCHEMAS.items()]
RESPONSES_TOOLS = [{"type": "function", "name": n, "parameters": p, "strict": True}
                   for n, p in SCHEMAS.items()]
MESSAGES_TOOLS = [{"name": n, "description": f"{n}.", "input_schema": p}
                  for n, p in SCHEMAS.items()]
SEEDS = range(5)


def pair(factory, template: str) -> tuple:
    target = factory(seed=0, chat_template=template, think=THINK)
    draft = factory(seed=0, chat_template=template, think=THINK, noise=0.05, noise_seed=1)
    return target, draft


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    target, draft = pair(tiny_model_factory, SWITCH)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 2048,
                       "--draft-max", 3, "--max-tokens", 160],
                      tmp_path_factory.mktemp("reasoning"))
    yield s
    s.kill()


@pytest.fixture(scope="module")
def chat(server):
    return server.client().chat.completions


@pytest.fixture(scope="module")
def responses(server):
    return server.client().responses


@pytest.fixture(scope="module")
def messages(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=60).messages


def raw(server, seed: int, prompt: str = PROMPT, max_tokens: int = 160) -> str:
    """The text the model writes after `prompt` at `seed`, unsplit: the legacy Completions
    API takes the rendered prompt as it is and never splits its answer."""
    r = server.client().completions.create(model=server.model, prompt=prompt, seed=seed,
                                           temperature=1, max_tokens=max_tokens)
    return r.choices[0].text


def told_apart(text: str) -> tuple[str, str]:
    """`text` (the template opened the reasoning) as the server should split it: the
    reasoning up to the first close, the answer after it, the whitespace around both
    stripped (the answer's end is the model's own)."""
    assert CLOSE in text, text
    reasoning, _, answer = text.partition(CLOSE)
    return reasoning.strip(), answer.lstrip()


def reasoning_of(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


# ------------------------------------------------------------------ the model


def test_the_markers_are_one_token_each_that_prints(tiny_model_factory):
    """As Qwen3's: one user-defined token each, parsed from the prompt's text, written out
    as text (not dropped as control tokens are), and named by id in the grammar."""
    v = Vocabulary(tiny_model_factory(seed=0, chat_template=SWITCH, think=THINK))
    plain = Vocabulary(tiny_model_factory(seed=0))
    try:
        ids = [v.n_vocab - 2, v.n_vocab - 1]
        assert [v.tokenize(t, add_bos=False) for t in THINK_TOKENS] == [[i] for i in ids]
        assert [v.piece(i).decode() for i in ids] == list(THINK_TOKENS)
        assert not any(v.is_control(i) for i in ids)
        assert with_tokens(Markers(OPEN, CLOSE), v) == Markers(
            OPEN, CLOSE, tokens=tuple(zip(THINK_TOKENS, ids)))
        assert v.n_vocab == plain.n_vocab + 2
        assert len(plain.tokenize(CLOSE, add_bos=False)) > 1  # the default has no such token
    finally:
        v.close()
        plain.close()


def test_the_tiny_thinker_closes_its_reasoning(server):
    """What the rest stands on: at temperature 1 nearly every seed closes the reasoning,
    as one token, after some reasoning, within a few dozen tokens."""
    client = server.client()
    at = []
    for seed in range(20):
        r = client.completions.create(model=server.model, prompt=PROMPT, seed=seed,
                                      temperature=1, max_tokens=160, logprobs=0)
        tokens = r.choices[0].logprobs.tokens
        if CLOSE in tokens:
            at.append(tokens.index(CLOSE))
    assert len(at) >= 18, at
    assert sorted(at)[len(at) // 2] <= 40 and sum(n > 0 for n in at) >= 15, at


# ------------------------------------------------------------------ its own field


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_chat_completions_send_the_reasoning_as_reasoning_content(server, chat, seed):
    reasoning, answer = told_apart(raw(server, seed))
    ask = {"model": server.model, "messages": [{"role": "user", "content": ASK}],
           "temperature": 1, "seed": seed}
    r = chat.create(**ask)
    message = r.choices[0].message
    assert reasoning_of(message) == reasoning and message.content == answer
    assert CLOSE not in reasoning and OPEN not in reasoning
    streamed, content = [], ""
    for chunk in chat.create(**ask, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            assert not (reasoning_of(delta) and delta.content)  # one kind per delta
            if reasoning_of(delta):
                assert not content, "reasoning after the answer began"
                streamed.append(reasoning_of(delta))
            content += delta.content or ""
    assert "".join(streamed) == reasoning and content == answer


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_responses_send_the_reasoning_as_a_reasoning_item(server, responses, seed):
    reasoning, answer = told_apart(raw(server, seed))
    ask = {"model": server.model, "input": ASK, "temperature": 1, "extra_body": {"seed": seed}}
    r = responses.create(**ask)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"], r.output
    item = r.output[0]
    assert item.id.startswith("rs_") and [c.type for c in item.content] == ["reasoning_text"]
    assert item.content[0].text == reasoning and r.output_text == answer
    details = r.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.output_tokens
    with responses.stream(**ask) as stream:
        events = list(stream)
    # the answer runs to max_output_tokens (the model seldom ends it): "incomplete"
    assert events[-1].type == f"response.{r.status}"
    final = events[-1].response
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    text = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == reasoning and "".join(text) == answer
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert final.output[0].content[0].text == reasoning and final.output_text == answer
    assert final.usage.output_tokens_details.reasoning_tokens == details.reasoning_tokens


def test_responses_count_the_reasoning_tokens(server, chat, responses):
    """Up to the close, included, whatever bytes the reasoning holds: this model writes
    byte tokens the text cannot decode (each one U+FFFD, three bytes, in the text)."""
    undecodable = 0
    for seed in range(10):
        r = chat.create(model=server.model, messages=[{"role": "user", "content": ASK}],
                        temperature=1, seed=seed, logprobs=True, max_tokens=80)
        tokens = [t.token for t in r.choices[0].logprobs.content]
        expected = tokens.index(CLOSE) + 1 if CLOSE in tokens else len(tokens)
        assert r.usage.completion_tokens_details.reasoning_tokens == expected, seed  # chat's too
        answer = responses.create(model=server.model, input=ASK, temperature=1,
                                  max_output_tokens=80, extra_body={"seed": seed})
        assert answer.usage.output_tokens == len(tokens)
        assert answer.usage.output_tokens_details.reasoning_tokens == expected, seed
        undecodable += "\ufffd" in (reasoning_of(r.choices[0].message) or "")
    assert undecodable >= 3  # the case that counted wrong once


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_messages_send_the_reasoning_as_a_thinking_block(server, messages, seed):
    reasoning, answer = told_apart(raw(server, seed))
    ask = {"model": server.model, "max_tokens": 160,
           "messages": [{"role": "user", "content": ASK}],
           "extra_body": {"seed": seed, "temperature": 1},
           "thinking": {"type": "enabled", "budget_tokens": 159}}  # (forced past it)
    r = messages.create(**ask)
    assert [b.type for b in r.content] == ["thinking", "text"], r.content
    assert r.content[0].thinking == reasoning and r.content[1].text == answer
    with messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    thought = [e.delta.thinking for e in events
               if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
    said = [e.delta.text for e in events
            if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert "".join(thought) == reasoning and "".join(said) == answer
    assert blocks(final.content) == blocks(r.content)


# ------------------------------------------------------------------ the answer's schema


def blocks(content) -> list[dict]:
    """Messages content blocks as what they say (a tool_use's id is new each time)."""
    return [b.model_dump(exclude={"id"}) for b in content]


def valid_json(text: str | None) -> dict:
    assert text is not None
    answer = json.loads(text)
    jsonschema.validate(answer, SCHEMA)
    return answer


def test_chat_completions_answer_in_the_schema_after_free_reasoning(server, chat):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "messages": [{"role": "user", "content": ASK}],
               "temperature": 1, "seed": seed, "response_format": fmt}
        r = chat.create(**ask)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", (seed, r)
        valid_json(message.content)
        thought += bool(reasoning_of(message))
        streamed, content = "", ""
        for chunk in chat.create(**ask, stream=True):
            if chunk.choices:
                streamed += reasoning_of(chunk.choices[0].delta) or ""
                content += chunk.choices[0].delta.content or ""
        assert (streamed or None, content) == (reasoning_of(message), message.content)
    # the schema would force '{' first: the reasoning before the answer is free text
    assert thought >= len(SEEDS) - 1


def test_responses_answer_in_the_text_format_after_free_reasoning(server, responses):
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA,
                      "strict": True}}
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "input": ASK, "temperature": 1, "text": fmt,
               "extra_body": {"seed": seed}}
        r = responses.create(**ask)
        assert r.status == "completed", (seed, r)
        assert [i.type for i in r.output][-1] == "message"
        valid_json(r.output_text)
        thought += r.output[0].type == "reasoning"
        with responses.stream(**ask) as stream:
            final = stream.get_final_response()
        assert said(final.output) == said(r.output)
    assert thought >= len(SEEDS) - 1


def said(output) -> list[tuple]:
    """A Responses output as what it says: each item's type and text, or call."""
    out: list[tuple] = []
    for item in output:
        if item.type == "function_call":
            out.append((item.type, item.name, item.arguments, item.status))
        else:
            out.append((item.type, item.status, [c.text for c in item.content]))
    return out


def test_messages_answer_in_the_output_format_after_free_reasoning(server, messages):
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "max_tokens": 160,
               "messages": [{"role": "user", "content": ASK}],
               "extra_body": {"seed": seed, "temperature": 1, "output_config": {
                   "format": {"type": "json_schema", "schema": SCHEMA}}}}
        r = messages.create(**ask)
        assert r.stop_reason == "end_turn", (seed, r)
        kinds = [b.type for b in r.content]
        assert kinds in (["thinking", "text"], ["text"]), r.content
        valid_json(r.content[-1].text)
        thought += kinds[0] == "thinking"
        with messages.stream(**ask) as stream:
            final = stream.get_final_message()
        assert blocks(final.content) == blocks(r.content)
    assert thought >= len(SEEDS) - 1


# ------------------------------------------------------------------ tool calls


def valid_call(name: str, arguments: str | dict) -> dict:
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(parsed, SCHEMAS[name])
    return parsed


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "add"}}],
                         ids=["required", "named"])
def test_chat_completions_call_after_reasoning(server, chat, choice):
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "messages": [{"role": "user", "content": ASK}],
               "temperature": 1, "seed": seed, "tools": CHAT_TOOLS, "tool_choice": choice,
               "parallel_tool_calls": False}
        r = chat.create(**ask)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", (seed, r)
        assert not message.content
        [call] = message.tool_calls
        valid_call(call.function.name, call.function.arguments)
        if isinstance(choice, dict):
            assert call.function.name == "add"
        reasoning = reasoning_of(message)
        thought += bool(reasoning)
        assert "<tool_call>" not in (reasoning or "")  # a call is never read as reasoning
        streamed, calls = "", []
        for chunk in chat.create(**ask, stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                streamed += reasoning_of(delta) or ""
                calls += delta.tool_calls or []
        assert streamed == (reasoning or "")
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [(call.function.name, call.function.arguments)]
    assert thought >= len(SEEDS) - 1


def test_chat_completions_auto_after_reasoning(server, chat):
    """Under `auto` the answer after the reasoning is text or calls: calls validate, and
    neither the reasoning nor a call's markup is left in the text."""
    kinds = set()
    for seed in range(8):
        r = chat.create(model=server.model, messages=[{"role": "user", "content": ASK}],
                        temperature=1, seed=seed, tools=CHAT_TOOLS, tool_choice="auto",
                        max_tokens=60)
        message = r.choices[0].message
        for call in message.tool_calls or []:
            valid_call(call.function.name, call.function.arguments)
        assert "<tool_call>" not in (message.content or "")
        if reasoning_of(message) and (message.tool_calls or message.content):
            kinds.add("calls" if message.tool_calls else "text")
    assert kinds, "no answer after the reasoning in 8 seeds"


def test_responses_call_after_reasoning_and_the_loop_goes_on(server, responses):
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "input": ASK, "temperature": 1, "tools": RESPONSES_TOOLS,
               "tool_choice": "required", "parallel_tool_calls": False,
               "extra_body": {"seed": seed}}
        r = responses.create(**ask)
        kinds = [i.type for i in r.output]
        assert kinds in (["reasoning", "function_call"], ["function_call"]), r.output
        call = r.output[-1]
        valid_call(call.name, call.arguments)
        thought += kinds[0] == "reasoning"
        with responses.stream(**ask) as stream:
            final = stream.get_final_response()
        assert said(final.output) == said(r.output)
    assert thought >= len(SEEDS) - 1
    # the call's answer goes back; the reasoning item sent back with it is accepted
    # (and left out of the prompt); the next answer reasons again, then answers
    after = responses.create(
        model=server.model, temperature=1, extra_body={"seed": 1}, store=False,
        input=[{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True)
                                                   for i in r.output],
               {"type": "function_call_output", "call_id": call.call_id,
                "output": '{"sum": 3}'}],
        text={"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA}})
    assert after.status == "completed"
    valid_json(after.output_text)


def test_messages_tool_use_after_reasoning_and_the_result_goes_back(server, messages):
    thought = 0
    for seed in SEEDS:
        ask = {"model": server.model, "max_tokens": 160,
               "messages": [{"role": "user", "content": ASK}], "tools": MESSAGES_TOOLS,
               "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
               "extra_body": {"seed": seed, "temperature": 1}}
        r = messages.create(**ask)
        assert r.stop_reason == "tool_use", (seed, r)
        kinds = [b.type for b in r.content]
        assert kinds in (["thinking", "tool_use"], ["tool_use"]), r.content
        use = r.content[-1]
        valid_call(use.name, use.input)
        thought += kinds[0] == "thinking"
        with messages.stream(**ask) as stream:
            final = stream.get_final_message()
        assert blocks(final.content) == blocks(r.content)
    assert thought >= len(SEEDS) - 1
    # the whole answer goes back, its thinking block included, with the tool's result
    after = messages.create(
        model=server.model, max_tokens=160, extra_body={"seed": 1, "temperature": 1},
        tools=MESSAGES_TOOLS, tool_choice={"type": "none"}, messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                              for b in r.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "3"}]}])
    assert [b.type for b in after.content] == ["thinking", "text"], after.content


# ------------------------------------------------------------------ the switches


def test_reasoning_effort_none_turns_thinking_off(server, chat):
    """The template can (its `enable_thinking`): it closes an empty reasoning block in the
    prompt, and the answer is not split (a `</think>` the model still writes is text)."""
    closes = 0
    for seed in (0, 1, 2):
        r = chat.create(model=server.model, messages=[{"role": "user", "content": ASK}],
                        temperature=1, seed=seed, reasoning_effort="none", max_tokens=40)
        message = r.choices[0].message
        assert reasoning_of(message) is None and message.content
        prompt = PROMPT + f"\n{CLOSE}\n\n"
        assert message.content == raw(server, seed, prompt, 40)
        closes += CLOSE in message.content
    assert closes  # this model writes `</think>` on: the answer holds it, unsplit
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    for seed in SEEDS:
        r = chat.create(model=server.model, messages=[{"role": "user", "content": ASK}],
                        temperature=1, seed=seed, reasoning_effort="none", response_format=fmt)
        assert reasoning_of(r.choices[0].message) is None
        valid_json(r.choices[0].message.content)
    on = chat.create(model=server.model, messages=[{"role": "user", "content": ASK}],
                     temperature=1, seed=0, reasoning_effort="high")
    assert reasoning_of(on.choices[0].message)


def test_responses_reasoning_effort(server, responses):
    ask = {"model": server.model, "input": ASK, "temperature": 1, "extra_body": {"seed": 0},
           "max_output_tokens": 40}
    off = responses.create(**ask, reasoning={"effort": "none"})
    assert [i.type for i in off.output] == ["message"] and off.output_text
    assert off.reasoning.effort == "none"
    assert off.usage.output_tokens_details.reasoning_tokens == 0
    for effort in ("low", "high"):
        on = responses.create(**ask, reasoning={"effort": effort})
        assert on.output[0].type == "reasoning" and on.reasoning.effort == effort
        assert on.usage.output_tokens_details.reasoning_tokens > 0


def test_messages_thinking_disabled_and_enabled(server, messages):
    ask = {"model": server.model, "max_tokens": 40,
           "messages": [{"role": "user", "content": ASK}],
           "extra_body": {"seed": 0, "temperature": 1}}
    off = messages.create(**ask, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    for thinking in ({"type": "enabled", "budget_tokens": 16}, {"type": "adaptive"}, None):
        on = messages.create(**ask, **({"thinking": thinking} if thinking else {}))
        assert on.content[0].type == "thinking" and on.content[0].thinking, thinking
    hidden = messages.create(**ask, thinking={"type": "adaptive", "display": "omitted"})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""
    assert hidden.content[1:] == on.content[1:]  # the same answer, its reasoning unsaid


def test_a_reasoning_budget_forces_the_close(server, chat, messages, tiny_model_factory):
    """Past its budget the reasoning's close is forced (engine/loop/budget.py): Anthropic's
    thinking.budget_tokens, and reasoning_budget in Chat Completions; 0 closes at once.
    Unbudgeted, this model reasons for about 16 tokens (THINK)."""
    v = Vocabulary(tiny_model_factory(seed=0, chat_template=SWITCH, think=THINK))
    try:
        def tokens(text: str) -> int:
            return len(v.tokenize(text, add_bos=False))

        free, budgeted = [], []
        for seed in range(4):
            ask = {"model": server.model, "messages": [{"role": "user", "content": ASK}],
                   "seed": seed, "temperature": 1, "max_tokens": 60}
            free.append(tokens(reasoning_of(chat.create(**ask).choices[0].message) or ""))
            got = chat.create(**ask, extra_body={"reasoning_budget": 3}).choices[0].message
            budgeted.append(tokens(reasoning_of(got) or ""))
            said = messages.create(model=server.model, max_tokens=60, messages=ask["messages"],
                                   thinking={"type": "enabled", "budget_tokens": 3},
                                   extra_body={"seed": seed, "temperature": 1})
            assert said.content[0].type == "thinking" and tokens(said.content[0].thinking) <= 3
            none = chat.create(**ask, extra_body={"reasoning_budget": 0}).choices[0].message
            assert not reasoning_of(none), none
        assert max(budgeted) <= 3 < max(free), (budgeted, free)
    finally:
        v.close()


@pytest.fixture(scope="module")
def no_switch(tiny_model_factory, tmp_path_factory):
    """The template opens the reasoning and has no switch (QwQ's, DeepSeek-R1's)."""
    target, draft = pair(tiny_model_factory, OPENS)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 2048,
                       "--draft-max", 3, "--max-tokens", 40], tmp_path_factory.mktemp("opens"))
    yield s
    s.kill()


def test_thinking_off_without_a_switch_closes_an_empty_block(no_switch):
    """The prompt gets an empty reasoning block after the template's opening, as
    llama-server writes it, and the answer is not split; on, the reasoning is split."""
    client = no_switch.client()
    opened = f"<|im_start|>user\n{ASK}<|im_end|>\n<|im_start|>assistant\n{OPEN}\n"
    split = 0
    for seed in (0, 1, 2):
        off = client.chat.completions.create(
            model=no_switch.model, messages=[{"role": "user", "content": ASK}], temperature=1,
            seed=seed, reasoning_effort="none")
        assert reasoning_of(off.choices[0].message) is None
        assert off.choices[0].message.content == raw(no_switch, seed, f"{opened}\n{CLOSE}\n\n",
                                                     40)
        on = client.chat.completions.create(
            model=no_switch.model, messages=[{"role": "user", "content": ASK}], temperature=1,
            seed=seed)
        text = raw(no_switch, seed, opened, 40)
        if CLOSE in text:
            reasoning, answer = told_apart(text)
            assert reasoning_of(on.choices[0].message) == (reasoning or None)
            assert on.choices[0].message.content == answer
            split += 1
        else:  # not closed within max_tokens: all of it is reasoning
            assert reasoning_of(on.choices[0].message) == text.strip()
    assert split
