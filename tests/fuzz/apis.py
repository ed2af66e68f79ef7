"""The table of the endpoints that generate: each one's well-formed requests (drawn as
its kind) and the fields and values it refuses, which the near-well-formed requests add."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from .chat import chat_bodies, completion_bodies
from .exchange import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    FuzzRequest,
    encode,
)
from .messages import messages_bodies
from .responses import responses_bodies

# OpenAI's fields that specllama refuses, with values that do something (schema.UNSUPPORTED)
UNSUPPORTED: dict[str, list[Any]] = {
    "logit_bias": [{"50256": -100}, {"1": 1e-38}], "mirostat": [2], "typical_p": [0.5],
    "dry_multiplier": [0.8], "best_of": [2], "echo": [True],
    "functions": [[{"name": "f"}]], "function_call": [{"name": "f"}], "audio": [{}],
    "modalities": [["text", "audio"]],
    "n": [9, 10**6], "n_cmpl": [0, 9],  # past the server's 8 choices a request, or none
}  # (`suffix` and `prediction` are honoured since #65: the first needs FIM tokens)
# The Responses API's: fields and values it refuses (or that are wrong in its terms)
RESPONSES_REFUSED: dict[str, list[Any]] = {
    "include": [["reasoning.encrypted_content"], ["message.output_text.logprobs"]],
    "truncation": ["auto"], "background": [True], "conversation": ["conv_1", {"id": "c"}],
    "prompt": [{"id": "pmpt_1"}], "max_tool_calls": [3], "top_logprobs": [2],
    "tools": [[{"type": "web_search"}], [{"type": "file_search", "vector_store_ids": ["v"]}],
              [{"type": "custom", "name": "x"}], [{"type": "function", "name": "a b"}]],
    "tool_choice": [{"type": "web_search_preview"}, {"type": "allowed_tools", "tools": []},
                    "required", {"type": "function", "name": "nope"}],
    "input": [[{"type": "item_reference", "id": "msg_1"}], [], "",
              [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
              [{"type": "function_call_output", "call_id": "c",
                "output": [{"type": "input_file", "file_id": "f"}]}],
              [{"role": "tool", "content": "x"}], [{"type": "reasoning"}]],
    "reasoning": [{"summary": "detailed"}, {"generate_summary": "concise"},
                  {"effort": "xhigh"}],
    "text": [{"verbosity": "low"}, {"format": {"type": "json_schema"}},
             {"format": {"type": "grammar"}}],
    "previous_response_id": ["resp_nope", "", "resp_" + "0" * 32],
    "max_output_tokens": [0, 10**6], "temperature": [2.5], "modalities": [["text"]],
}
# The Messages API's (Anthropic's refusals, and specllama's limits)
MESSAGES_REFUSED: dict[str, list[Any]] = {
    "container": ["c"], "context_management": [{}], "speed": ["fast"], "top_logprobs": [2],
    "mcp_servers": [[{"type": "url", "url": "http://x", "name": "m"}]],
    "tools": [[{"type": "web_search_20250305", "name": "web_search"}],
              [{"name": "f", "input_schema": {}}], [{"name": "f"}]],
    "messages": [[], [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
        [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        [{"role": "system", "content": "x"}],
        [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                       "input": {}}]}]],
    "thinking": [{"type": "between_tools"}, {"type": "enabled", "budget_tokens": 0},
                 {"type": "enabled"}],
    "tool_choice": [{"type": "any"}, {"type": "tool", "name": "nope"},
                    {"type": "none", "disable_parallel_tool_use": True}],
    "max_tokens": [0, 10**6], "stop_sequences": [["a", "b", "c", "d", "e"]],
    "temperature": [1.5], "output_config": [{"format": {"type": "json_object"}},
                                            {"effort": "none"}],
    "system": [[{"type": "image"}]], "service_tier": ["priority"],
}


@dataclass(frozen=True)
class Api:
    """One endpoint's well-formed requests, drawn as `kind`, and the values it refuses."""

    kind: str
    path: str
    bodies: st.SearchStrategy[dict[str, Any]]
    refused: dict[str, list[Any]]


def api_of(model: str, max_tokens: int, kind: str) -> Api:
    return next(api for api in apis(model, max_tokens) if api.kind == kind)


@functools.lru_cache(maxsize=8)  # (drawn inside composite strategies: made once)
def apis(model: str, max_tokens: int) -> list[Api]:
    return [
        Api("chat", CHAT, chat_bodies(model, max_tokens), UNSUPPORTED),
        Api("completion", COMPLETIONS, completion_bodies(model, max_tokens), UNSUPPORTED),
        Api("responses", RESPONSES, responses_bodies(model, max_tokens), RESPONSES_REFUSED),
        Api("messages", MESSAGES, messages_bodies(model, max_tokens), MESSAGES_REFUSED),
        Api("count_tokens", COUNT_TOKENS, messages_bodies(model, max_tokens, counting=True),
            {**MESSAGES_REFUSED, "max_tokens": [1], "stream": [True]}),
    ]


def _post(path: str, body: dict[str, Any], kind: str) -> FuzzRequest:
    stream = " stream" if body.get("stream") is True else ""
    return FuzzRequest("POST", path, encode(body), kind=kind + stream)
