"""Fill in the middle through a real `specllama serve` (one server for most tests): POST
/infill in llama-server's shape, whole and streamed, a body exactly as llama.vim sends it
(and its cache warm-up), llama.vscode's three completions (n_cmpl), n_indent and
t_max_predict_ms, `suffix` on /v1/completions through the `openai` client, the 400 for a
model without FIM tokens, and the greedy answer equal to the target alone's on the same
FIM prompt.

The tiny pair has FIM tokens (tests/tinymodels.py, `fim=True`) and writes short lines
(`lines`): its lines begin unindented, so n_indent has lines to cut."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from conftest import DRAFT_NOISE
from servers import ServerProcess

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Vocabulary
from specllama.server import fim
from specllama.server.schema import MAX_CHOICES

N_CTX, MAX_TOKENS = 512, 24
PREFIX = "import os\n\ndef area(w, h):\n"
SUFFIX = "\n\nprint(area(2, 3))\n"
EXTRA = [{"filename": "shapes.py", "text": "def square(s):\n    return s * s\n"},
         {"filename": "util.py", "text": "def twice(x):\n    return 2 * x\n"}]

# A body as llama.vim builds it in llama#fim (autoload/llama.vim, ggml-org/llama.vim
# a1c8e6e): its default config (n_predict 128, no stop strings, t_max_prompt_ms 500, a
# first request's t_max_predict_ms 250), the cursor at the end of "    return " in a
# buffer whose ring holds one chunk (vim adds the chunk's "time"); json_encode's output.
LLAMA_VIM = json.loads(r'''{"id_slot": 0,
 "input_prefix": "import os\n\ndef area(w, h):\n",
 "input_suffix": "\n\nprint(area(2, 3))\n",
 "input_extra": [{"text": "def square(s):\n    return s * s\n", "time": 1712345678.25,
                  "filename": "shapes.py"}],
 "prompt": "    return ", "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40,
 "top_p": 0.9, "samplers": ["top_k", "top_p", "infill"], "stream": false,
 "cache_prompt": true, "t_max_prompt_ms": 500, "t_max_predict_ms": 250,
 "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms",
  "timings/prompt_per_token_ms", "timings/prompt_per_second", "timings/predicted_n",
  "timings/predicted_ms", "timings/predicted_per_token_ms", "timings/predicted_per_second",
  "truncated", "tokens_cached"]}''')
# ... and its ring-buffer update (s:ring_update): the extra context into the cache only.
LLAMA_VIM_WARM = json.loads(r'''{"id_slot": 0, "input_prefix": "", "input_suffix": "",
 "input_extra": [{"text": "def cube(s):\n    return s * s * s\n", "time": 1712345679.5,
                  "filename": "solids.py"}],
 "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": false,
 "cache_prompt": true, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
 "response_fields": [""]}''')

# A body as llama.vscode builds it (src/llama-server.ts, createRequestPayload;
# ggml-org/llama.vscode 3938fb3): its defaults (n_predict 128, n_cmpl 3 from
# max_parallel_completions, top_k 40, top_p 0.99, its samplers, t_max_prompt_ms and
# t_max_predict_ms 500), the cursor after "    return " (n_indent 4), a ring chunk with
# its time in ms and the file's full path; JSON.stringify's key order.
LLAMA_VSCODE = json.loads(r'''{"id_slot": 0,
 "input_prefix": "import os\n\ndef area(w, h):\n", "input_suffix": "\n\n\nprint(area(2, 3))\n",
 "input_extra": [{"text": "def square(s):\n    return s * s\n", "time": 1712345678250,
                  "filename": "/home/me/shapes/shapes.py"}],
 "prompt": "    return ", "n_predict": 128, "n_cmpl": 3, "top_k": 40, "top_p": 0.99,
 "stream": false, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": true,
 "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 500}''')


@pytest.fixture(scope="module")
def pair(tiny_model_factory):
    target = tiny_model_factory(seed=0, fim=True, lines=3.0)
    return target, tiny_model_factory(seed=0, fim=True, lines=3.0, noise=DRAFT_NOISE,
                                      noise_seed=1)


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    s = ServerProcess(["--target", pair[0], "--draft", pair[1], "--threads", 1,
                       "--n-ctx", N_CTX, "--draft-max", 3, "--max-tokens", MAX_TOKENS],
                      tmp_path_factory.mktemp("infill"))
    yield s
    s.kill()


def infill(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/infill", json={
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, **body}, timeout=60)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text[:500]
    return r.json()


def refused(r: httpx.Response, param: str, *words: str) -> dict:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    for word in words:
        assert word in error["message"], error
    return error


def cut_at_indent(text: str, columns: int) -> str:
    """llama-server's n_indent, written again: the first line after the first whose
    indentation (spaces and tabs) is under `columns` is cut before its first other
    character."""
    at = text.find("\n")
    while at >= 0:
        start = at + 1
        col = len(text[start:]) - len(text[start:].lstrip(" \t"))
        if start + col < len(text) and col < columns:
            return text[:start + col]
        at = text.find("\n", start)
    return text


# ------------------------------------------------------------------ the answer

def test_infill_answers_in_llama_servers_shape(server, pair):
    body = ok(infill(server, input_extra=EXTRA, n_predict=12))
    assert body["stop"] is True and body["stop_type"] in ("eos", "limit")
    assert body["tokens_predicted"] == 12 or body["stop_type"] == "eos"
    assert body["model"] == server.model and body["truncated"] is False
    timings = body["timings"]
    assert timings["predicted_n"] == body["tokens_predicted"] and timings["prompt_n"] > 0
    assert {"prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second",
            "cache_n"} <= set(timings)
    assert body["generation_settings"]["temperature"] == 0
    assert body["speculative"]["drafted"] > 0  # speculation ran
    # the prompt shown back is the FIM prompt, the files of input_extra first, in order
    vocab = Vocabulary(pair[0])
    tokens = fim.prompt(vocab, fim.Infill(PREFIX, SUFFIX, "", tuple(
        fim.Chunk(c["filename"], c["text"]) for c in EXTRA)), fim.Budget.of(N_CTX, MAX_TOKENS))
    assert body["tokens_evaluated"] == len(tokens) and body["prompt"] == vocab.render(tokens)
    shown = body["prompt"]
    assert shown.index("shapes.py") < shown.index("square") < shown.index("util.py") \
        < shown.index("twice") < shown.index("<fim:pre>") < shown.index("area") \
        < shown.index("<fim:suf>") < shown.index("print") < shown.index("<fim:mid>")


def test_greedy_infill_is_the_target_alones_answer(server, pair):
    """Exact: the speculative answer is the target alone's greedy decode of the same
    FIM prompt (draft_max 0, in this process)."""
    body = ok(infill(server, input_extra=EXTRA, prompt="    return", n_predict=20))
    assert body["speculative"]["drafted"] > 0
    vocab = Vocabulary(pair[0])
    tokens = fim.prompt(vocab, fim.Infill(PREFIX, SUFFIX, "    return", tuple(
        fim.Chunk(c["filename"], c["text"]) for c in EXTRA)), fim.Budget.of(N_CTX, MAX_TOKENS))
    alone = SpeculativeDecoder.load(target=str(pair[0]), n_ctx=N_CTX).generate(
        tokens, max_tokens=20, sampling=SamplingParams(temperature=0), draft_max=0)
    assert body["content"] == alone.text and body["tokens_predicted"] == len(alone.tokens)


def test_a_streamed_infill_sends_the_text_then_the_last_body(server):
    whole = ok(infill(server, n_predict=16))
    with httpx.stream("POST", f"{server.url}/infill", timeout=60, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0,
            "n_predict": 16, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    *parts, last = events
    assert parts and all(p["stop"] is False and p["content"] for p in parts)
    assert "".join(p["content"] for p in parts) == whole["content"]
    assert last["stop"] is True and last["content"] == "" and "timings" in last
    assert last["tokens_predicted"] == whole["tokens_predicted"]


# ------------------------------------------------------------------ llama.vim

def test_llama_vims_body_gets_the_fields_it_asked_for(server):
    r = httpx.post(f"{server.url}/infill", content=json.dumps(LLAMA_VIM),
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text[:500]
    # llama.vim's own check before it decodes: no space between the key's colon and text
    assert r.text.startswith("{") and re.search(r'"content"\s*:"', r.text)
    body = r.json()
    assert set(body) == set(LLAMA_VIM["response_fields"])
    assert body["timings/predicted_n"] > 0 and body["truncated"] is False
    assert body["tokens_cached"] > body["timings/predicted_n"]
    # its n_indent (4): no line after the first less indented
    assert cut_at_indent(body["content"], 4) == body["content"]
    # its samplers: top-k and top-p, no temperature (llama.cpp then samples at 1)
    full = ok(httpx.post(f"{server.url}/infill", timeout=60, json={
        **LLAMA_VIM, "response_fields": None}))
    settings = full["generation_settings"]
    assert settings["samplers"] == ["top_k", "top_p"] and settings["temperature"] == 1.0
    assert (settings["top_k"], settings["top_p"], settings["n_indent"]) == (40, 0.9, 4)


def test_llama_vims_warm_up_puts_its_files_in_the_cache(server, pair):
    r = httpx.post(f"{server.url}/infill", json=LLAMA_VIM_WARM, timeout=60)
    assert r.status_code == 200 and r.json() == {}  # response_fields [""]: nothing asked
    asked = {**LLAMA_VIM, "input_extra": LLAMA_VIM_WARM["input_extra"],
             "response_fields": None}
    body = ok(httpx.post(f"{server.url}/infill", json=asked, timeout=60))
    vocab, budget = Vocabulary(pair[0]), fim.Budget.of(N_CTX, MAX_TOKENS)
    chunk = fim.Chunk("solids.py", LLAMA_VIM_WARM["input_extra"][0]["text"])
    warm = fim.prompt(vocab, fim.Infill("", "", "", (chunk,)), budget)
    cold = fim.prompt(vocab, fim.Infill(asked["input_prefix"], asked["input_suffix"],
                                        asked["prompt"], (chunk,)), budget)
    common = next(i for i, (a, b) in enumerate(zip(warm, cold)) if a != b)
    assert common > 20 and body["timings"]["cache_n"] >= common - 1


# ------------------------------------------------------------------ several choices

def test_llama_vscodes_three_completions_come_back_as_a_list(server):
    """llama.vscode asks for n_cmpl 3 and reads a JSON array of bodies, each one's
    `content` (src/completion.ts, getComplFromContent), as llama-server answers it."""
    bodies = ok(httpx.post(f"{server.url}/infill", json=LLAMA_VSCODE, timeout=60))
    assert isinstance(bodies, list) and [b["index"] for b in bodies] == [0, 1, 2]
    for body in bodies:
        assert body["stop"] is True and isinstance(body["content"], str)
        assert body["timings"]["predicted_n"] == body["tokens_predicted"]
        assert cut_at_indent(body["content"], 4) == body["content"]  # its n_indent
        assert body["generation_settings"]["samplers"] == ["top_k", "top_p"]
    # the prompt evaluated once: the later choices find it in the cache
    assert all(b["timings"]["cache_n"] >= b["tokens_evaluated"] - 1 for b in bodies[1:])


def test_n_cmpl_greedy_choices_are_the_one_answer_whole_and_streamed(server):
    one = ok(infill(server, n_predict=16))
    three = ok(infill(server, n_predict=16, n_cmpl=3))
    assert [b["index"] for b in three] == [0, 1, 2]
    assert {b["content"] for b in three} == {one["content"]}
    # `n` is n_cmpl's alias, as in llama-server; response_fields pick each body's
    picked = ok(infill(server, n_predict=16, n=2, response_fields=["content"]))
    assert picked == [{"content": one["content"]}] * 2
    with httpx.stream("POST", f"{server.url}/infill", timeout=60, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0,
            "n_predict": 16, "n_cmpl": 2, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    indexes = [e["index"] for e in events]
    assert indexes == sorted(indexes) and [e["index"] for e in events if e["stop"]] == [0, 1]
    for i in (0, 1):
        assert "".join(e["content"] for e in events if e["index"] == i) == one["content"]


# ------------------------------------------------------------------ the editors' stops

def test_n_indent_cuts_the_first_line_less_indented(server):
    whole = ok(infill(server, n_predict=24))["content"]
    expected = cut_at_indent(whole, 1)
    assert expected != whole, whole  # the tiny model's lines begin unindented
    body = ok(infill(server, n_predict=24, n_indent=1))
    assert body["content"] == expected and body["stop_type"] == "limit"


def test_t_max_predict_ms_ends_at_a_newline_once_the_time_is_up(server):
    """1 ms is up within the first rounds: the answer ends at a newline well before the
    48 tokens the same request writes without it."""
    whole = ok(infill(server, n_predict=48))["content"]
    assert whole.count("\n") >= 4, whole
    body = ok(infill(server, n_predict=48, t_max_predict_ms=1))
    assert body["stop_type"] == "limit" and body["content"].endswith("\n")
    assert whole.startswith(body["content"]) and body["content"] != whole
    long = ok(infill(server, n_predict=48, t_max_predict_ms=600_000))
    assert long["content"] == whole


# ------------------------------------------------------------------ suffix, refusals

def test_suffix_through_the_openai_client_is_the_same_fim_prompt(server):
    client = server.client()
    r = client.completions.create(model=server.model, prompt=PREFIX, suffix=SUFFIX,
                                  max_tokens=10, temperature=0)
    same = ok(infill(server, n_predict=10))
    assert r.choices[0].text == same["content"]
    assert r.usage.prompt_tokens == same["tokens_evaluated"]
    # n_indent there too, as llama-server: a limit, so "length"
    cut = client.completions.create(model=server.model, prompt=PREFIX, suffix=SUFFIX,
                                    max_tokens=24, temperature=0, extra_body={"n_indent": 1})
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].text == cut_at_indent(ok(infill(server, n_predict=24))["content"], 1)


def test_what_infill_does_not_do_is_refused_by_name(server):
    refused(infill(server, samplers=["top_k", "mirostat_v2"]), "samplers", "mirostat_v2")
    # more choices than the server's cap, in llama-server's words (llama.vscode then
    # names its setting to change)
    error = refused(infill(server, n_cmpl=MAX_CHOICES + 1), "n_cmpl")
    assert error["message"] == (f"Field 'n_cmpl': Value must be between 1 <= value <= "
                                f"{MAX_CHOICES}, but got {MAX_CHOICES + 1}")
    refused(infill(server, n_probs=5), "n_probs")
    assert infill(server, input_extra={"text": "x"}).status_code == 422
    assert httpx.post(f"{server.url}/infill", json={"input_prefix": "x"},
                      timeout=30).status_code == 422
    r = infill(server, model="another")
    assert r.status_code == 404, r.text
    # chat has no suffix and no editors' stops: still refused there
    chat = {"model": server.model, "messages": [{"role": "user", "content": "hi"}]}
    for field, value in (("suffix", "x"), ("n_indent", 4), ("t_max_predict_ms", 100)):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={**chat, field: value},
                       timeout=30)
        refused(r, field)


def test_a_model_without_fim_tokens_is_a_400_naming_it(tiny_target, tiny_draft,
                                                         tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 256, "--max-tokens", 4], tmp_path_factory.mktemp("nofim"))
    try:
        error = refused(infill(s), "input_prefix", tiny_target.name,
                        "has no fill-in-the-middle tokens")
        assert error["message"].startswith("model ")
        r = httpx.post(f"{s.url}/v1/completions", timeout=30, json={
            "model": s.model, "prompt": PREFIX, "suffix": SUFFIX})
        refused(r, "suffix", tiny_target.name, "has no fill-in-the-middle tokens")
        r = httpx.post(f"{s.url}/v1/completions", timeout=30, json={
            "model": s.model, "prompt": PREFIX, "suffix": ""})  # "": no suffix
        assert r.status_code == 200, r.text
    finally:
        s.kill()
