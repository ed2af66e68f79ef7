"""The request strategies of the Responses API (POST /v1/responses): input items, function
tools and tool_choice, text.format and the fields it ignores or takes at no-op values."""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import strategies as st

from .chat import sampling_fields
from .values import (
    MOSTLY,
    OFTEN,
    SELDOM,
    _pairs,
    arguments,
    body_of,
    call_ids,
    choosing,
    object_schemas,
    prompts,
    schemas,
    texts,
    tool_lists,
    tool_names,
    weighted,
)


def response_items() -> st.SearchStrategy[dict[str, Any]]:
    """The items of a Responses input: messages (content a string or text parts, the
    type left out now and then), function calls and their outputs, reasoning sent back;
    with the ids and statuses that items sent back as answered carry."""
    part = st.sampled_from(["input_text", "output_text"]).flatmap(
        lambda kind: st.fixed_dictionaries({"type": st.just(kind), "text": prompts()})) \
        | st.fixed_dictionaries({"type": st.just("refusal"), "refusal": texts()})
    echoed: dict[str, tuple[tuple[int, int], st.SearchStrategy[Any]]] = {
        "id": (SELDOM, texts(10)), "status": (SELDOM, st.just("completed"))}
    message = body_of(
        {"role": st.sampled_from(["user", "user", "system", "developer", "assistant"]),
         "content": weighted((3, prompts()), (1, st.lists(part, max_size=3)))},
        {"type": (OFTEN, st.just("message")), **echoed})
    call = body_of({"type": st.just("function_call"), "call_id": call_ids(),
                    "name": weighted((3, tool_names()), (1, texts(10))),
                    "arguments": arguments()}, echoed)
    text = st.fixed_dictionaries({"type": st.just("input_text"), "text": prompts()})
    output = body_of({"type": st.just("function_call_output"), "call_id": call_ids(),
                      "output": weighted((3, texts()), (1, st.lists(text, max_size=2)))},
                     echoed)
    reasoning = body_of({"type": st.just("reasoning")}, {
        "id": (OFTEN, texts(10)), "summary": (OFTEN, st.just([])),
        "content": (SELDOM, st.lists(st.fixed_dictionaries(
            {"type": st.just("reasoning_text"), "text": texts()}), max_size=2))})
    return weighted((4, message), (2, call), (2, output), (1, reasoning))


@functools.cache  # (drawn inside a composite strategy: made once)
def response_tools() -> st.SearchStrategy[tuple[list[dict[str, Any]], Any]]:
    """Function tools in the Responses shape (flat), and a tool_choice."""
    tool = st.fixed_dictionaries(
        {"type": st.just("function"), "name": tool_names()},
        optional={"description": texts(), "parameters": object_schemas() | schemas(),
                  "strict": st.booleans()})
    return choosing(tool_lists(tool, lambda t: t["name"]), lambda t: t["name"],
                    st.sampled_from(["none", "auto", "required"]),
                    lambda name: {"type": "function", "name": name})


def text_configs() -> st.SearchStrategy[dict[str, Any]]:
    """`text`: its format (response_format's, flat), now and then the no-op verbosity."""
    json_schema = st.fixed_dictionaries({"type": st.just("json_schema"), "schema": schemas()},
                                        optional={"name": texts(10), "strict": st.booleans()})
    fmt = weighted((1, st.just({"type": "text"})), (2, st.just({"type": "json_object"})),
                   (3, json_schema))
    return body_of({}, {"format": ((1, 8), fmt), "verbosity": (SELDOM, st.just("medium"))})


def responses_bodies(model: str, max_tokens: int) -> st.SearchStrategy[dict[str, Any]]:
    sampling = sampling_fields()
    return body_of(
        {"model": st.just(model),
         "input": weighted((2, prompts()),
                           (3, st.lists(response_items(), min_size=1, max_size=4)))},
        {"max_output_tokens": (MOSTLY, st.integers(1, max_tokens)),
         "instructions": (SELDOM, prompts()),
         "tools": (OFTEN, response_tools()),
         "parallel_tool_calls": (SELDOM, st.booleans()),
         "text": (OFTEN, text_configs()),
         **{k: sampling[k] for k in ("temperature", "top_p", "seed", "stream")},
         "store": (SELDOM, st.booleans()),
         "reasoning": (SELDOM, st.fixed_dictionaries({}, optional={
             "effort": st.sampled_from(["none", "minimal", "low", "medium", "high"]),
             "summary": st.sampled_from(["auto", None])})),
         # fields that change nothing here (ignored), and others at their no-op values
         "metadata": (SELDOM, st.dictionaries(texts(8), texts(8), max_size=2)),
         "user": (SELDOM, texts(10)), "safety_identifier": (SELDOM, texts(10)),
         "prompt_cache_key": (SELDOM, texts(10)),
         "service_tier": (SELDOM, st.sampled_from(["auto", "default", "flex"])),
         "stream_options": (SELDOM, st.fixed_dictionaries(
             {}, optional={"include_obfuscation": st.booleans()})),
         "include": (SELDOM, st.sampled_from([None, []])),
         "truncation": (SELDOM, st.just("disabled")), "background": (SELDOM, st.just(False)),
         "top_logprobs": (SELDOM, st.just(0)), "max_tool_calls": (SELDOM, st.just(None)),
         }).map(_pairs)
