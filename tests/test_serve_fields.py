"""llama-server's own request fields, through a real `specllama serve` on tiny models:
each was accepted and silently dropped (a grammar asked for, free text answered with a
200). Now `grammar`, `json_schema`, `response_format.schema` and `ignore_eos` are
honoured, the samplers specllama does not have are a 400 naming them, null means the
default, and a max_tokens past the window generates what fits.

`ignore_eos` is exact: the target's distribution without its end-of-generation tokens
(their logits -inf, as llama-server's logit bias sets them), checked greedy against the
masked target alone and seeded against the masked law.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import numpy as np
import pytest
from servers import ServerProcess

from specllama import DraftProposed, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities
from tests.test_constraint import fit

N_CTX = 256
PROMPT = "the cat sat 3141 and 3141 and 314"
# The eos pair's end-of-sequence token is this ordinary word: the greedy answer to
# EOS_PROMPT is it at once, and sampled answers end there often.
EOS_PIECE = "▁ho"
EOS_PROMPT = "The quick brown fox"
ANIMALS = 'root ::= "cat" (" " animal){2,4}\nanimal ::= "cat" | "dog"\n'
RECORD = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", N_CTX, "--draft-max", 3, "--max-tokens", 32],
                      tmp_path_factory.mktemp("fields"))
    yield s
    s.kill()


@pytest.fixture(scope="module")
def eos_pair(tiny_model_factory):
    target = tiny_model_factory(seed=0, eos=EOS_PIECE)
    return target, tiny_model_factory(seed=0, noise=0.05, noise_seed=1, eos=EOS_PIECE)


@pytest.fixture(scope="module")
def eos_server(eos_pair, tmp_path_factory):
    s = ServerProcess(["--target", eos_pair[0], "--draft", eos_pair[1], "--threads", 1,
                       "--n-ctx", N_CTX, "--draft-max", 3, "--max-tokens", 32],
                      tmp_path_factory.mktemp("eos"))
    yield s
    s.kill()


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=60)


def chat(server, **body) -> httpx.Response:
    return post(server, "/v1/chat/completions",
                **{"messages": [{"role": "user", "content": PROMPT}], **body})


def complete(server, **body) -> httpx.Response:
    return post(server, "/v1/completions", **{"prompt": PROMPT, **body})


def refused(r: httpx.Response, param: str, *words: str, code: str | None = None) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    for word in words:
        assert word in error["message"], error
    if code is not None:
        assert error["code"] == code, error
    return error


def text_of(r: httpx.Response) -> tuple[str, str]:
    assert r.status_code == 200, r.text[:500]
    choice = r.json()["choices"][0]
    return choice.get("text", (choice.get("message") or {}).get("content")), \
        choice["finish_reason"]


# ------------------------------------------------------------ constraints, llama-server's


def test_a_gbnf_grammar_is_followed(server):
    for seed in range(3):
        for ask in (chat, complete):
            text, finish = text_of(ask(server, grammar=ANIMALS, temperature=1, seed=seed,
                                       max_tokens=30))
            assert finish == "stop" and re.fullmatch("cat( (cat|dog)){2,4}", text), text
    # an empty grammar is none, as llama-server reads it
    assert complete(server, grammar="", max_tokens=4).status_code == 200
    refused(chat(server, grammar='root ::= "unclosed'), "grammar", "not valid")


def test_a_json_schema_field_is_followed(server):
    for seed in range(3):
        text, finish = text_of(chat(server, json_schema=RECORD, seed=seed, max_tokens=40))
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), RECORD)
    # an empty schema is any JSON object, as llama-server reads it
    text, finish = text_of(complete(server, json_schema={}, temperature=0, max_tokens=40))
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    refused(chat(server, json_schema={"type": "no-such-type"}), "json_schema", "not valid",
            code="invalid_json_schema")


def test_response_format_json_object_with_a_schema_follows_it(server):
    """llama-server's extension: a json_object format that carries a schema; and its
    README's json_schema format with the schema beside the type."""
    for fmt in ({"type": "json_object", "schema": RECORD},
                {"type": "json_schema", "schema": RECORD}):
        for ask in (chat, complete):
            text, finish = text_of(ask(server, response_format=fmt, seed=2, max_tokens=40))
            assert finish == "stop", (fmt, text)
            jsonschema.validate(json.loads(text), RECORD)


@pytest.mark.parametrize("body, param, names", [
    ({"grammar": ANIMALS, "json_schema": RECORD}, "json_schema", ["grammar", "json_schema"]),
    ({"grammar": ANIMALS, "response_format": {"type": "json_object"}}, "response_format",
     ["grammar", "response_format"]),
    ({"json_schema": RECORD, "response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": RECORD}}}, "response_format", ["json_schema", "response_format"]),
    ({"grammar": ANIMALS, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "grammar", ["grammar", "tools"]),
    ({"response_format": {"type": "json_schema", "schema": RECORD,
                          "json_schema": {"name": "r", "schema": RECORD}}},
     "response_format", ["schema", "json_schema.schema"]),
])
def test_two_constraints_at_once_are_a_400_naming_them(server, body, param, names):
    error = refused(chat(server, **body), param, *names, code="unsupported_parameter")
    assert "\n" not in error["message"]


# ---------------------------------------------------------- samplers specllama lacks


@pytest.mark.parametrize("field, value", [
    ("mirostat", 2), ("typical_p", 0.9), ("tfs_z", 0.95), ("dry_multiplier", 0.8),
    ("xtc_probability", 0.5), ("dynatemp_range", 0.5),
    ("top_n_sigma", 1.5), ("min_keep", 5), ("samplers", ["top_k", "temperature"]),
    ("n_probs", 3), ("logit_bias", {"5": 1}),
])
def test_a_sampler_specllama_lacks_is_a_400_naming_it(server, field, value):
    for ask in (chat, complete):
        refused(ask(server, **{field: value}), field, "not supported",
                code="unsupported_parameter")


def test_a_sampler_family_is_named_by_its_switch(server):
    """DRY, XTC and mirostat take their other fields into account only when switched
    on: then the 400 names the switch."""
    refused(chat(server, dry_multiplier=0.8, dry_base=2.0), "dry_multiplier")
    refused(chat(server, xtc_probability=0.3, xtc_threshold=0.2), "xtc_probability")
    refused(chat(server, mirostat=1, mirostat_tau=4.0), "mirostat")


def rounds_text(server, **body) -> str:
    """A greedy turn's text through /v1/rounds, where a turn may set its draft length."""
    with httpx.stream("POST", server.url + "/v1/rounds", timeout=60, json={
            "model": server.model, "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": PROMPT}], **body}) as r:
        assert r.status_code == 200, r.read()
        data = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    return data[-1]["text"]


def test_penalties_are_honoured_and_exact_under_speculation(server):
    """repeat_penalty (or repetition_penalty), repeat_last_n and OpenAI's two penalties
    change the answer, and a turn drafted by the draft model reads as the target alone's
    with the same penalties (engine/penalties.py says why it is exact)."""
    plain = rounds_text(server, draft_max=0)
    for penalties in ({"repeat_penalty": 1.8, "repeat_last_n": -1},
                      {"repetition_penalty": 1.8}, {"presence_penalty": 2, "frequency_penalty": 2}):
        alone = rounds_text(server, draft_max=0, **penalties)
        assert alone != plain, penalties
        assert rounds_text(server, draft_max=3, drafters="model", **penalties) == alone
    refused(chat(server, repeat_penalty=0), "repeat_penalty")
    refused(chat(server, presence_penalty=2.5), "presence_penalty")


def test_llama_servers_defaults_are_no_ops(server):
    """What llama-server clients send with every request (its /props defaults, samplers
    switched off): served, as llama-server serves them."""
    defaults = {"typical_p": 1.0, "tfs_z": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 64,
                "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
                "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", ":", '"', "*"],
                "xtc_probability": 0.0, "xtc_threshold": 0.1, "mirostat": 0,
                "mirostat_tau": 5.0, "mirostat_eta": 0.1, "dynatemp_range": 0.0,
                "dynatemp_exponent": 1.0, "top_n_sigma": -1.0, "min_keep": 0, "n_probs": 0,
                "ignore_eos": False, "cache_prompt": True}
    for ask in (chat, complete):
        assert ask(server, max_tokens=4, **defaults).status_code == 200
    # Off in any JSON spelling of the number (a client that writes every number as a
    # float), but a boolean is not a number here.
    floats = {"mirostat": 0.0, "min_keep": 0.0, "n_probs": 0.0, "typical_p": 1,
              "top_n_sigma": -1}
    assert chat(server, max_tokens=4, **floats).status_code == 200
    refused(chat(server, mirostat=False), "mirostat", "not supported")


# ------------------------------------------------------------------- null is the default


def test_null_is_the_default(server):
    """OpenAI accepts null for these (it means the default); they were 422s."""
    r = chat(server, logprobs=None, stream=None, n=None, parallel_tool_calls=None,
             ignore_eos=None, max_tokens=4)
    assert r.status_code == 200, r.text
    assert "logprobs" not in r.json()["choices"][0] or \
        r.json()["choices"][0]["logprobs"] is None
    r = complete(server, stream=None, n=None, logprobs=None, max_tokens=4)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------- max_tokens past the window


def test_max_tokens_past_the_window_generates_what_fits(server):
    """Claude Code asks for 32000 tokens whatever the window: as llama-server and Ollama,
    the answer runs until the window is full and ends as the API ends an answer cut
    short (OpenAI's "length"; Anthropic's own reason for a full window)."""
    r = chat(server, max_tokens=32000, temperature=0)
    text, finish = text_of(r)
    usage = r.json()["usage"]
    assert finish == "length", text
    assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX + 1
    r = post(server, "/v1/messages", max_tokens=32000, temperature=0,
             messages=[{"role": "user", "content": PROMPT}])
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "model_context_window_exceeded"
    r = chat(server, max_completion_tokens=10**6, temperature=0, stream=True)
    assert r.status_code == 200 and '"finish_reason":"length"' in r.text.replace(" ", "")
    # a prompt that does not fit is still the client's 400
    refused(complete(server, prompt="cat " * N_CTX, max_tokens=32000), "prompt",
            code="context_length_exceeded")


def test_llama_servers_n_predict_is_the_token_limit(server):
    text, finish = text_of(complete(server, n_predict=5, temperature=0))
    assert finish == "length"
    r = complete(server, n_predict=-1, temperature=0)  # -1: as many as fit
    assert r.json()["usage"]["completion_tokens"] > 32, r.text  # past --max-tokens
    refused(complete(server, n_predict=0), "n_predict")


# ------------------------------------------------------------------------- ignore_eos


def masked_greedy(path, prompt: list[int], n: int) -> list[int]:
    """The target alone, greedy, with its end-of-generation logits at -inf."""
    probe = Model(path, n_ctx=N_CTX, n_threads=1)
    try:
        eog = [t for t in range(probe.n_vocab) if probe.is_eog(t)]
        out: list[int] = []
        probe.decode(prompt, "last")
        for _ in range(n):
            row = np.array(probe.logits_row(-1))
            row[eog] = -np.inf
            out.append(int(np.argmax(row)))
            probe.decode([out[-1]], "last")
        return out
    finally:
        probe.close()


@pytest.fixture(scope="module")
def eos_decoder(eos_pair):
    dec = SpeculativeDecoder.load(eos_pair[0], eos_pair[1], n_ctx=N_CTX, n_threads=1,
                                  p_min=0.0)
    probe = Model(eos_pair[0], n_ctx=N_CTX, n_threads=1)
    yield dec, probe, dec.tokenize(EOS_PROMPT)
    probe.close()
    dec.close()


@pytest.mark.parametrize("drafters", ["model", "lookup", "hybrid"])
def test_greedy_ignore_eos_equals_the_masked_target_alone(eos_pair, eos_decoder, drafters):
    dec, _, prompt = eos_decoder
    greedy = SamplingParams(temperature=0.0)
    plain = dec.generate(prompt, max_tokens=20, sampling=greedy, draft_max=3)
    assert plain.finish_reason == "eos" and len(plain.tokens) == 1  # " ho" at once
    spec = dec.generate(prompt, max_tokens=20, sampling=greedy, draft_max=3,
                        drafters=drafters, ignore_eos=True)
    alone = dec.generate(prompt, max_tokens=20, sampling=greedy, draft_max=0, ignore_eos=True)
    assert spec.finish_reason == alone.finish_reason == "length"
    assert spec.tokens == alone.tokens == masked_greedy(eos_pair[0], prompt, 20)


def test_ignore_eos_through_the_server_runs_to_max_tokens(eos_pair, eos_decoder, eos_server):
    r = post(eos_server, "/v1/completions", prompt=EOS_PROMPT, temperature=0, max_tokens=12)
    text, finish = text_of(r)
    assert finish == "stop" and r.json()["usage"]["completion_tokens"] == 1
    r = post(eos_server, "/v1/completions", prompt=EOS_PROMPT, temperature=0, max_tokens=12,
             ignore_eos=True)
    text, finish = text_of(r)
    assert finish == "length" and r.json()["usage"]["completion_tokens"] == 12
    dec, _, prompt = eos_decoder
    expected = b"".join(dec.target.piece(t) for t in masked_greedy(eos_pair[0], prompt, 12))
    assert text == expected.decode("utf-8", "replace")
    # chat: the template's end of turn cannot end it either
    r = post(eos_server, "/v1/chat/completions", temperature=0.8, seed=1, max_tokens=40,
             ignore_eos=True, messages=[{"role": "user", "content": EOS_PROMPT}])
    assert text_of(r)[1] == "length" and r.json()["usage"]["completion_tokens"] == 40
    # a constraint ends on an end-of-generation token: the two cannot go together
    refused(post(eos_server, "/v1/completions", prompt=EOS_PROMPT, ignore_eos=True,
                 grammar=ANIMALS), "ignore_eos", "constraint")


# The law of the first tokens: top-k 3 at temperature 1 keeps it to 27 outcomes; the
# first token is EOS (" ho") with probability 0.64 without the mask.
LAW = SamplingParams(temperature=1.0, top_k=3)
RUNS, TOKENS = 2000, 3


def exact_law(probe: Model, prompt: list[int], mask_first: bool) -> dict:
    """P(x1..x3) for the target alone without EOG: its logits at -inf before top-k
    (mask_first, llama-server's logit bias), or the wrong way round: EOG dropped from
    the top-k survivors afterwards."""
    eog = [t for t in range(probe.n_vocab) if probe.is_eog(t)]
    joint: dict = {}

    def walk(path: tuple, prob: float) -> None:
        probe.truncate(len(prompt) - 1)
        probe.decode([prompt[-1], *path], "last")
        row = np.array(probe.logits_row(-1))
        if mask_first:
            row[eog] = -np.inf
        p = probabilities(row, LAW)
        p[eog] = 0.0
        p /= p.sum()
        for x in np.flatnonzero(p > 1e-12):
            key, mass = (*path, int(x)), prob * float(p[x])
            if len(key) == TOKENS:
                joint[key] = mass
            else:
                walk(key, mass)

    probe.clear()
    probe.decode(prompt[:-1], "none")
    walk((), 1.0)
    probe.clear()
    return joint


def test_ignore_eos_under_speculation_keeps_the_masked_law(eos_decoder):
    """The draft model drafts " ho" (EOS) often; the target, its EOS at p = 0, rejects
    each, and the residual keeps the law exact."""
    dec, probe, prompt = eos_decoder
    eog = {t for t in range(probe.n_vocab) if probe.is_eog(t)}
    counts: dict = {}
    drafted_eog = 0
    for seed in range(RUNS):
        s = SamplingParams(LAW.temperature, LAW.top_k, seed=seed)
        stream = dec.stream(prompt, max_tokens=TOKENS, sampling=s, draft_max=3,
                            drafters="model", ignore_eos=True, keep_cache=True)
        for event in stream:
            if isinstance(event, DraftProposed):
                drafted_eog += any(t in eog for t in event.tokens)
        key = tuple(stream.result.tokens)
        counts[key] = counts.get(key, 0) + 1
    assert drafted_eog > RUNS // 4, drafted_eog
    assert fit(counts, exact_law(probe, prompt, mask_first=True)) > 1e-3
    # the test tells the law from EOG dropped after top-k
    wrong = exact_law(probe, prompt, mask_first=False)
    wrong.update({k: 1e-12 for k in counts if k not in wrong})
    assert fit(counts, wrong) < 1e-6
