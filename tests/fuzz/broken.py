"""Requests that are not well-formed, to each endpoint: near-well-formed ones (one thing
wrong in a well-formed body) and garbage (not UTF-8, not JSON, not an object, cut short,
too deep or too big, another content type)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .apis import _post, api_of, apis
from .exchange import FuzzRequest, encode
from .values import lazily, texts, weird_values


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
def near_requests(draw: st.DrawFn, model: str, max_tokens: int, kind: str) -> FuzzRequest:
    """A well-formed body of the API drawn as `kind` with one thing wrong: a value
    replaced, a field taken out, an unknown field or a refused value added, or another
    model named."""
    api = api_of(model, max_tokens, kind)
    body = draw(api.bodies)
    how = draw(st.sampled_from(["replace", "delete", "add", "model"]))
    if how == "add":
        name = draw(st.sampled_from(sorted(api.refused)) | texts(10))
        values = weird_values()
        if name in api.refused:
            values = st.sampled_from(api.refused[name]) | values
        body = {**body, name: draw(values)}
    elif how == "model":
        body = {**body, "model": draw(st.sampled_from(["", model + " ", "gpt-4o",
                                                       "claude-sonnet-4-5"]) | texts())}
    else:
        path = draw(st.sampled_from(_paths(body)))
        delete = how == "delete" and isinstance(_at(body, path[:-1]), dict)
        body = _changed(body, path, None if delete else draw(weird_values()), delete)
    return _post(api.path, body, "near " + api.kind)


def _at(body: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


GARBAGE = [
    b"", b"{", b"null", b"[]", b"1", b'"x"', b"true", b"[{}]", b"{}", b'{"model": "\xff\xfe"}',
    b"\xef\xbb\xbf{}", b"\x00" * 8, b"NaN", b"-Infinity", b'{"model": "m", "model": 1}',
    b'{"messages": "\\ud800"}', b"\xc0\x80",
    # issue 63's shapes: a key that is not text, null where a default is meant
    b'{"\\ud800": 1, "model": "m", "messages": [], "max_tokens": 1, "input": "x"}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, '
    b'"logprobs": null, "stream": null, "n": null, "parallel_tool_calls": null}',
]
BIG_GARBAGE = lazily(
    lambda: b"{" + b" " * 10_000 + b"}", lambda: b"[" * 100_000, lambda: b'{"a":' * 100_000,
    lambda: b'{"seed": ' + b"9" * 5000 + b"}",
    lambda: b"[" + b"1," * 1_500_000 + b"1]",  # over 4 MiB: 413
    # more turns than the engine's 2,048 (each tool_result block is a turn), and a
    # million tiny citations: each a 400 naming its field, never a 500
    lambda: _tool_results(2049), lambda: _citations(1_000_000),
)


def _tool_results(n: int) -> bytes:
    block = b'{"type": "tool_result", "tool_use_id": "t", "content": "x"},'
    return (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": ['
            + block * (n - 1) + block[:-1] + b"]}]}")


def _citations(n: int) -> bytes:
    return (b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": ['
            b'{"type": "text", "text": "x", "citations": [' + b"{}," * (n - 1) + b"{}]}]}]}")


@st.composite
def garbage_requests(draw: st.DrawFn, model: str, max_tokens: int) -> FuzzRequest:
    """Bodies that are not a request: not UTF-8, not JSON, not an object, cut short."""
    api = draw(st.sampled_from(apis(model, max_tokens)))
    path = api.path
    whole = draw(st.booleans())
    if whole:
        body = draw(st.sampled_from(GARBAGE) | BIG_GARBAGE | st.binary(max_size=64)
                    | st.text(max_size=64).map(lambda t: t.encode()))
    else:  # a well-formed body cut short
        full = encode(draw(api.bodies))
        body = full[:draw(st.integers(0, max(0, len(full) - 1)))]
    ctype = "application/json" if draw(st.booleans()) else draw(st.sampled_from(
        ["text/plain", None, "application/x-www-form-urlencoded", "application/json; x=1"]))
    return FuzzRequest("POST", path, body, ctype, kind="garbage")
