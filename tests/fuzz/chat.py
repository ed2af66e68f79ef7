"""The request strategies of Chat Completions and Completions, and the sampling fields
that the other generation APIs draw theirs from."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .values import (
    _ABSENT,
    MOSTLY,
    OFTEN,
    ROLES,
    SELDOM,
    _pairs,
    arguments,
    body_of,
    choosing,
    object_schemas,
    prompts,
    schemas,
    texts,
    tool_lists,
    tool_names,
    unit,
    weighted,
)


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


def tools() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Chat Completions' tools: distinct names, or one tool twice."""
    function = st.fixed_dictionaries(
        {"name": tool_names()},
        optional={"description": texts(), "parameters": object_schemas() | schemas(),
                  "strict": st.booleans()})
    return tool_lists(st.fixed_dictionaries({"type": st.just("function"), "function": function}),
                      lambda t: t["function"]["name"])


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def tools_and_choice() -> st.SearchStrategy[tuple[list[dict[str, Any]], Any]]:
    """Tools, and a tool_choice (or _ABSENT) that names one of them more often than not."""
    return choosing(tools(), lambda t: t["function"]["name"],
                    st.sampled_from(["none", "auto", "required"]), _named)


def response_formats() -> st.SearchStrategy[dict[str, Any]]:
    json_schema = st.fixed_dictionaries({"schema": schemas()}, optional={
        "name": texts(10), "strict": st.booleans()})
    return weighted((1, st.just({"type": "text"})), (2, st.just({"type": "json_object"})),
                    (3, st.fixed_dictionaries({"type": st.just("json_schema"),
                                               "json_schema": json_schema})))


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
        "n": (SELDOM, st.sampled_from([1, 2])),  # two: choices one after another
        "response_format": (OFTEN, response_formats()),
        "user": (SELDOM, texts(10)),
        # refused unless at its no-op value (which the near-well-formed requests change)
        "logit_bias": (SELDOM, st.just({})),
        # the penalties, honoured (engine/penalties.py)
        "presence_penalty": (SELDOM, st.sampled_from([0, 0.0, 0.5, -2.0])),
        "frequency_penalty": (SELDOM, st.sampled_from([0, 1.0])),
        "repeat_penalty": (SELDOM, st.sampled_from([1.0, 1.3])),
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


def completion_bodies(model: str, max_tokens: int) -> st.SearchStrategy[dict[str, Any]]:
    return body_of(
        {"model": st.just(model),
         "prompt": prompts() | st.lists(prompts(), min_size=1, max_size=1),
         "max_tokens": st.integers(1, max_tokens)},
        {**sampling_fields(), "logprobs": (OFTEN, st.integers(0, 5)),
         "echo": (SELDOM, st.just(False)), "suffix": (SELDOM, st.just("")),
         "best_of": (SELDOM, st.just(1))})
