"""Reasoning told apart from the answer (server/reasoning.py): the splitter at every cut
of its input, the markers real templates imply, thinking turned off per request, and
constraints that hold on the answer only, through the real engine and a real server."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import jsonschema
import pytest
from servers import ServerProcess

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.constraint import Constraint, ConstraintSpec
from specllama.engine.llama import Vocabulary
from specllama.server.prompts import Defaults, build_work, constraint
from specllama.server.reasoning import (
    Markers,
    Splitter,
    constrain_answer,
    markers,
    thinking_off,
    variables,
    with_tokens,
)
from specllama.server.schema import ChatRequest, ResponseFormat, Tool
from specllama.server.tools import ToolUse
from specllama.server.tools import grammar as tools_grammar

# Qwen3's template, cut to what matters here: earlier answers lose their reasoning, and
# `enable_thinking` false writes an empty reasoning block after the generation prompt.
QWEN3 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
# QwQ's and DeepSeek-R1's way: the template opens the reasoning itself, and has no switch.
OPENS = (
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
# gpt-oss's harmony format, its channels only.
HARMONY = (
    "{%- for message in messages %}"
    "{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}"
    "{%- endfor %}"
    "{#- the assistant writes <|channel|>analysis<|message|>, then <|channel|>final -#}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)
THINK = Markers("<think>", "</think>")
OPEN = Markers("<think>", "</think>", starts_open=True)
HARMONY_MARKERS = Markers("<|channel|>analysis<|message|>",
                          "<|start|>assistant<|channel|>final<|message|>", hidden="<|end|>")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "n"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Is it?"}]


# ------------------------------------------------------------------ the splitter

SPLITS = {
    "opened by the template": (
        OPEN, "\nLet me think.\n\nYes </th ink.\n</think>\n\nThe answer.",
        "Let me think.\n\nYes </th ink.", "The answer."),
    "opened by the model": (THINK, " <think>\nhmm <think\n</think>\n\n<tool_call>x",
                            "hmm <think", "<tool_call>x"),
    "no reasoning": (THINK, "Hello <think> there</think>", None, "Hello <think> there</think>"),
    "the opening's beginning only": (THINK, "  <thi", None, "  <thi"),
    "never closed": (OPEN, "on and on </thi", "on and on </thi", None),
    "closed twice": (OPEN, "a</think>b</think>c", "a", "b</think>c"),
    "empty reasoning": (THINK, "<think>\n\n</think>\n\nAnswer", None, "Answer"),
    "nothing": (OPEN, "", None, None),
    "gpt-oss channels": (
        HARMONY_MARKERS,
        "<|channel|>analysis<|message|>Need 2+2.<|start|>assistant<|channel|>final"
        "<|message|>4", "Need 2+2.", "4"),
}


def split(markers: Markers, deltas: list[str]) -> list[tuple[str, str]]:
    splitter, parts = Splitter(markers), []
    for delta in deltas:
        parts += splitter.feed(delta)
    return parts + list(splitter.end())


def told(parts: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    kinds = [k for k, _ in parts]
    assert kinds == sorted(kinds), f"reasoning after text: {parts}"  # "reasoning" < "text"
    assert all(t for _, t in parts), parts
    reasoning = "".join(t for k, t in parts if k == "reasoning") or None
    return reasoning, "".join(t for k, t in parts if k == "text") or None


@pytest.mark.parametrize("case", SPLITS)
def test_the_split_is_the_same_at_every_cut(case):
    markers, text, reasoning, answer = SPLITS[case]
    assert told(split(markers, [text])) == (reasoning, answer)
    assert told(split(markers, list(text))) == (reasoning, answer)  # a character at a time
    for i, j in itertools.combinations(range(len(text) + 1), 2):
        assert told(split(markers, [text[:i], text[i:j], text[j:]])) == (reasoning, answer), \
            (i, j)


def test_the_reasoning_streams_before_its_end_is_known():
    splitter = Splitter(OPEN)
    assert list(splitter.feed("Step one, ")) == [("reasoning", "Step one,")]
    assert list(splitter.feed("step two </")) == [("reasoning", " step two")]
    assert list(splitter.feed("think>\nDone")) == [("text", "Done")]
    assert list(splitter.end()) == []


# ------------------------------------------------------------------ the templates


@pytest.fixture(scope="module")
def vocabs(tiny_model_factory):
    made = {name: Vocabulary(tiny_model_factory(seed=0, chat_template=t))
            for name, t in (("qwen3", QWEN3), ("opens", OPENS), ("plain", None))}
    yield made
    for v in made.values():
        v.close()


def chat(**fields) -> ChatRequest:
    return ChatRequest.model_validate({"model": "m", "messages": ASK, **fields})


def test_format_chat_passes_template_variables(vocabs):
    v = vocabs["qwen3"]
    assert v.format_chat(ASK).endswith("<|im_start|>assistant\n")
    assert v.format_chat(ASK, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("template, effort, expected", [
    (QWEN3, None, THINK),
    (QWEN3, "high", THINK),
    (QWEN3, "none", None),  # the template writes an empty reasoning block
    (OPENS, None, OPEN),
    (OPENS, "none", OPEN),  # no switch: `thinking_off` closes it (below)
    (HARMONY, None, HARMONY_MARKERS),
    (HARMONY, "none", HARMONY_MARKERS),  # gpt-oss always reasons: split all the same
    ("{{ messages[0].content }}", None, None),
    (None, None, None),
])
def test_markers_from_the_template_and_its_prompt(vocabs, template, effort, expected):
    v = vocabs["qwen3"]
    rendered = v.format_chat(ASK, template=template, **variables(effort)) if template else "x"
    assert markers(template, rendered) == expected
    assert markers(template, rendered, "none") is None


def test_thinking_off_closes_a_reasoning_the_template_opened(vocabs):
    rendered = vocabs["opens"].format_chat(ASK)
    closed = thinking_off(OPENS, rendered)
    assert closed == rendered + "\n</think>\n\n"
    assert markers(OPENS, closed) is None
    qwen3 = vocabs["qwen3"].format_chat(ASK)
    assert thinking_off(QWEN3, qwen3) == qwen3  # the model opens it: cannot be told
    assert thinking_off(None, "x") == "x"


@pytest.mark.parametrize("name, effort, fmt, expected, ends", [
    ("qwen3", None, "auto", THINK, "assistant\n"),
    ("qwen3", "low", "auto", THINK, "assistant\n"),
    ("qwen3", "none", "auto", None, "<think>\n\n</think>\n\n"),
    ("qwen3", None, "none", None, "assistant\n"),
    ("opens", None, "auto", OPEN, "<think>\n"),
    ("opens", "none", "auto", None, "<think>\n\n</think>\n\n"),
    ("opens", "none", "none", None, "<think>\n\n</think>\n\n"),  # off whatever the format
    ("plain", None, "auto", None, "Assistant:"),
])
def test_build_work_sets_the_markers(vocabs, name, effort, fmt, expected, ends):
    v = vocabs[name]
    work = build_work(v, 512, Defaults(SamplingParams(), 16, reasoning_format=fmt),
                      chat(reasoning_effort=effort))
    assert work.reasoning == expected
    assert v.detokenize(work.tokens).endswith(ends)
    assert work.constraint is None  # no constraint asked: none made for the reasoning


def test_markers_of_control_tokens_are_not_split(vocabs):
    """The output text leaves control tokens out: a split on them would never close."""
    v = vocabs["plain"]
    assert with_tokens(THINK, v) == THINK  # spelt in pieces here: no special token
    assert with_tokens(Markers("<think>", "<|im_start|>"), v) is None
    assert with_tokens(Markers("<|im_start|>", "</think>"), v) is None
    # gpt-oss's <|end|> is a control token the text leaves out: the grammar allows it
    hidden = with_tokens(Markers("<a>", "</a>", hidden="<|im_end|>"), v)
    assert hidden is not None and hidden.tokens == (("<|im_end|>", 4),)


def test_completions_are_not_split(vocabs):
    from specllama.server.schema import CompletionRequest

    req = CompletionRequest.model_validate({"model": "m", "prompt": "<think>"})
    assert build_work(vocabs["opens"], 512, Defaults(SamplingParams(), 16), req).reasoning \
        is None


# ------------------------------------------------------------------ the constraint

FORMAT = ResponseFormat.model_validate(
    {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
TOOL = Tool.model_validate({"type": "function", "function": {
    "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}},
                                "required": ["a"]}}})
SPECS = {
    "json_schema": ConstraintSpec.json_schema(SCHEMA),
    "json_object": ConstraintSpec("json_object"),
    "regex": ConstraintSpec("regex", r"(yes|no)/[0-9]+"),
    "gbnf": ConstraintSpec("grammar", 'root ::= "a" digits\ndigits ::= [0-9]+'),
    "lark": ConstraintSpec("grammar", 'start: "a" x\nx: /[0-9]+/\n%ignore " "'),
    "tools auto": ConstraintSpec("grammar", tools_grammar([TOOL], ToolUse("auto", True))),
    "tools required": ConstraintSpec("grammar", tools_grammar([TOOL], ToolUse("required", False))),
}
# For each: an answer it admits, one it refuses.
ANSWERS = {
    "json_schema": ('{"ok": true, "n": 3}', '{"ok": 1'),
    "json_object": ('{"x": [1]}', "[1"),
    "regex": ("no/42", "maybe"),
    "gbnf": ("a12", "b"),
    "lark": ("a 12", "a b"),
    "tools auto": ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "<x"),
    "tools required": ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "Hi"),
}


@pytest.mark.parametrize("kind", SPECS)
def test_without_markers_a_constraint_is_untouched(kind):
    assert constrain_answer(SPECS[kind], None) is SPECS[kind]


def test_format_none_leaves_the_constraint_as_it_was(vocabs):
    work = build_work(vocabs["opens"], 512, Defaults(SamplingParams(), 16, reasoning_format="none"),
                      chat(response_format=FORMAT.model_dump(by_alias=True)))
    assert work.reasoning is None and work.constraint == constraint(FORMAT, None)


@pytest.fixture(scope="module")
def grammar_vocab(vocabs):
    v = vocabs["plain"]
    return v, v.grammar_tokenizer()


def fits(grammar_vocab, spec: ConstraintSpec, text: str, token: int | None = None,
         after: str = "") -> tuple[bool, bool]:
    """Whether the constraint takes all of `text` (then `token`, then `after`), and
    whether it may end there."""
    v, tokenizer = grammar_vocab
    c = Constraint(spec, tokenizer, v.n_vocab)
    ids = tokenizer.tokenize_str(text) + ([token] if token is not None else []) + \
        (tokenizer.tokenize_str(after) if after else [])
    if c.fits(ids) < len(ids):
        return False, False
    c.settle(ids)
    return True, c.complete


@pytest.mark.parametrize("kind", SPECS)
def test_the_answer_is_constrained_after_free_reasoning(grammar_vocab, kind):
    spec = SPECS[kind]
    good, bad = ANSWERS[kind]
    assert fits(grammar_vocab, spec, good) == (True, True)
    assert not fits(grammar_vocab, spec, bad)[1]
    opened = constrain_answer(spec, OPEN)
    free = " Any words { at all } <b> </thin"
    assert fits(grammar_vocab, opened, free) == (True, False)
    assert fits(grammar_vocab, opened, free + "</think>\n\n" + good) == (True, True)
    assert fits(grammar_vocab, opened, free + "</think>" + good) == (True, True)
    assert not fits(grammar_vocab, opened, free + "</think>" + bad)[1]
    assert not fits(grammar_vocab, opened, good)[1]  # still reasoning
    unopened = constrain_answer(spec, THINK)
    assert fits(grammar_vocab, unopened, good) == (True, True)  # no reasoning at all
    assert fits(grammar_vocab, unopened, "<think>" + free + "</think>" + good) == (True, True)


@pytest.mark.parametrize("kind", list(SPECS))
def test_whitespace_then_a_refused_answer_is_refused(grammar_vocab, kind):
    """The split hands over the answer without the whitespace after the close (as
    llama-server does): what follows that whitespace must be an answer the constraint
    admits."""
    opened = constrain_answer(SPECS[kind], OPEN)
    assert not fits(grammar_vocab, opened, "x</think>\n\n" + ANSWERS[kind][1])[1]


def test_the_first_close_ends_the_reasoning(grammar_vocab):
    spec = constrain_answer(SPECS["regex"], OPEN)
    assert fits(grammar_vocab, spec, "a</think>no/1") == (True, True)
    assert not fits(grammar_vocab, spec, "a</think>b</think>no/1")[0]


def test_a_close_that_is_a_special_token(grammar_vocab):
    """Qwen3's `</think>` is one added token, which llguidance reads as special, never as
    text: the grammar names it by id (here the tiny vocabulary's <|im_start|> plays it)."""
    found = Markers("<think>", "<|im_start|>", starts_open=True, tokens=(("<|im_start|>", 3),))
    spec = constrain_answer(SPECS["json_schema"], found)
    assert fits(grammar_vocab, spec, "why not", 3, '{"ok": true, "n": 3}') == (True, True)
    assert not fits(grammar_vocab, spec, "why not", 3, "why")[0]


def test_build_work_wraps_the_request_constraint(vocabs):
    for name, expected in (("opens", OPEN), ("qwen3", THINK)):
        work = build_work(vocabs[name], 512, Defaults(SamplingParams(), 16),
                          chat(response_format=FORMAT.model_dump(by_alias=True)))
        assert work.reasoning == expected
        assert work.constraint == constrain_answer(constraint(FORMAT, None), expected)
    off = build_work(vocabs["qwen3"], 512, Defaults(SamplingParams(), 16),
                     chat(response_format=FORMAT.model_dump(by_alias=True),
                          reasoning_effort="none"))
    assert off.reasoning is None and off.constraint == constraint(FORMAT, None)
    tools = build_work(vocabs["opens"], 512, Defaults(SamplingParams(), 16),
                       chat(tools=[TOOL.model_dump()], tool_choice="required"))
    assert tools.constraint is not None and tools.constraint.text.startswith("start: think")


def test_channels_of_special_tokens(grammar_vocab):
    """gpt-oss's shape: markers of special tokens and text, opened by the model (here
    <|im_start|> plays <|channel|> and <|start|>)."""
    v, tokenizer = grammar_vocab
    found = Markers("<|im_start|>analysis:", "<|im_start|>final:", tokens=(("<|im_start|>", 3),))
    spec = constrain_answer(SPECS["json_schema"], found)
    c = Constraint(spec, tokenizer, v.n_vocab)
    good = ANSWERS["json_schema"][0]
    ids = [3, *tokenizer.tokenize_str("analysis: why not"), 3,
           *tokenizer.tokenize_str("final:" + good)]
    assert c.fits(ids) == len(ids)
    c.settle(ids)
    assert c.complete
    assert fits(grammar_vocab, spec, good) == (True, True)  # no reasoning at all
    assert told(split(found, ["<|im_start|>analysis: why not<|im_start|>final:", good])) == \
        ("why not", good)


# ------------------------------------------------------------------ through the engine


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1)
    yield dec, dec.tokenize("Is it? Think first.")
    dec.close()


# A random model never spells </think> (six tokens here): it writes " ho" often enough.
# The grammar treats every text marker alike (`</think>` itself: the tests above).
HO = Markers("<think>", " ho", starts_open=True)


@pytest.mark.parametrize("found", [HO, replace(HO, starts_open=False)],
                         ids=["opened", "unopened"])
def test_generated_reasoning_then_a_valid_answer(pair, found):
    dec, prompt = pair
    spec = constrain_answer(ConstraintSpec.json_schema(SCHEMA), found)
    answered = 0
    for seed in range(6):
        res = dec.generate(prompt, max_tokens=120, constraint=spec, draft_max=3,
                           sampling=SamplingParams(temperature=1.0, seed=seed))
        reasoning, answer = told(split(found, [res.text]))
        if res.finish_reason == "length":  # still reasoning
            assert answer is None and reasoning and found.close not in res.text
            continue
        assert res.finish_reason == "eos", res.text
        assert answer is not None, res.text
        jsonschema.validate(json.loads(answer), SCHEMA)
        # the text as generated: reasoning, the close, whitespace, the answer
        head, _, tail = res.text.rpartition(found.close)
        assert head.strip().removeprefix(found.open).strip() == (reasoning or "")
        assert tail.strip() == answer
        assert found.starts_open or not head or head.lstrip().startswith(found.open)
        answered += 1
    assert answered >= 3


def test_greedy_speculation_equals_the_target_alone_under_the_wrapped_constraint(pair):
    dec, prompt = pair
    greedy = SamplingParams(temperature=0.0)
    spec = constrain_answer(ConstraintSpec.json_schema(SCHEMA), HO)
    alone = dec.generate(prompt, max_tokens=60, sampling=greedy, constraint=spec, draft_max=0)
    for drafters in ("model", "lookup"):
        both = dec.generate(prompt, max_tokens=60, sampling=greedy, constraint=spec,
                            draft_max=3, drafters=drafters)
        assert both.tokens == alone.tokens, drafters
    assert HO.close in alone.text and alone.finish_reason == "eos"


# ------------------------------------------------------------------ through the server


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    target = tiny_model_factory(seed=0, chat_template=OPENS)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=OPENS)
    s = ServerProcess(["--target", target, "--draft", draft, "--threads", 1, "--n-ctx", 512,
                       "--draft-max", 3, "--max-tokens", 24],
                      tmp_path_factory.mktemp("reasoning"))
    yield s
    s.kill()


def _reasoning(message) -> str | None:
    return (message.model_extra or {}).get("reasoning_content")


def test_the_server_sends_the_reasoning_apart(server):
    client = server.client()
    r = client.chat.completions.create(model=server.model, messages=ASK, temperature=0)
    message = r.choices[0].message
    # a random model never closes its reasoning: all of it is reasoning, cut at max_tokens
    assert _reasoning(message) and not message.content
    assert r.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model=server.model, messages=ASK, temperature=0,
                                            stream=True)
    streamed, content = "", ""
    for chunk in stream:
        if chunk.choices:
            streamed += _reasoning(chunk.choices[0].delta) or ""
            content += chunk.choices[0].delta.content or ""
    assert streamed == _reasoning(message) and not content


def test_the_server_turns_thinking_off(server):
    client = server.client()
    r = client.chat.completions.create(model=server.model, messages=ASK, temperature=0,
                                       reasoning_effort="none")
    assert r.choices[0].message.content and _reasoning(r.choices[0].message) is None


def test_the_server_constrains_only_the_answer(server):
    client = server.client()
    fmt = FORMAT.model_dump(by_alias=True)
    r = client.chat.completions.create(model=server.model, messages=ASK, temperature=0,
                                       response_format=fmt)
    # the schema would have forced '{"ok": ' from the first token: the reasoning is free
    assert _reasoning(r.choices[0].message)
    off = client.chat.completions.create(model=server.model, messages=ASK, temperature=1,
                                         seed=1, response_format=fmt, max_tokens=40,
                                         reasoning_effort="none")
    assert off.choices[0].finish_reason == "stop", off
    jsonschema.validate(json.loads(off.choices[0].message.content), SCHEMA)


def test_reasoning_format_none_leaves_it_in_the_answer(server, tiny_model_factory,
                                                       tmp_path_factory):
    target = tiny_model_factory(seed=0, chat_template=OPENS)
    s = ServerProcess(["--target", target, "--threads", 1, "--n-ctx", 512, "--max-tokens", 24,
                       "--reasoning-format", "none"], tmp_path_factory.mktemp("reasoning-none"))
    try:
        r = s.client().chat.completions.create(model=s.model, messages=ASK, temperature=0)
    finally:
        s.kill()
    split_off = server.client().chat.completions.create(model=server.model, messages=ASK,
                                                        temperature=0)
    message = r.choices[0].message
    assert _reasoning(message) is None
    # the same text (greedy, the same target), the whitespace around the reasoning aside
    assert message.content.strip() == _reasoning(split_off.choices[0].message)
