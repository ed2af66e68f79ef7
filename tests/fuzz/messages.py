"""The request strategies of the Messages API (POST /v1/messages and
/v1/messages/count_tokens): content blocks, turns, tools and tool_choice, thinking,
output_config."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .chat import sampling_fields
from .values import (
    MOSTLY,
    OFTEN,
    SELDOM,
    _pairs,
    body_of,
    call_ids,
    choosing,
    json_values,
    object_schemas,
    prompts,
    schemas,
    texts,
    tool_lists,
    tool_names,
    weighted,
)


def anthropic_texts() -> st.SearchStrategy[dict[str, Any]]:
    return body_of({"type": st.just("text"), "text": prompts()},
                   {"cache_control": (SELDOM, st.just({"type": "ephemeral"})),
                    "citations": (SELDOM, st.sampled_from([None, []]))})


def blocks(role: str) -> st.SearchStrategy[dict[str, Any]]:
    """A content block of a user's message (text, tool_result) or an assistant's (text,
    tool_use, thinking sent back)."""
    text = anthropic_texts()
    if role == "user":
        result = body_of({"type": st.just("tool_result"), "tool_use_id": call_ids()},
                         {"content": (MOSTLY, texts() | st.lists(text, max_size=2)),
                          "is_error": (SELDOM, st.booleans())})
        return weighted((3, text), (2, result))
    use = st.fixed_dictionaries({
        "type": st.just("tool_use"), "id": call_ids(),
        "name": weighted((3, tool_names()), (1, texts(10))),
        "input": st.dictionaries(texts(8), json_values(), max_size=3)})
    thinking = body_of({"type": st.just("thinking"), "thinking": texts()},
                       {"signature": (OFTEN, texts(10))})
    redacted = st.fixed_dictionaries({"type": st.just("redacted_thinking"),
                                      "data": texts(10)})
    return weighted((3, text), (2, use), (1, thinking), (1, redacted))


@st.composite
def anthropic_messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Turns that alternate and end with the user's, mostly; any roles now and then
    (then a last assistant message is the prefill the server refuses)."""
    n = draw(st.integers(1, 4))
    if draw(weighted((5, st.just(True)), (1, st.just(False)))):
        roles = ["user" if (n - i) % 2 else "assistant" for i in range(n)]
    else:
        roles = draw(st.lists(st.sampled_from(["user", "assistant"]), min_size=n, max_size=n))
    return [{"role": role, "content": draw(weighted(
        (2, prompts()), (3, st.lists(blocks(role), max_size=3))))} for role in roles]


def anthropic_tools() -> st.SearchStrategy[tuple[list[dict[str, Any]], Any]]:
    """Client tools (input_schema an object schema, mostly) and a tool_choice."""
    tool = body_of({"name": tool_names(),
                    "input_schema": weighted((6, object_schemas()), (1, schemas()))},
                   {"description": (OFTEN, texts()), "type": (SELDOM, st.just("custom")),
                    "cache_control": (SELDOM, st.just({"type": "ephemeral"})),
                    "strict": (SELDOM, st.booleans())})
    parallel = {"disable_parallel_tool_use": (SELDOM, st.booleans())}
    plain = st.sampled_from(["auto", "any"]).flatmap(
        lambda kind: body_of({"type": st.just(kind)}, parallel)) | st.just({"type": "none"})
    return choosing(tool_lists(tool, lambda t: t["name"]), lambda t: t["name"], plain,
                    lambda name: {"type": "tool", "name": name})


def thinkings(max_tokens: int) -> st.SearchStrategy[dict[str, Any]]:
    """`thinking`: enabled with a budget below max_tokens or not, adaptive, disabled."""
    display = {"display": (SELDOM, st.sampled_from(["summarized", "omitted"]))}
    return weighted(
        (2, body_of({"type": st.just("enabled"), "budget_tokens": weighted(
            (3, st.just(1)), (1, st.integers(1, 2 * max_tokens)))}, display)),
        (1, body_of({"type": st.just("adaptive")}, display)),
        (1, st.just({"type": "disabled"})))


def messages_bodies(model: str, max_tokens: int,
                    counting: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """A Messages request; `counting`: a count_tokens one (no max_tokens, nor sampling)."""
    required: dict[str, st.SearchStrategy[Any]] = {"model": st.just(model),
                                                   "messages": anthropic_messages()}
    optional: dict[str, tuple[tuple[int, int], st.SearchStrategy[Any]]] = {
        "system": (SELDOM, prompts() | st.lists(anthropic_texts(), max_size=2)),
        "tools": (OFTEN, anthropic_tools()),
        "thinking": (SELDOM, thinkings(max_tokens)),
        "output_config": (SELDOM, body_of({}, {
            "effort": (OFTEN, st.sampled_from(["low", "medium", "high", "xhigh", "max"])),
            "format": ((1, 4), st.fixed_dictionaries({"type": st.just("json_schema"),
                                                      "schema": schemas()}))})),
    }
    if not counting:
        sampling = sampling_fields()
        required["max_tokens"] = st.integers(1, max_tokens)
        optional.update({
            "stop_sequences": (SELDOM, st.lists(texts(8), max_size=4)),
            "temperature": (OFTEN, st.sampled_from([1e-38, 5e-324, 0, 1]) | st.floats(0, 1)),
            "top_k": sampling["top_k"], "top_p": sampling["top_p"], "seed": sampling["seed"],
            "stream": sampling["stream"],
            "metadata": (SELDOM, st.fixed_dictionaries({}, optional={"user_id": texts(10)})),
            "service_tier": (SELDOM, st.sampled_from(["auto", "standard_only"]))})
    return body_of(required, optional).map(_pairs)
