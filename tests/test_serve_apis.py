"""The three chat APIs are translations onto one engine path: the same conversation asked
through Chat Completions, Responses and Messages is the same greedy answer with the same
tool-call grammar; they run side by side under --parallel, count in /metrics, and share
the prompt cache."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess

SYSTEM = "Answer briefly."
QUESTION = "Tell me about the rivers and the hills of France."
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 40,
                       "--parallel", 2], tmp_path_factory.mktemp("apis"))
    yield s
    s.kill()


def chat(server, **more) -> tuple[str, dict]:
    r = server.client().chat.completions.create(
        model=server.model, temperature=0, max_tokens=24,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": QUESTION}], **more)
    return r.choices[0].message.content, r.model_extra["speculative"]


def responses(server, **more) -> tuple[str, dict]:
    r = server.client().responses.create(model=server.model, temperature=0,
                                         max_output_tokens=24, instructions=SYSTEM,
                                         input=QUESTION, **more)
    return r.output_text, r.model_extra["speculative"]


def messages(server, **more) -> tuple[str, dict]:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    r = client.messages.create(model=server.model, max_tokens=24, system=SYSTEM,
                               messages=[{"role": "user", "content": QUESTION}],
                               extra_body={"temperature": 0}, **more)
    return "".join(b.text for b in r.content if b.type == "text"), r.model_extra["speculative"]


def test_one_conversation_is_one_greedy_answer_through_each_api(server):
    answers = [ask(server) for ask in (chat, responses, messages)]
    texts = {text for text, _ in answers}
    assert len(texts) == 1 and texts != {""}, answers
    for _, figures in answers:
        assert figures["drafted"] > 0 and figures["target_steps"] > 0


def test_a_tool_call_is_the_same_call_through_each_api(server):
    """One tools grammar: the forced call opening is drafted free in each, and the
    greedy call is the same call, arguments and all."""
    ask = "What is the weather in Paris?"
    r = server.client().chat.completions.create(
        model=server.model, temperature=0, max_tokens=200, tool_choice="required",
        parallel_tool_calls=False, messages=[{"role": "user", "content": ask}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}])
    [c] = r.choices[0].message.tool_calls
    via_chat = (c.function.name, json.loads(c.function.arguments))
    r2 = server.client().responses.create(
        model=server.model, temperature=0, max_output_tokens=200, tool_choice="required",
        parallel_tool_calls=False, input=ask,
        tools=[{"type": "function", "name": "weather", "parameters": WEATHER}])
    [f] = [item for item in r2.output if item.type == "function_call"]
    via_responses = (f.name, json.loads(f.arguments))
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    r3 = client.messages.create(
        model=server.model, max_tokens=200, messages=[{"role": "user", "content": ask}],
        tools=[{"name": "weather", "input_schema": WEATHER}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0})
    [u] = [b for b in r3.content if b.type == "tool_use"]
    via_messages = (u.name, u.input)
    assert via_chat == via_responses == via_messages
    jsonschema.validate(via_chat[1], WEATHER)
    for figures in (r.model_extra, r2.model_extra, r3.model_extra):
        assert figures["speculative"]["forced"] > 0


def test_the_apis_run_side_by_side_and_count_in_the_metrics(server):
    def total() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == "specllama_requests":
                return sum(s.value for s in family.samples
                           if s.name == "specllama_requests_total"
                           and s.labels.get("status") == "completed")
        raise AssertionError("no specllama_requests_total")

    before = total()
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda ask: ask(server), (chat, responses, messages)))
    assert len({text for text, _ in answers}) == 1  # each as it would be alone
    server.wait_idle()
    assert total() == before + 3


def test_a_conversation_continued_in_another_api_reuses_the_prompt_cache(server):
    chat(server)
    _, figures = messages(server)
    assert figures["prompt_tokens_reused"] > 0
