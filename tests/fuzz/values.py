"""The building blocks of every API's request strategies: texts, JSON values and schemas,
values of a wrong type or past the limits, tool names, lists of tools and the choice of
one, and how often an optional field is sent."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from .exchange import Raw

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


def object_schemas() -> st.SearchStrategy[dict[str, Any]]:
    """What a tool's parameters usually are: an object of named properties."""
    return st.builds(lambda props, n: {"type": "object", "properties": props,
                                       "required": sorted(props)[:n]},
                     st.dictionaries(st.sampled_from(FIELD_NAMES), valid_schemas(), max_size=3),
                     st.integers(0, 3))


def tool_lists(tool: st.SearchStrategy[dict[str, Any]],
               name_of: Callable[[dict[str, Any]], str]) -> st.SearchStrategy[Any]:
    """Lists of tools with distinct names, or of one tool twice."""
    return weighted((4, st.lists(tool, min_size=1, max_size=3, unique_by=name_of)),
                    (1, tool.map(lambda t: [t, t])))


@st.composite
def choosing(draw: st.DrawFn, listed: st.SearchStrategy[list[dict[str, Any]]],
             name_of: Callable[[dict[str, Any]], str], plain: st.SearchStrategy[Any],
             named: Callable[[str], Any]) -> tuple[list[dict[str, Any]], Any]:
    """Tools drawn from `listed`, and a choice (or _ABSENT): one of `plain`, or `named`
    after one of the tools more often than after any name."""
    tools = draw(listed)
    names = [name_of(t) for t in tools]
    choice = draw(weighted(
        (3, st.just(_ABSENT)), (2, plain),
        (2, st.sampled_from(names).map(named) if names else st.just(_ABSENT)),
        (1, tool_names().map(named))))
    return tools, choice


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


def call_ids() -> st.SearchStrategy[str]:
    return weighted((4, st.from_regex(r"(call|toolu)_[A-Za-z0-9]{1,12}", fullmatch=True)),
                    (1, texts(10)))
