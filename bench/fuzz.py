"""A property-based fuzzer of `specllama serve`'s HTTP API, on hypothesis.

Requests are drawn from strategies that follow the request models of
specllama/server/schema.py: well-formed chat and plain completions (roles, content
parts, earlier tool calls, tools and tool_choice, response_format with JSON schemas valid
and not, stop strings, logprobs, every sampling field at its edges: a temperature of
1e-38, a seed of 2**64; streams with and without usage); near-well-formed ones (such a
body with one value replaced by a wrong type, a number out of range or of 5,000 digits,
NaN, a deep nesting, or a field taken out, an unsupported field added, another model);
garbage (bytes that are not UTF-8, JSON that is not an object, bodies cut short, nested
100,000 deep, over the 4 MiB limit, sent as text/plain); and GETs of /v1/models, /health,
/metrics, unknown paths and wrong methods. Every answer must keep the API's promises:

- no 5xx but the documented 503s (queue full, engine down, shutting down), each with
  a Retry-After;
- every error OpenAI-shaped: {"error": {"message": str, "type": str, "param": str|null,
  "code": str|null}} (schema.APIError.body);
- a 200 is JSON of its endpoint's object; a stream, read to its end, is server-sent events
  that end with `data: [DONE]` or an error event, each event a chunk or, last, an error
  whose type is not server_error (but a 503's); output under a JSON response_format
  begins as JSON does, and is JSON when it stopped on its own (no stop string);
- no traceback in the server's log, and after the run a plain request and a stream still
  get 200 and /health says ok.

The search draws `--examples` requests and fails on none (hypothesis stops drawing soon
after a first failure). Then each kind of failure found (the status, the path and the
exception the server answered or logged) is shrunk by hypothesis to a minimal request:
it draws the same requests again from the same seed, this time failing on them.

    python -m bench.fuzz --examples 2000                     # the default pair, smollm2
    python -m bench.fuzz --target t.gguf --draft d.gguf --examples 300 --seed 1
    python -m bench.fuzz --url http://127.0.0.1:8080 --examples 500   # a server running

It starts `specllama serve` on a loopback port (`--serve-args` for more flags) and stops it
at the end; with `--url` it fuzzes that server instead (without its log, so a 500 is named
by its answer only). Nothing is written outside a temporary folder (no example database;
hypothesis' caches in a temporary home) but `--json FILE`. Exit status 1 when a failure
was found. tests/test_fuzz.py runs a bounded run on the tiny models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

# ------------------------------------------------------------------------------ bodies


@dataclass(frozen=True, repr=False)
class Raw:
    """JSON text put into a body as it is: what json.dumps cannot write (a number of
    5,000 digits, NaN's cousins, nesting deeper than Python's recursion)."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({shorten(self.text.encode())})"


def encode(value: Any) -> bytes:
    """`value` as JSON in UTF-8 (not ASCII-escaped), its Raw parts spliced in."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"', raw, 1)
    return text.encode("utf-8")


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    kind: str = "other"  # what it was drawn as: counted by kind in the report

    def __repr__(self) -> str:
        head = f"{self.method} {self.path}"
        if self.content_type != "application/json":
            head += f" [content-type: {self.content_type}]"
        return head if self.body is None else f"{head} {shorten(self.body)}"

    @property
    def json(self) -> Any:
        """The body as JSON, None when it is not."""
        try:
            return json.loads(self.body or b"")
        except (ValueError, RecursionError):
            return None


_RUN = re.compile(r"(.{1,4}?)\1{15,}", re.DOTALL)


def shorten(data: bytes, limit: int = 4000) -> str:
    """A body for a reader: runs of a few characters written once with their count,
    bytes that are not UTF-8 as escapes."""
    text = data.decode("utf-8", "backslashreplace")
    text = _RUN.sub(lambda m: f"«{m.group(1)!r} × {len(m.group(0)) // len(m.group(1))}»",
                    text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(data)} bytes)"


# ------------------------------------------------------------------------- strategies

ROLES = ["system", "developer", "user", "assistant", "tool"]
SPECIAL_TEXT = [
    "", " ", "Hello world", "<|im_start|>", "<|im_end|>", "</s>", "<s>", "<tool_call>\n",
    "\n</tool_call>", "<tool_response>", "{{ messages }}", "{% for x in y %}", "\x00",
    "\u202e\u0301", "😀😀😀", "\r\n\t", "ǅﬃ\ufeff", "\U0010fffd",
]
TOOL_NAMES = ["get_weather", "f", "lookup-2"]
FIELD_NAMES = ["a", "city", "n", "", "ключ", "$ref"]
# Deep nestings: within Python's recursion limit, about at it, past it.
DEPTHS = [30, 400, 990, 5000, 100_000]
# Values of a field with a wrong type, out of its range or past what Python reads.
WEIRD = [
    None, True, False, 0, -1, -0.0, 1e-38, 5e-324, -1e-38, 1e308, 2**31, 2**63, 2**64,
    10**30, -(2**63), 1.5, "", "0.5", "1e-38", "NaN", "nan", "Infinity", "-1", "true", "null",
    [], {}, [None], {"": None}, "\x00", math.nan, math.inf, -math.inf, Raw("1e999999"),
    Raw('"\\ud800"'), Raw('"\\udfff\\ud800"'),
]
# JSON schemas that are not, or that no document meets, or that strain a compiler.
ODD_SCHEMAS: list[Any] = [
    {"type": "nonsense"}, {"type": 5}, {"$ref": "#/$defs/missing"},
    {"type": "object", "required": "x"}, {"type": "string", "pattern": "("},
    {"type": "string", "minLength": 5, "maxLength": 2}, {"enum": []}, {"anyOf": []},
    {"allOf": [{"type": "string"}, {"type": "integer"}]}, {"not": {}},
    {"type": "integer", "minimum": Raw("1e400")}, {"type": "integer", "maximum": 10**30},
    {"type": "array", "minItems": Raw("1" + "0" * 30)}, {"type": "string", "pattern": "a{1000}"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},
    {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
    {"type": "string", "format": "date-time"}, {"const": 10**30}, {"type": ["string", "null"]},
    {"x-guidance": {"whitespace_flexible": "yes"}}, [], "object", None, True,
]


T = TypeVar("T")
_ABSENT = object()  # a field left out
# How often an optional field is left out and sent: (left out, sent), as weights.
MOSTLY, OFTEN, SELDOM = (1, 3), (1, 1), (3, 1)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each drawn about `weight` times in sum(weights) (one_of
    draws its branches as it likes); shrinking goes to the first."""
    picks = [i for i, (weight, _) in enumerate(choices) for _ in range(weight)]
    return st.sampled_from(picks).flatmap(lambda i: choices[i][1])


def lazily(*makers: Callable[[], T]) -> st.SearchStrategy[T]:
    """One of these values, made when drawn: large ones kept out of the strategies' reprs
    (hypothesis writes them)."""
    return st.sampled_from(makers).map(lambda make: make())


def texts(max_size: int = 30) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size) | st.sampled_from(SPECIAL_TEXT)


def prompts() -> st.SearchStrategy[str]:
    """A message's or a prompt's text: now and then longer than the context (made when
    drawn: hypothesis writes the strategies' reprs)."""
    return st.text(max_size=30) | st.sampled_from([*SPECIAL_TEXT, None]).map(
        lambda t: "word " * 9000 if t is None else t)


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    scalars = (st.none() | st.booleans() | st.integers(-10**20, 10**20)
               | st.floats(allow_nan=False, allow_infinity=False) | texts(12))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(texts(8), inner, max_size=3), max_leaves=max_leaves)


def deep_json(depth: int, kind: str) -> str:
    """JSON nested `depth` levels: arrays, or objects under the key "a"."""
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def deep_values() -> st.SearchStrategy[Raw]:
    return st.builds(lambda d, k: Raw(deep_json(d, k)), st.sampled_from(DEPTHS),
                     st.sampled_from(["[", "{"]))


def long_numbers() -> st.SearchStrategy[Raw]:
    """Numbers past Python's 4,300 digits, and a float that rounds to 0."""
    return lazily(lambda: Raw("1" * 5000), lambda: Raw("-" + "9" * 5000),
                  lambda: Raw("0." + "0" * 5000 + "1"))


def weird_values() -> st.SearchStrategy[Any]:
    return st.sampled_from(WEIRD) | json_values() | deep_values() | long_numbers()


def valid_schemas() -> st.SearchStrategy[Any]:
    leaves = st.sampled_from([
        {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
        {"type": "null"}, {}, {"type": "string", "pattern": "^[a-z]+$"},
    ]) | st.builds(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 5},
                   st.integers(-100, 100)) \
        | st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)) \
        | st.lists(json_values(2), min_size=1, max_size=3).map(lambda xs: {"enum": xs}) \
        | json_values(2).map(lambda x: {"const": x})

    def nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        arrays = st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n},
                           inner, st.integers(0, 3))
        objects = st.builds(
            lambda props, strict: {"type": "object", "properties": props,
                                   "required": sorted(props)[:1],
                                   "additionalProperties": not strict},
            st.dictionaries(st.sampled_from(FIELD_NAMES), inner, max_size=3), st.booleans())
        return arrays | objects | st.lists(inner, min_size=1, max_size=2).map(
            lambda xs: {"anyOf": xs})

    return st.recursive(leaves, nested, max_leaves=5)


def schemas() -> st.SearchStrategy[Any]:
    """Valid JSON schemas mostly; odd ones, deep ones and any JSON now and then."""
    deep = st.builds(lambda d: Raw('{"type":"array","items":' * d + "{}" + "}" * d),
                     st.sampled_from(DEPTHS))
    return weighted((4, valid_schemas()), (1, st.sampled_from(ODD_SCHEMAS)), (1, deep),
                    (1, json_values(4)))


def arguments() -> st.SearchStrategy[str]:
    """An earlier call's `arguments`: JSON text as OpenAI sends it, or not."""
    special = st.sampled_from(["", "{", "null", "{}", "1e999", "NaN", '"\\ud800"',
                               '{"a": 1, "a": 2}']) | lazily(lambda: "1" * 5000,
                                                             lambda: "-" + "9" * 4301)
    deep = st.builds(deep_json, st.sampled_from(DEPTHS), st.sampled_from(["[", "{"]))
    return weighted((3, st.dictionaries(texts(8), json_values(), max_size=3).map(json.dumps)),
                    (1, texts()), (1, special), (1, deep))


def tool_names() -> st.SearchStrategy[str]:
    return st.sampled_from(TOOL_NAMES) | st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


def tool_calls() -> st.SearchStrategy[dict[str, Any]]:
    function = st.fixed_dictionaries({"name": weighted((3, tool_names()), (1, texts(10))),
                                      "arguments": arguments()})
    return body_of({"id": texts(10), "function": function},
                   {"type": (OFTEN, st.just("function"))})


def messages() -> st.SearchStrategy[dict[str, Any]]:
    parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": prompts()}),
                     max_size=3)
    return body_of(
        {"role": st.sampled_from(ROLES)},
        {"content": (MOSTLY, weighted((1, st.none()), (4, prompts()), (1, parts))),
         "tool_calls": (SELDOM, st.lists(tool_calls(), min_size=1, max_size=2)),
         "tool_call_id": (SELDOM, texts(10)), "name": (SELDOM, texts(10))})


def object_schemas() -> st.SearchStrategy[dict[str, Any]]:
    """What a tool's parameters usually are: an object of named properties."""
    return st.builds(lambda props, n: {"type": "object", "properties": props,
                                       "required": sorted(props)[:n]},
                     st.dictionaries(st.sampled_from(FIELD_NAMES), valid_schemas(), max_size=3),
                     st.integers(0, 3))


def tools() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Tools with distinct names, or one tool twice."""
    function = st.fixed_dictionaries(
        {"name": tool_names()},
        optional={"description": texts(), "parameters": object_schemas() | schemas(),
                  "strict": st.booleans()})
    tool: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
        {"type": st.just("function"), "function": function})
    return weighted((4, st.lists(tool, min_size=1, max_size=3,
                                 unique_by=lambda t: t["function"]["name"])),
                    (1, tool.map(lambda t: [t, t])))


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@st.composite
def tools_and_choice(draw: st.DrawFn) -> tuple[list[dict[str, Any]], Any]:
    """Tools, and a tool_choice (or _ABSENT) that names one of them more often than not."""
    listed = draw(tools())
    names = [t["function"]["name"] for t in listed]
    choice = draw(weighted(
        (3, st.just(_ABSENT)), (2, st.sampled_from(["none", "auto", "required"])),
        (2, st.sampled_from(names).map(_named) if names else st.just(_ABSENT)),
        (1, tool_names().map(_named))))
    return listed, choice


def response_formats() -> st.SearchStrategy[dict[str, Any]]:
    json_schema = st.fixed_dictionaries({"schema": schemas()}, optional={
        "name": texts(10), "strict": st.booleans()})
    return weighted((1, st.just({"type": "text"})), (2, st.just({"type": "json_object"})),
                    (3, st.fixed_dictionaries({"type": st.just("json_schema"),
                                               "json_schema": json_schema})))


def unit(low_open: bool) -> st.SearchStrategy[float]:
    """A probability, the extremes likelier than uniform draws would make them."""
    edges = [1.0, 0.5] if low_open else [0.0, 1.0]
    return st.sampled_from([1e-38, 5e-324]) | st.sampled_from(edges) | st.floats(
        0, 1, exclude_min=low_open)


def body_of(required: dict[str, st.SearchStrategy[Any]],
            optional: dict[str, tuple[tuple[int, int], st.SearchStrategy[Any]]],
            ) -> st.SearchStrategy[Any]:
    """Dictionaries with the `required` keys and some of the `optional` ones, each
    ((out, sent), strategy): left out and sent in the ratio out:sent; shrinking leaves it
    out."""
    fields = {**required, **{k: weighted((out, st.just(_ABSENT)), (sent, s))
                             for k, ((out, sent), s) in optional.items()}}
    return st.fixed_dictionaries(fields).map(
        lambda d: {k: v for k, v in d.items() if v is not _ABSENT})


def sampling_fields() -> dict[str, tuple[tuple[int, int], st.SearchStrategy[Any]]]:
    """The optional fields of every generation request (schema._Request)."""
    return {
        # tiny temperatures on their own: 1/T overflows
        "temperature": (OFTEN, st.sampled_from([1e-38, 5e-324, 1e-30])
                        | st.sampled_from([0, 0.8, 2, 1e-6]) | st.floats(0, 2)),
        "top_p": (SELDOM, unit(low_open=True)),
        "top_k": (SELDOM, st.sampled_from([0, 1, 2**31, 2**63]) | st.integers(0, 100_000)),
        "min_p": (SELDOM, unit(low_open=False)),
        "seed": (OFTEN, st.sampled_from([0, 2**32, 2**63, 2**64, 10**30])
                 | st.integers(0, 2**64)),
        "stop": (SELDOM, texts(8) | st.lists(texts(8), max_size=4)),
        "stream": (OFTEN, st.sampled_from([True, True, False])),
        "stream_options": (SELDOM, st.fixed_dictionaries(
            {}, optional={"include_usage": st.booleans()})),
        "n": (SELDOM, st.just(1)),
        "response_format": (OFTEN, response_formats()),
        "user": (SELDOM, texts(10)),
        # OpenAI's fields that specllama refuses unless they hold their no-op value (which
        # the near-well-formed requests change)
        "logit_bias": (SELDOM, st.just({})),
        "presence_penalty": (SELDOM, st.sampled_from([0, 0.0])),
        "frequency_penalty": (SELDOM, st.just(0)),
    }


def chat_bodies(model: str, max_tokens: int) -> st.SearchStrategy[dict[str, Any]]:
    return body_of(
        {"model": st.just(model), "messages": st.lists(messages(), min_size=1, max_size=4),
         "max_tokens": st.integers(1, max_tokens)},
        {**sampling_fields(), "max_completion_tokens": (SELDOM, st.integers(1, max_tokens)),
         "logprobs": (OFTEN, st.tuples(st.booleans(), weighted(
             (1, st.just(_ABSENT)), (1, st.integers(0, 20))))),
         "tools": (OFTEN, tools_and_choice()),
         "parallel_tool_calls": (SELDOM, st.booleans()),
         "function_call": (SELDOM, st.sampled_from(["none", "auto"]))}).map(_pairs)


def _pairs(body: dict[str, Any]) -> dict[str, Any]:
    """"tools": (tools, tool_choice) and "logprobs": (logprobs, top_logprobs) as two
    fields each (the second may be _ABSENT): drawn together, so that they agree more often
    than not."""
    body = {**body}
    for key, second in (("tools", "tool_choice"), ("logprobs", "top_logprobs")):
        if key in body:
            body[key], value = body[key]
            if value is not _ABSENT:
                body[second] = value
    return body


def completion_bodies(model: str, max_tokens: int) -> st.SearchStrategy[dict[str, Any]]:
    return body_of(
        {"model": st.just(model),
         "prompt": prompts() | st.lists(prompts(), min_size=1, max_size=1),
         "max_tokens": st.integers(1, max_tokens)},
        {**sampling_fields(), "logprobs": (OFTEN, st.integers(0, 5)),
         "echo": (SELDOM, st.just(False)), "suffix": (SELDOM, st.just("")),
         "best_of": (SELDOM, st.just(1))})


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# OpenAI's fields that specllama refuses, with values that do something (schema.UNSUPPORTED)
UNSUPPORTED: dict[str, list[Any]] = {
    "logit_bias": [{"50256": -100}, {"1": 1e-38}], "presence_penalty": [0.5],
    "frequency_penalty": [-2.0], "best_of": [2], "echo": [True], "suffix": ["x"],
    "functions": [[{"name": "f"}]], "function_call": [{"name": "f"}], "audio": [{}],
    "modalities": [["text", "audio"]], "prediction": [{"type": "content", "content": "x"}],
}


def _post(path: str, body: dict[str, Any], kind: str) -> FuzzRequest:
    stream = " stream" if body.get("stream") is True else ""
    return FuzzRequest("POST", path, encode(body), kind=kind + stream)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a body (keys and indices from the top), the top itself left out."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append((*prefix, key))
        out += _paths(item, (*prefix, key))
    return out


def _changed(body: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    """A copy of `body` with the value at `path` replaced (or taken out)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(body, dict):
        copy: Any = dict(body)
    else:
        copy = list(body)
    if not rest and delete:
        del copy[head]
    else:
        copy[head] = _changed(copy[head], rest, value, delete)
    return copy


@st.composite
def near_requests(draw: st.DrawFn, model: str, max_tokens: int) -> FuzzRequest:
    """A well-formed body with one thing wrong: a value replaced, a field taken out, an
    unknown or unsupported field added, or another model named."""
    chat = draw(st.booleans())
    body = draw(chat_bodies(model, max_tokens) if chat else completion_bodies(model, max_tokens))
    how = draw(st.sampled_from(["replace", "delete", "add", "model"]))
    if how == "add":
        name = draw(st.sampled_from(sorted(UNSUPPORTED)) | texts(10))
        values = weird_values()
        if name in UNSUPPORTED:
            values = st.sampled_from(UNSUPPORTED[name]) | values
        body = {**body, name: draw(values)}
    elif how == "model":
        body = {**body, "model": draw(st.sampled_from(["", model + " ", "gpt-4o"]) | texts())}
    else:
        path = draw(st.sampled_from(_paths(body)))
        delete = how == "delete" and isinstance(_at(body, path[:-1]), dict)
        body = _changed(body, path, None if delete else draw(weird_values()), delete)
    return _post(CHAT if chat else COMPLETIONS, body, "near chat" if chat else "near completion")


def _at(body: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


GARBAGE = [
    b"", b"{", b"null", b"[]", b"1", b'"x"', b"true", b"[{}]", b"{}", b'{"model": "\xff\xfe"}',
    b"\xef\xbb\xbf{}", b"\x00" * 8, b"NaN", b"-Infinity", b'{"model": "m", "model": 1}',
    b'{"messages": "\\ud800"}', b"\xc0\x80",
]
BIG_GARBAGE = lazily(
    lambda: b"{" + b" " * 10_000 + b"}", lambda: b"[" * 100_000, lambda: b'{"a":' * 100_000,
    lambda: b'{"seed": ' + b"9" * 5000 + b"}",
    lambda: b"[" + b"1," * 1_500_000 + b"1]",  # over 4 MiB: 413
)


@st.composite
def garbage_requests(draw: st.DrawFn, model: str, max_tokens: int) -> FuzzRequest:
    """Bodies that are not a request: not UTF-8, not JSON, not an object, cut short."""
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    whole = draw(st.booleans())
    if whole:
        body = draw(st.sampled_from(GARBAGE) | BIG_GARBAGE | st.binary(max_size=64)
                    | st.text(max_size=64).map(lambda t: t.encode()))
    else:  # a well-formed body cut short
        full = encode(draw(chat_bodies(model, max_tokens) if path == CHAT
                           else completion_bodies(model, max_tokens)))
        body = full[:draw(st.integers(0, max(0, len(full) - 1)))]
    ctype = "application/json" if draw(st.booleans()) else draw(st.sampled_from(
        ["text/plain", None, "application/x-www-form-urlencoded", "application/json; x=1"]))
    return FuzzRequest("POST", path, body, ctype, kind="garbage")


@st.composite
def other_requests(draw: st.DrawFn, model: str) -> FuzzRequest:
    """GETs of the other endpoints; unknown paths; wrong methods."""
    path = draw(st.sampled_from([
        "/health", "/metrics", "/v1/models", f"/v1/models/{model}", "/v1/models/nope",
        "/v1/models/%00", "/v1/models/%ff", "/v1", "/", CHAT, COMPLETIONS, "/docs",
        "/v1/embeddings",
    ]) | lazily(lambda: "/v1/models/" + "a" * 5000)
                | texts(20).map(lambda t: "/v1/models/" + urllib.parse.quote(t, safe="")))
    method = draw(st.sampled_from(["GET", "GET", "POST", "DELETE", "PUT", "OPTIONS", "HEAD"]))
    body = b"{}" if method in ("POST", "PUT") else None
    return FuzzRequest(method, path, body, kind="other")


def requests(model: str, max_tokens: int = 8) -> st.SearchStrategy[FuzzRequest]:
    """Any request the fuzzer sends; `max_tokens`: the most a well-formed one asks for."""
    chat = chat_bodies(model, max_tokens).map(lambda b: _post(CHAT, b, "chat"))
    completion = completion_bodies(model, max_tokens).map(
        lambda b: _post(COMPLETIONS, b, "completion"))
    return st.one_of(chat, completion, near_requests(model, max_tokens),
                     garbage_requests(model, max_tokens), other_requests(model))


# ----------------------------------------------------------------------------- answers

#: The documented 503s' codes (queue full, engine down, shutting down)
RETRY_CODES = {"queue_full", "engine_unavailable", "shutting_down"}
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b")


@dataclass
class Outcome:
    status: int | None = None  # None: no answer (error says why)
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""  # the body (not a stream's)
    events: list[str] | None = None  # a stream's `data:` payloads
    error: str | None = None
    log: list[str] = field(default_factory=list)  # the server's log lines meanwhile
    seconds: float = 0.0

    def describe(self, limit: int = 1500) -> str:
        if self.status is None:
            return f"no answer: {self.error}"
        head = f"{self.status}"
        if "retry-after" in self.headers:
            head += f" (Retry-After: {self.headers['retry-after']})"
        if self.events is not None:
            body = "\n".join(f"data: {e}" for e in self.events[-4:])
            if len(self.events) > 4:
                body = f"({len(self.events) - 4} events before)\n{body}"
            if self.error:
                body += f"\n(then: {self.error})"
        else:
            body = self.text
        body = body if len(body) <= limit else body[:limit] + "..."
        logged = "".join(f"\n  server log: {line.rstrip()}" for line in self.log[-3:])
        return f"{head} {body}{logged}"


@dataclass(frozen=True)
class Problem:
    signature: str  # one per kind of failure: what hypothesis shrinks separately
    detail: str


def error_shape(body: Any) -> str | None:
    """What is wrong with an error body; None: it is OpenAI's shape (APIError.body)."""
    if not isinstance(body, dict) or list(body) != ["error"] or not isinstance(
            body["error"], dict):
        return "the body is not {'error': {...}}"
    err = body["error"]
    if set(err) != {"message", "type", "param", "code"}:
        return f"the error's keys are {sorted(err)}, not message, type, param, code"
    if not isinstance(err["message"], str) or not err["message"]:
        return "error.message is not a string"
    if not isinstance(err["type"], str) or not err["type"]:
        return "error.type is not a string"
    for key in ("param", "code"):
        if err[key] is not None and not isinstance(err[key], str):
            return f"error.{key} is neither a string nor null"
    return None


def _which(*texts: str) -> str:
    """The exception a message or log line names, the first found ('' when none)."""
    for text in texts:
        found = _EXCEPTION.search(text)
        if found:
            return found.group(1)
    return ""


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _server_error(req: FuzzRequest, out: Outcome, body: Any) -> Problem | None:
    """A 5xx that is not a documented 503 with Retry-After."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    if out.status == 503 and out.headers.get("retry-after", "").isdigit() and \
            err.get("code") in RETRY_CODES:
        return None
    message = str(err.get("message", out.text))
    cause = _which(message, *reversed(out.log)) or re.sub(r"\d+", "N", message)[:80]
    return Problem(f"{out.status} on {req.method} {req.path}: {cause}",
                   f"{out.status} where no 5xx but a documented 503 is allowed")


def check(req: FuzzRequest, out: Outcome) -> list[Problem]:
    """What an answer breaks of the API's promises (empty: none)."""
    where = f"{req.method} {req.path}"
    if out.status is None:
        return [Problem(f"no answer to {where}: {(out.error or '').split(':')[0]}",
                        out.error or "")]
    if out.events is not None:
        return _check_stream(req, out)
    body = _json(out.text)
    problems = []
    if out.status >= 500:
        problems.append(_server_error(req, out, body))
    if out.status >= 400 and req.method != "HEAD":
        wrong = error_shape(body)
        if wrong:
            problems.append(Problem(f"{out.status} on {where}: not OpenAI's error shape",
                                    wrong))
    if out.status == 200:
        sent = req.json
        if isinstance(sent, dict) and sent.get("stream") is True and req.path in _OBJECTS:
            problems.append(Problem(f"200 on {where}: JSON for a stream", out.text[:200]))
        else:
            problems.append(_check_success(req, body, out.text))
    return [p for p in problems if p is not None]


_OBJECTS = {CHAT: "chat.completion", COMPLETIONS: "text_completion"}


def _check_success(req: FuzzRequest, body: Any, text: str) -> Problem | None:
    where = f"{req.method} {req.path}"
    if req.method == "HEAD" or req.path not in (CHAT, COMPLETIONS, "/health", "/v1/models"):
        return None
    if req.path == "/health":
        ok = isinstance(body, dict) and body.get("status") == "ok"
        return None if ok else Problem(f"200 on {where}: not ok", text[:200])
    if req.path == "/v1/models":
        ok = isinstance(body, dict) and body.get("object") == "list"
        return None if ok else Problem(f"200 on {where}: not a list", text[:200])
    if not isinstance(body, dict) or body.get("object") != _OBJECTS[req.path] or \
            not isinstance(body.get("choices"), list) or len(body["choices"]) != 1:
        return Problem(f"200 on {where}: not a {_OBJECTS[req.path]}", text[:300])
    choice = body["choices"][0]
    output = choice.get("message", {}).get("content") if req.path == CHAT else choice.get("text")
    return _check_constrained(req, choice.get("finish_reason"), output,
                              bool(req.path == CHAT and choice["message"].get("tool_calls")))


def _check_constrained(req: FuzzRequest, finish: Any, output: Any,
                       called: bool) -> Problem | None:
    """Output under a JSON response_format (and no tool call) begins as JSON does (an
    object for json_object), and when it ended on its own (not at max_tokens nor at a
    stop string) it is a whole JSON document."""
    sent = req.json
    fmt = sent.get("response_format") if isinstance(sent, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema") \
            or called or not isinstance(output, str):
        return None
    text = output.lstrip()
    starts = "{" if fmt["type"] == "json_object" else '{["-0123456789tfn'
    whole = finish != "stop" or sent.get("stop") or (
        _json(output) is not None or text.rstrip() == "null") and (
        fmt["type"] != "json_object" or isinstance(_json(output), dict))
    if text and text[0] not in starts or not whole:
        return Problem(f"200 on {req.method} {req.path}: response_format "
                       f"{fmt['type']} not followed", f"output {output!r} ({finish})")
    return None


def _check_stream(req: FuzzRequest, out: Outcome) -> list[Problem]:
    where = f"{req.method} {req.path}"
    events = out.events or []
    if out.status != 200:
        return [Problem(f"{out.status} on {where}: a stream", "an error status as a stream")]
    if out.error is not None:
        return [Problem(f"stream cut on {where}: {out.error.split(':')[0]}", out.error)]
    # The end: [DONE] (after an error event, if any), or the error event itself.
    last = _json(events[-1]) if events else None
    if not events or events[-1] != "[DONE]" and not (isinstance(last, dict) and "error" in last):
        return [Problem(f"stream on {where} without [DONE]", f"{len(events)} events")]
    chunks = [_json(e) for e in (events[:-1] if events[-1] == "[DONE]" else events)]
    for i, chunk in enumerate(chunks):
        if isinstance(chunk, dict) and "error" in chunk:
            wrong = error_shape(chunk)
            if wrong:
                return [Problem(f"stream on {where}: an error event not OpenAI-shaped", wrong)]
            if i != len(chunks) - 1:
                return [Problem(f"stream on {where}: events after an error", events[i])]
            err = chunk["error"]
            if err["type"] == "server_error" and err["code"] not in RETRY_CODES:
                return [Problem(f"stream on {where}: server_error event: "
                                f"{_which(err['message'], *reversed(out.log))}",
                                err["message"])]
        elif not isinstance(chunk, dict) or chunk.get("object") != _OBJECTS[req.path] + (
                ".chunk" if req.path == CHAT else ""):
            return [Problem(f"stream on {where}: an event that is not a chunk", events[i][:200])]
    return _stream_output(req, [c for c in chunks if isinstance(c, dict) and "error" not in c])


def _stream_output(req: FuzzRequest, chunks: list[dict[str, Any]]) -> list[Problem]:
    text, finish, called = [], None, False
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta", {}) if req.path == CHAT else {"content": choice.get(
                "text")}
            text.append(delta.get("content") or "")
            called = called or bool(delta.get("tool_calls"))
            finish = choice.get("finish_reason") or finish
    problem = _check_constrained(req, finish, "".join(text), called)
    return [problem] if problem else []


# ----------------------------------------------------------------------------- driver


class Target:
    """A running server: where to send, its model id, and (when we started it) its log
    lines as they come, to name the exception behind a 500."""

    def __init__(self, url: str, model: str, log: Sequence[str] | None = None,
                 timeout: float = 60, api_key: str | None = None) -> None:
        self.url, self.model, self.log = url.rstrip("/"), model, log
        self.http = httpx.Client(timeout=timeout, headers={"authorization": f"Bearer {api_key}"}
                                 if api_key else None)

    def _since(self, start: int, wait: bool) -> list[str]:
        if self.log is None:
            return []
        deadline = time.monotonic() + (1.0 if wait else 0)
        while True:
            lines = list(self.log[start:])
            if any(_EXCEPTION.search(line) for line in lines) or time.monotonic() >= deadline:
                return lines
            time.sleep(0.02)

    def send(self, req: FuzzRequest) -> Outcome:
        start = len(self.log) if self.log is not None else 0
        headers = {"content-type": req.content_type} if req.content_type else {}
        out = Outcome()
        t0 = time.perf_counter()
        try:
            with self.http.stream(req.method, self.url + req.path, content=req.body,
                                  headers=headers) as r:
                out.status, out.headers = r.status_code, dict(r.headers)
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    out.events = []
                    for line in r.iter_lines():
                        if line.startswith("data:"):
                            out.events.append(line[5:].removeprefix(" "))
                else:
                    out.text = r.read().decode("utf-8", "replace")
        except httpx.HTTPError as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        out.seconds = time.perf_counter() - t0
        suspect = out.status is None or out.status >= 500 or out.error is not None or bool(
            out.events and any('"server_error"' in e for e in out.events))
        out.log = self._since(start, suspect)
        return out

    def close(self) -> None:
        self.http.close()


class FuzzFailure(AssertionError):
    """A broken promise. Each signature gets its own subclass, so that hypothesis shrinks
    and reports each kind of failure on its own (it tells them apart by type)."""


_KINDS: dict[str, type[FuzzFailure]] = {}


def failure_of(problem: Problem) -> type[FuzzFailure]:
    if problem.signature not in _KINDS:
        name = "Fuzz_" + re.sub(r"\W+", "_", problem.signature)[:60]
        _KINDS[problem.signature] = type(name, (FuzzFailure,), {})
    return _KINDS[problem.signature]


@dataclass
class Found:
    signature: str
    detail: str
    request: FuzzRequest  # the smallest that failed this way
    outcome: Outcome
    seen: int = 0  # examples that failed this way
    shrunk: bool = False  # by hypothesis (else: the smallest of those seen)


@dataclass
class Report:
    examples: int  # asked for
    seed: int
    requests: int = 0  # the examples sent
    shrink_requests: int = 0  # sent while shrinking
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, status)
    errors: Counter[str] = field(default_factory=Counter)  # "kind, status: message" (N: digits)
    served: Counter[str] = field(default_factory=Counter)  # what the 200s' requests used
    found: dict[str, Found] = field(default_factory=dict)
    after: list[str] = field(default_factory=list)  # the checks after the run
    tracebacks: list[str] = field(default_factory=list)  # from the server's log
    hypothesis: list[str] = field(default_factory=list)  # what its shrinking runs raised
    seconds: float = 0.0
    shrink_seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.found or self.after or self.tracebacks)

    def record(self, req: FuzzRequest, out: Outcome, problems: list[Problem]) -> None:
        """An example of the search: counted, its problems kept."""
        self.requests += 1
        self.statuses[req.kind, str(out.status) if out.status else "none"] += 1
        if out.status == 200:
            self.served.update(features(req))
        if out.status and out.status >= 400:
            body = _json(out.text)
            err = body.get("error") if isinstance(body, dict) else None
            message = err.get("message") if isinstance(err, dict) else out.text
            text = re.sub(r"[0-9]+", "N", str(message))[:80]
            self.errors[f"{req.kind}, {out.status}: {text}"] += 1
        for p in problems:
            self.keep(req, out, p).seen += 1

    def keep(self, req: FuzzRequest, out: Outcome, p: Problem, shrunk: bool = False) -> Found:
        old = self.found.get(p.signature)
        if old is None or _size(req) < _size(old.request):
            self.found[p.signature] = Found(p.signature, p.detail, req, out,
                                            old.seen if old else 0)
        found = self.found[p.signature]
        found.shrunk = found.shrunk or shrunk
        return found

    def lines(self) -> list[str]:
        kinds = sorted({k for k, _ in self.statuses})
        codes = sorted({s for _, s in self.statuses})
        out = [f"{self.requests} examples (seed {self.seed}) in {self.seconds:.1f} s"
               + (f"; then {self.shrink_requests} requests in {self.shrink_seconds:.1f} s "
                  "shrinking the failures" if self.shrink_requests else ""), "",
               "statuses by request kind:", "  " + "kind".ljust(24) + "".join(
                   c.rjust(6) for c in codes)]
        for k in kinds:
            out.append("  " + k.ljust(24) + "".join(
                str(self.statuses[k, c] or "").rjust(6) for c in codes))
        out += ["", "answered 200 with: " + (", ".join(
            f"{k} {n}" for k, n in sorted(self.served.items())) or "nothing")]
        out += ["", "the most frequent errors:"]
        out += [f"  {n:5d}  {e}" for e, n in self.errors.most_common(15)]
        out.append("")
        if not self.failed:
            return [*out, "no failure: every answer kept the API's promises"]
        out.append(f"{len(self.found)} kinds of failure, each with its smallest request:")
        for i, f in enumerate(sorted(self.found.values(), key=lambda f: f.signature), 1):
            how = "shrunk by hypothesis" if f.shrunk else "the smallest seen, not shrunk"
            out += [f"{i}. {f.signature}  ({f.seen} of the examples; {how})",
                    f"   problem: {f.detail[:300]}",
                    f"   request: {f.request!r}",
                    f"   answer:  {f.outcome.describe()}"]
        out += [f"after the run: {a}" for a in self.after]
        out += [f"traceback in the server's log:\n{t}" for t in self.tracebacks]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples, "seed": self.seed, "requests": self.requests,
            "shrink_requests": self.shrink_requests, "seconds": round(self.seconds, 1),
            "shrink_seconds": round(self.shrink_seconds, 1),
            "statuses": {f"{k} {s}": n for (k, s), n in sorted(self.statuses.items())},
            "errors": dict(self.errors.most_common()), "served": dict(self.served),
            "failures": [{"signature": f.signature, "detail": f.detail, "seen": f.seen,
                          "shrunk": f.shrunk,
                          "request": {"method": f.request.method, "path": f.request.path,
                                      "content_type": f.request.content_type,
                                      "body": None if f.request.body is None else
                                      f.request.body.decode("utf-8", "backslashreplace")},
                          "answer": f.outcome.describe(limit=10_000)}
                         for f in self.found.values()],
            "after": self.after, "tracebacks": self.tracebacks, "hypothesis": self.hypothesis,
        }


def features(req: FuzzRequest) -> set[str]:
    """What of the API a request uses: streams, tools, earlier calls, response_format."""
    body = req.json if req.path in (CHAT, COMPLETIONS) else None
    if not isinstance(body, dict):
        return set()
    found = {req.path.removeprefix("/v1/")}
    if body.get("stream") is True:
        found.add("stream")
    if body.get("tools"):
        found.add("tools")
    if "tool_choice" in body:
        found.add("tool_choice")
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        found.add(f"response_format {fmt.get('type')}")
    if any(isinstance(m, dict) and m.get("tool_calls") for m in body.get("messages") or []):
        found.add("earlier tool calls")
    return found


def _size(req: FuzzRequest) -> tuple[int, int]:
    return len(req.body or b""), len(req.path)


def _hypothesis(strategy: st.SearchStrategy[FuzzRequest], examples: int, seed: int,
                test: Callable[[FuzzRequest], None], shrink: bool) -> str | None:
    """`test` on `examples` requests drawn with `seed`; what hypothesis raised (None:
    nothing failed). Nothing is stored: no example database."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False,
              report_multiple_bugs=True, verbosity=Verbosity.quiet)
    @given(req=strategy)
    def run(req: FuzzRequest) -> None:
        test(req)

    try:
        run()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def fuzz(target: Target, examples: int, *, seed: int = 0, max_tokens: int = 8,
         shrink: bool = True, shrink_runs: int = 4) -> Report:
    """`examples` requests drawn by hypothesis, and what each answer broke, by kind of
    failure with the smallest request that showed it.

    Hypothesis stops drawing soon after a first failure, so the search never fails a
    test: it draws all `examples`. Then each kind of failure found is shrunk: hypothesis
    draws the same requests again from the same seed (the server answering as before,
    it meets the same failures at the same places), this time failing on them, and
    shrinks each (it stops drawing soon after the first, so the kinds it has not met by
    then get a run of their own, `shrink_runs` in all)."""
    report = Report(examples, seed)
    # hypothesis keeps caches (not examples: no database) in ./.hypothesis unless told
    with tempfile.TemporaryDirectory(prefix="specllama-hypothesis-") as home:
        set_hypothesis_home_dir(home)
        try:
            _fuzz(target, report, requests(target.model, max_tokens), shrink, shrink_runs)
        finally:
            set_hypothesis_home_dir(None)
    return report


def _fuzz(target: Target, report: Report, strategy: st.SearchStrategy[FuzzRequest],
          shrink: bool, shrink_runs: int) -> None:
    examples, seed = report.examples, report.seed

    def search(req: FuzzRequest) -> None:
        out = target.send(req)
        report.record(req, out, check(req, out))
        event(f"{req.kind}: {out.status}")

    t0 = time.perf_counter()
    _hypothesis(strategy, examples, seed, search, shrink=False)
    report.seconds = time.perf_counter() - t0
    todo: set[str] | None = None  # None: fail on any kind of failure
    for _ in range(shrink_runs if shrink and report.found else 0):
        met: set[str] = set()

        def shrinking(req: FuzzRequest, todo: set[str] | None = todo,
                      met: set[str] = met) -> None:
            out = target.send(req)
            report.shrink_requests += 1
            for p in check(req, out):
                if todo is None or p.signature in todo:
                    met.add(p.signature)
                    report.keep(req, out, p, shrunk=True)
                    raise failure_of(p)(f"{p.signature}: {p.detail}\nrequest: {req!r}\n"
                                        f"answer: {out.describe()}")

        raised = _hypothesis(strategy, examples, seed, shrinking, shrink=True)
        if raised:
            report.hypothesis.append(raised[:20_000])
        todo = (set(report.found) if todo is None else todo) - met
        if not met or not todo:
            break
    report.shrink_seconds = time.perf_counter() - t0 - report.seconds


PLAIN_CHAT = {"messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 4}


def after_run(target: Target, report: Report | None = None) -> list[str]:
    """After the fuzzing: a plain request still gets 200, a stream its [DONE], and /health
    says ok (what is wrong; empty: all well). Kept in `report` when given."""
    wrong = []
    plain = FuzzRequest("POST", CHAT, encode({"model": target.model, **PLAIN_CHAT}))
    for req in (plain, FuzzRequest("POST", CHAT, encode(
            {"model": target.model, **PLAIN_CHAT, "stream": True}))):
        out = target.send(req)
        if out.status != 200 or check(req, out):
            wrong.append(f"{req!r} -> {out.describe()}")
    health = target.send(FuzzRequest("GET", "/health", content_type=None))
    if health.status != 200 or (_json(health.text) or {}).get("status") != "ok":
        wrong.append(f"GET /health -> {health.describe()}")
    if report is not None:
        report.after = wrong
    return wrong


def tracebacks(log: Sequence[str]) -> list[str]:
    """Each traceback in a server's log, from its first line to the exception's."""
    found, lines = [], list(log)
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = next((j for j in range(i + 1, len(lines))
                        if not lines[j].startswith((" ", "Traceback", "\n"))), len(lines) - 1)
            found.append("".join(lines[max(0, i - 1):end + 1]).rstrip())
    return found


# ------------------------------------------------------------------------------- main


def arguments_parser() -> argparse.ArgumentParser:
    from bench.common import add_pair_options, parser

    p = parser(__doc__)
    p.add_argument("--examples", type=int, default=1000, help="requests hypothesis draws "
                   "(more are sent while it shrinks a failure; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis' seed (default: 0)")
    p.add_argument("--max-tokens", type=int, default=8,
                   help="the most a well-formed request asks for, and serve's default "
                   "(default: %(default)s)")
    p.add_argument("--no-shrink", action="store_true",
                   help="report failures as found, not shrunk to a minimal request")
    add_pair_options(p, pair="smollm2", threads=2)
    p.add_argument("--serve-args", default="", help="more flags for specllama serve")
    p.add_argument("--url", help="fuzz this server, already running, instead of starting one")
    p.add_argument("--api-key", default=os.environ.get("SPECLLAMA_API_KEY"),
                   help="the key of the server at --url (default: $SPECLLAMA_API_KEY)")
    p.add_argument("--timeout", type=float, default=120, help="seconds a request may take")
    p.add_argument("--json", type=Path, help="write the figures and failures here")
    return p


def main() -> None:
    p = arguments_parser()
    args = p.parse_args()
    if bool(args.target) != bool(args.draft):
        p.error("--target and --draft go together")
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"command: {command}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.url:
        target = Target(args.url, "", timeout=args.timeout, api_key=args.api_key)
        target.model = target.http.get(target.url + "/v1/models").json()["data"][0]["id"]
        report = run_on(target, args)
    else:
        report = run_serving(args)
    print("\n".join(report.lines()))
    if args.json:
        args.json.write_text(json.dumps({"command": command, **report.as_dict()}, indent=1))
    sys.exit(1 if report.failed else 0)


def run_on(target: Target, args: argparse.Namespace,
           log: Callable[[], Sequence[str]] | None = None) -> Report:
    report = fuzz(target, args.examples, seed=args.seed, max_tokens=args.max_tokens,
                  shrink=not args.no_shrink)
    after_run(target, report)
    if log is not None:
        report.tracebacks = tracebacks(log())
    target.close()
    return report


def run_serving(args: argparse.Namespace) -> Report:
    from bench.common import machine, model_flags
    from bench.processes import Serve

    argv = [*model_flags(args), "--threads", str(args.threads), "--max-tokens",
            str(args.max_tokens), *shlex.split(args.serve_args)]
    print(f"cpu: {machine()}\nserve: {shlex.join(argv)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="specllama-fuzz-") as tmp:
        serve = Serve(argv, env={"SPECLLAMA_API_KEY": None}, log=Path(tmp) / "serve.log")
        try:
            print(f"serving {serve.model} at {serve.url}", flush=True)
            return run_on(Target(serve.url, serve.model, serve.lines, timeout=args.timeout),
                          args, lambda: serve.lines)
        finally:
            serve.stop()


if __name__ == "__main__":
    from bench.common import run

    run(main)
