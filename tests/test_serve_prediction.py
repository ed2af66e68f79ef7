"""OpenAI's Predicted Outputs through a real `specllama serve` on the tiny pair, with the
official `openai` client: the answer is the target's own whatever the prediction (greedy:
the answer without one), and the usage counts the prediction's tokens as OpenAI does."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from servers import ServerProcess

PROMPT = "Write the cat sat on the mat, then the dog sat on the log."
RECORD = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                   "required": ["word"]}}}]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 1024, "--draft-max", 3, "--max-tokens", 40],
                      tmp_path_factory.mktemp("prediction"))
    yield s
    s.kill()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


def chat(client, server, prediction=None, **kw):
    if prediction is not None:
        kw["prediction"] = {"type": "content", "content": prediction}
    return client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], temperature=0,
        **kw)


def counts(usage) -> tuple[int, int]:
    details = usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


def edit(text: str) -> str:
    """The text with a few characters in the middle rewritten: an edit to rejoin after."""
    middle = len(text) // 2
    return text[:middle] + "XYZ" + text[middle + 3 :]


@pytest.fixture(scope="module")
def greedy(client, server):
    """The greedy answer without a prediction."""
    return chat(client, server)


def test_without_a_prediction_the_details_are_zeros(greedy):
    details = greedy.usage.completion_tokens_details
    assert (details.reasoning_tokens, details.audio_tokens) == (0, 0)
    assert counts(greedy.usage) == (0, 0)


def test_a_prediction_equal_to_the_answer_is_accepted_whole(client, server, greedy):
    answer = greedy.choices[0].message.content
    r = chat(client, server, answer)
    assert r.choices[0].message.content == answer
    accepted, rejected = counts(r.usage)
    assert rejected == 0 and accepted >= greedy.usage.completion_tokens // 2, r.usage
    # content given as text parts, as OpenAI allows: the same
    parts = [{"type": "text", "text": answer[:5]}, {"type": "text", "text": answer[5:]}]
    r = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], temperature=0,
        prediction={"type": "content", "content": parts})
    assert r.choices[0].message.content == answer and counts(r.usage) == (accepted, 0)


def test_an_edited_or_wrong_prediction_leaves_the_answer_as_it_was(client, server, greedy):
    answer = greedy.choices[0].message.content
    edited = chat(client, server, edit(answer))
    assert edited.choices[0].message.content == answer
    accepted, rejected = counts(edited.usage)
    assert accepted > 0 and rejected > 0
    wrong = chat(client, server, "0123456789 " * 8)
    assert wrong.choices[0].message.content == answer and counts(wrong.usage)[0] == 0


def test_streamed_with_usage(client, server, greedy):
    answer = greedy.choices[0].message.content
    chunks = list(chat(client, server, answer, stream=True,
                       stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer
    assert chunks[-1].choices == [] and counts(chunks[-1].usage)[1] == 0
    assert counts(chunks[-1].usage)[0] > 0


def test_legacy_completions_take_it_as_an_extra_field(client, server):
    """The client's completions.create has no `prediction` argument: extra_body sends it."""
    prompt = "the cat sat on the"
    plain = client.completions.create(model=server.model, prompt=prompt, temperature=0,
                                      max_tokens=30)
    r = client.completions.create(
        model=server.model, prompt=prompt, temperature=0, max_tokens=30,
        extra_body={"prediction": {"type": "content", "content": plain.choices[0].text}})
    assert r.choices[0].text == plain.choices[0].text
    assert counts(r.usage)[0] > 0 and counts(r.usage)[1] == 0


def test_beside_a_json_schema_it_stays_exact_and_valid(client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD}}
    plain = chat(client, server, response_format=fmt).choices[0].message.content
    jsonschema.validate(json.loads(plain), RECORD)
    for prediction in (plain, edit(plain), '{"n": 7, "ok": true}'):
        r = chat(client, server, prediction, response_format=fmt)
        assert r.choices[0].message.content == plain, prediction
    assert counts(chat(client, server, plain, response_format=fmt).usage)[0] > 0


def test_beside_tools_the_answer_is_the_same(client, server):
    plain = chat(client, server, tools=TOOLS)
    message = plain.choices[0].message
    prediction = message.content or json.dumps(
        {"name": message.tool_calls[0].function.name,
         "arguments": json.loads(message.tool_calls[0].function.arguments)})
    r = chat(client, server, prediction, tools=TOOLS)
    assert r.choices[0].message.content == message.content
    assert [c.function.arguments for c in r.choices[0].message.tool_calls or []] == \
        [c.function.arguments for c in message.tool_calls or []]


def test_round_events_name_the_predictions_drafts(server, greedy):
    answer = greedy.choices[0].message.content
    with httpx.stream("POST", server.url + "/v1/rounds", timeout=60, json={
            "model": server.model, "temperature": 0, "drafters": "none",
            "messages": [{"role": "user", "content": PROMPT}],
            "prediction": {"type": "content", "content": answer}}) as r:
        assert r.status_code == 200, r.read()
        lines = list(r.iter_lines())
    names = [line[6:].strip() for line in lines if line.startswith("event:")]
    data = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    proposed = [d for name, d in zip(names, data) if name == "proposed"]
    assert proposed and all(set(d["origins"]) == {"prediction"} for d in proposed)
    assert data[-1]["text"] == answer


@pytest.mark.parametrize("prediction", [{"type": "text", "content": "x"}, {"content": "x"}])
def test_another_type_is_a_400_naming_it(server, prediction):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "model": server.model, "messages": [{"role": "user", "content": "hi"}],
        "prediction": prediction})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prediction.type" and "\n" not in error["message"]
    assert "prediction.type must be \"content\"" in error["message"]
