"""The requests the fuzzer sends, by kind, each with its share of the examples (`parts`);
with the two kinds of request that are no API's body: follow-ups on a stored response,
and the other endpoints' GETs, unknown paths and wrong methods."""

from __future__ import annotations

import urllib.parse
from typing import Any

from hypothesis import strategies as st

from .apis import Api, _post, api_of, apis
from .broken import garbage_requests, near_requests
from .exchange import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
    MESSAGES,
    PREVIOUS_CALL,
    PREVIOUS_ID,
    RESPONSES,
    FuzzRequest,
    encode,
)
from .values import _ABSENT, lazily, prompts, texts, weighted

#: Tools whose calls are short, and the max_output_tokens of a first request that must
#: call one (whole calls only are kept)
SMALL_TOOLS = [
    [{"type": "function", "name": "now"}],
    [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}},
        "required": ["unit"], "additionalProperties": False}}, {"type": "function", "name": "f"}],
]
CALL_TOKENS = 80  # (a tiny test model spells a call out in about 50)


@st.composite
def follow_ups(draw: st.DrawFn, model: str, max_tokens: int) -> FuzzRequest:
    """A request on a stored response: a first one (kept: store true), then a follow-up
    naming its id (previous_response_id, with now and then the output of its first call),
    or a GET, HEAD or DELETE of /v1/responses/{its id}."""
    tools = draw(weighted((1, st.just(_ABSENT)), (2, st.sampled_from(SMALL_TOOLS))))
    first: dict[str, Any] = {"model": model, "input": draw(prompts()),
                             "max_output_tokens": draw(st.integers(1, max_tokens))}
    if tools is not _ABSENT:  # a call to answer, with room to write it
        first.update(tools=tools, tool_choice="required", parallel_tool_calls=False,
                     max_output_tokens=CALL_TOKENS)
    before = FuzzRequest("POST", RESPONSES, encode(first), kind="responses")
    how = draw(st.sampled_from(["continue", "continue", "GET", "HEAD", "DELETE"]))
    if how != "continue":
        return FuzzRequest(how, f"{RESPONSES}/{PREVIOUS_ID}", content_type=None,
                           kind="responses stored", before=before)
    body = {**draw(api_of(model, max_tokens, "responses").bodies),
            "previous_response_id": PREVIOUS_ID}
    if draw(st.booleans()):
        answer = {"type": "function_call_output", "call_id": PREVIOUS_CALL,
                  "output": draw(texts())}
        asked = body["input"]
        body["input"] = [answer, *(asked if isinstance(asked, list) else
                                   [{"role": "user", "content": asked}])]
    stream = " stream" if body.get("stream") is True else ""
    return FuzzRequest("POST", RESPONSES, encode(body), kind="responses follow-up" + stream,
                       before=before)


@st.composite
def other_requests(draw: st.DrawFn, model: str) -> FuzzRequest:
    """GETs of the other endpoints; unknown paths; wrong methods."""
    path = draw(st.sampled_from([
        "/health", "/metrics", "/v1/models", f"/v1/models/{model}", "/v1/models/nope",
        "/v1/models/%00", "/v1/models/%ff", "/v1", "/", CHAT, COMPLETIONS, "/docs",
        "/v1/embeddings", RESPONSES, MESSAGES, COUNT_TOKENS, f"{RESPONSES}/resp_nope",
        f"{RESPONSES}/", f"{RESPONSES}/%00", f"{MESSAGES}/batches", "/v1/responses/a/b",
    ]) | lazily(lambda: "/v1/models/" + "a" * 5000, lambda: f"{RESPONSES}/" + "r" * 5000)
                | st.tuples(st.sampled_from(["/v1/models/", f"{RESPONSES}/"]), texts(20)).map(
                    lambda pt: pt[0] + urllib.parse.quote(pt[1], safe="")))
    method = draw(st.sampled_from(["GET", "GET", "POST", "DELETE", "PUT", "OPTIONS", "HEAD"]))
    body = b"{}" if method in ("POST", "PUT") else None
    return FuzzRequest(method, path, body, kind="other")


def parts(model: str, max_tokens: int = 8) -> list[tuple[str, int, st.SearchStrategy[
        FuzzRequest]]]:
    """The requests the fuzzer sends, by kind, each with its share of the examples (of
    40): chat 7, completion 3, Responses 6 (2 of them streams) and 2 on a stored response,
    Messages 6 (2 streams), count_tokens 2, near-well-formed 8 (chat 2, completion 1,
    Responses 2, Messages 2, count_tokens 1), garbage 3 and others 3. `max_tokens`: the
    most a well-formed request asks for."""
    chat, completion, responses, messages, counting = apis(model, max_tokens)

    def drawn(api: Api, stream: bool = False) -> st.SearchStrategy[FuzzRequest]:
        bodies = api.bodies.map(lambda b: {**b, "stream": True}) if stream else api.bodies
        return bodies.map(lambda b: _post(api.path, b, api.kind))

    return [
        ("chat", 7, drawn(chat)), ("completion", 3, drawn(completion)),
        ("responses", 4, drawn(responses)), ("responses stream", 2, drawn(responses, True)),
        ("responses stored", 2, follow_ups(model, max_tokens)),
        ("messages", 4, drawn(messages)), ("messages stream", 2, drawn(messages, True)),
        ("count_tokens", 2, drawn(counting)),
        *(("near " + api.kind, weight, near_requests(model, max_tokens, api.kind))
          for api, weight in ((chat, 2), (completion, 1), (responses, 2), (messages, 2),
                              (counting, 1))),
        ("garbage", 3, garbage_requests(model, max_tokens)),
        ("other", 3, other_requests(model)),
    ]
