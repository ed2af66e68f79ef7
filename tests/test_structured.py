"""Structured output as users ask for it: --json-schema, --grammar and --regex on the
command line, response_format and logprobs through the OpenAI API of a real server, and
every output of seeded runs of the real SmolLM2 pair validated against its schema.
(The exactness of constrained speculation is tests/test_constraint.py's.)"""

from __future__ import annotations

import json
import math
import re
import subprocess

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from noise import file_split_noise, tolerance
from test_cli import assert_one_line_error
from test_serve import ServerProcess, ask, chat_body

from specllama.engine.llama import Model
from specllama.engine.sampling import log_softmax

PROMPT = "the cat sat 3141 and 3141 and 314"
RECORD = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def generate_json(run, tiny, *flags):
    result = run("generate", PROMPT, *tiny, "--raw", "--json", *flags)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------------- the CLI


def test_regex_on_the_command_line(run, tiny):
    data = generate_json(run, tiny, "--regex", "[0-4]{4,8}", "--temperature", 0,
                         "--max-tokens", 12, "--draft-max", 3)
    assert data["finish_reason"] == "eos"
    assert re.fullmatch("[0-4]{4,8}", data["text"]), data["text"]
    assert data["settings"]["regex"] == "[0-4]{4,8}"
    assert data["stats"]["mask_s"] > 0


def test_json_schema_inline_or_from_a_file_gives_the_same_json(run, tiny, tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps(RECORD))
    flags = ["--temperature", 0, "--max-tokens", 60, "--draft-max", 3]
    inline = generate_json(run, tiny, "--json-schema", json.dumps(RECORD), *flags)
    from_file = generate_json(run, tiny, "--json-schema", path, *flags)
    assert inline["tokens"] == from_file["tokens"]
    assert inline["finish_reason"] == "eos", inline["text"]
    jsonschema.validate(json.loads(inline["text"]), RECORD)
    # the keys, quotes and separators the schema fixes were drafted free
    assert inline["stats"]["forced"] >= 10


def test_gbnf_grammar_file(run, tiny, tmp_path):
    grammar = tmp_path / "animals.gbnf"
    grammar.write_text('root ::= "cat" (" " animal){2,4}\nanimal ::= "cat" | "dog"\n')
    for seed in range(3):
        data = generate_json(run, tiny, "--grammar", grammar, "--temperature", 1,
                             "--seed", seed, "--max-tokens", 30, "--draft-max", 2)
        assert data["finish_reason"] == "eos"
        assert re.fullmatch("cat( (cat|dog)){2,4}", data["text"]), data["text"]


def test_forced_tokens_are_in_the_stats(run, tiny):
    result = run("generate", PROMPT, *tiny, "--raw", "--regex", "hello world [0-4]{3}",
                 "--temperature", 0, "--max-tokens", 10, "--draft-max", 2)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("hello world ")
    line = next(x for x in result.stderr.splitlines() if x.startswith("constraint"))
    assert re.search(r"(\d+)/\1 forced tokens accepted \(drafted free\)", line), line


@pytest.mark.parametrize("flags, fragments", [
    (["--json-schema", "{not json"], ["the JSON schema is not valid JSON"]),
    (["--json-schema", "[1, 2]"], ["a JSON schema must be a JSON object"]),
    (["--json-schema", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'],
     ["the JSON schema is not valid"]),
    (["--json-schema", '{"not": {"type": "string"}}'], ["Unimplemented keys", "not"]),
    (["--regex", "(?=a)b"], ["the regex is not valid", "look-around"]),
    (["--json-schema", "/no/such/schema.json"], ["cannot read the JSON schema file"]),
    (["--grammar", "/no/such/grammar.gbnf"], ["cannot read the grammar file"]),
    (["--regex", "(unclosed"], ["the regex is not valid"]),
    (["--regex", "a", "--grammar", "g.gbnf"], ["give one constraint at most", "--grammar",
                                               "--regex"]),
    (["--regex", ""], ["--regex", "non-empty"]),
])
def test_bad_constraints_are_one_line_errors(run, tiny, flags, fragments):
    assert_one_line_error(run("generate", PROMPT, *tiny, "--raw", *flags), *fragments)


def test_a_constraint_the_context_cannot_hold_is_an_error(run, tiny):
    """The regex needs more tokens than the window has room for: one line, exit 2, and
    no half-written output on stdout."""
    result = run("generate", PROMPT, *tiny, "--raw", "--regex", "(cat ){400}",
                 "--temperature", 0, "--max-tokens", 1000)
    assert_one_line_error(result, "context window", "regex")


def test_set_a_constraint_in_chat(tiny_target, tiny_draft, tmp_path):
    from test_chat import SPECLLAMA, chat_env

    args = [SPECLLAMA, "chat", "--target", tiny_target, "--draft", tiny_draft, "--threads", "1",
            "--temperature", "0", "--max-tokens", "12", "--draft-max", "3"]
    script = "/set regex [0-4]{4,8}\nhi\n/set regex (\nthe cat\n/set regex off\nhi\n"
    r = subprocess.run([str(a) for a in args], input=script, capture_output=True, text=True,
                       env=chat_env(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    replies = r.stdout.strip().splitlines()
    assert re.fullmatch("[0-4]{4,8}", replies[0]), replies
    assert "error: the regex is not valid" in r.stderr  # that turn withdrawn, nothing else
    assert "session: 2 replies" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 512, "--draft-max", 3, "--temperature", 0.8,
                       "--max-tokens", 60], tmp_path_factory.mktemp("serve"))
    yield s
    s.kill()


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema,
                                                   "strict": True}}


def test_response_format_json_schema_with_the_openai_client(server):
    client = server.client()
    for seed in range(4):
        answer = client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": PROMPT}], seed=seed,
            response_format=schema_format(RECORD), max_tokens=80)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), RECORD)
        assert answer.model_extra["speculative"]["forced"] >= 10
    # streamed, and on the legacy completions endpoint
    stream = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], seed=7,
        response_format=schema_format(RECORD), max_tokens=80, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), RECORD)
    r = ask(server, "/v1/completions", {"model": server.model, "prompt": PROMPT, "seed": 1,
                                        "max_tokens": 80,
                                        "response_format": schema_format(RECORD)})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), RECORD)


def test_response_format_json_object(server):
    r = ask(server, "/v1/chat/completions",
            chat_body(server, response_format={"type": "json_object"}, max_tokens=60,
                      temperature=0))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["message"]["content"].startswith("{")
    plain = ask(server, "/v1/chat/completions",
                chat_body(server, response_format={"type": "text"}, max_tokens=8))
    assert plain.status_code == 200


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": schema_format({"type": "no-such-type"})}, "response_format",
     "the JSON schema is not valid"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "json_schema.schema is missing"),
    ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "no-such-type"}}}]}, "tools", "not valid"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "not supported"),
    ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
    ({"top_logprobs": 3}, "top_logprobs", "needs logprobs"),
])
def test_what_the_server_cannot_do_is_a_400_naming_the_field(server, body, param, words):
    r = ask(server, "/v1/chat/completions", chat_body(server, max_tokens=4, **body))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"
    # the official client raises it as the client's mistake
    with pytest.raises(openai.BadRequestError):
        server.client().chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": PROMPT}],
            max_tokens=4, **body)


def test_no_op_values_of_unsupported_fields_are_fine(server):
    r = ask(server, "/v1/chat/completions",
            chat_body(server, max_tokens=4, tools=[], presence_penalty=0,
                      frequency_penalty=0.0, logit_bias={}, user="me"))
    assert r.status_code == 200, r.text


def target_logprobs(target_path, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The target alone's log-probabilities before each generated token."""
    probe = Model(target_path, n_ctx=512, n_threads=1)
    try:
        rows = []
        for j in range(len(tokens)):
            probe.clear()
            probe.decode(prompt + tokens[:j], "last")
            rows.append(log_softmax(probe.logits_row(-1)))
        return rows
    finally:
        probe.close()


def test_logprobs_in_both_shapes(server):
    client = server.client()
    answer = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=12,
                                       temperature=0.9, seed=3, logprobs=3)
    lp = answer.choices[0].logprobs
    assert len(lp.tokens) == answer.usage.completion_tokens == len(lp.token_logprobs)
    assert "".join(lp.tokens) == answer.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(top) == 3 for top in lp.top_logprobs)
    assert all(x <= 0 for x in lp.token_logprobs)
    chat = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=10,
        temperature=0.9, seed=5, logprobs=True, top_logprobs=4)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 4
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True) and entry.logprob <= tops[0] + 1e-9
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_logprobs_under_a_response_format_list_only_tokens_it_allows(server):
    """Tokens the grammar forbids have probability 0: no alternatives, and their log
    (-inf) is no JSON number (it was a 500, found by the fuzzer, tests/fuzz/)."""
    answer = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": server.model, "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 6, "logprobs": True, "top_logprobs": 20, "temperature": 0,
        "response_format": {"type": "json_object"}})
    assert answer.status_code == 200, answer.text
    tops = [e["top_logprobs"] for e in answer.json()["choices"][0]["logprobs"]["content"]]
    assert all(math.isfinite(t["logprob"]) for top in tops for t in top)
    assert min(len(top) for top in tops) < 20  # where the grammar allows fewer than 20


def test_logprobs_match_the_target_alone(tiny_target, tiny_draft):
    """Through the engine: the log-probabilities read from the verify passes equal those
    of the target decoding alone, whatever was drafted."""
    from specllama import SamplingParams, SpeculativeDecoder

    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1)
    try:
        prompt = dec.tokenize(PROMPT)
        res = dec.generate(prompt, max_tokens=16, draft_max=3, logprobs=2,
                           sampling=SamplingParams(temperature=0.9, seed=2))
        assert res.stats.drafted > 0 and len(res.logprobs) == len(res.tokens)
        rows = target_logprobs(tiny_target, prompt, res.tokens)
        # verify passes split the text otherwise: a log-probability moves by at most twice
        # the logits' noise, ten times it is allowed, a row one position off is far more
        bound = tolerance(file_split_noise(tiny_target, prompt + res.tokens, len(prompt)))
        for j, (entry, row) in enumerate(zip(res.logprobs, rows)):
            assert entry.token == res.tokens[j]
            assert math.isclose(entry.logprob, row[entry.token], abs_tol=bound), j
            assert [t for t, _ in entry.top] == list(np.argsort(-row)[:2])
    finally:
        dec.close()


def test_streamed_logprobs_come_with_the_last_chunk(server):
    stream = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
        temperature=0, logprobs=True, stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    with_lp = [c for c in chunks if c.choices[0].logprobs is not None]
    assert len(with_lp) == 1 and with_lp[0].choices[0].finish_reason is not None
    assert "".join(e.token for e in with_lp[0].choices[0].logprobs.content).startswith(text)


def test_a_server_wide_constraint_applies_to_requests_without_their_own(
        tiny_target, tiny_draft, tmp_path):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 512, "--regex", "[0-4]{4,8}", "--max-tokens", 12],
                      tmp_path)
    try:
        r = ask(s, "/v1/completions", {"model": s.model, "prompt": PROMPT, "seed": 1})
        assert re.fullmatch("[0-4]{4,8}", r.json()["choices"][0]["text"]), r.text
        free = ask(s, "/v1/completions", {"model": s.model, "prompt": PROMPT, "seed": 1,
                                          "response_format": {"type": "text"}})
        assert free.status_code == 200
    finally:
        s.kill()


# ------------------------------------------------------------ the real SmolLM2 pair

# Bounded so that any output is complete within max_tokens (at most ~60 tokens): after
# the closing brace the constraint allows only the end, so every run ends at "eos" on
# any CPU, whatever words the model picks.
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z .'-]{1,20}$"},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "pattern": "^[A-Za-z .'-]{1,20}$"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PERSON_PROMPT = "Describe a fictional person as JSON with their name, age and city."


@pytest.mark.slow
def test_every_smollm2_output_validates_through_the_cli(run, smollm2_path, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    for seed in range(4):
        result = run("generate", PERSON_PROMPT, "--pair", "smollm2", "--json-schema", schema,
                     "--seed", seed, "--temperature", 0.8, "--max-tokens", 100, "--json")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["finish_reason"] == "eos", data["text"]
        jsonschema.validate(json.loads(data["text"]), PERSON)


@pytest.mark.slow
def test_every_smollm2_output_validates_through_the_openai_client(smollm2_path, tmp_path):
    s = ServerProcess(["--pair", "smollm2", "--max-tokens", 100], tmp_path)
    try:
        client = s.client()
        for seed in range(4):
            answer = client.chat.completions.create(
                model=s.model, messages=[{"role": "user", "content": PERSON_PROMPT}],
                seed=seed, temperature=0.8, response_format=schema_format(PERSON))
            assert answer.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)
    finally:
        s.kill()
