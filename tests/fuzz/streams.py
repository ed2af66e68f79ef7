"""The streams: server-sent events read as the standard splits them, and each API's
grammar of events (Chat Completions' and Completions' chunks to [DONE]; the Responses
API's, named and numbered to one end; the Messages API's, message_start to message_stop)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import RETRY_CODES, _which, anthropic_error_shape, error_shape
from .exchange import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    RESPONSES,
    FuzzRequest,
    Outcome,
    Problem,
    _json,
)
from .promises import (
    _OBJECTS,
    STOP_REASONS,
    _check_constrained,
    _message_promises,
    _response_output,
    _response_promises,
    choices_asked,
)

_LINE_END = re.compile(r"\r\n|\r|\n")
#: How a stream of the Responses API ends
RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


def server_sent_events(chunks: Iterable[str]) -> Iterator[tuple[str | None, str]]:
    """(the `event:` name or None, the data) of each event of a text/event-stream, its
    lines ended by CR, LF or CRLF only, as the SSE standard says (httpx' iter_lines also
    ends them at U+2028, U+0085, ..., which JSON leaves unescaped in a string)."""
    pending, name = "", None
    data: list[str] = []
    for chunk in chunks:
        pending += chunk
        held = "\r" if pending.endswith("\r") else ""  # perhaps a CRLF's first half
        lines = _LINE_END.split(pending[:len(pending) - len(held)])
        pending = lines.pop() + held
        for line in lines:
            if not line:
                if data:
                    yield name, "\n".join(data)
                name, data = None, []
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
    if pending:
        key, _, value = pending.partition(":")
        if key == "data":
            data.append(value.removeprefix(" "))
    if data:  # the last event, not ended by an empty line
        yield name, "\n".join(data)


def _check_stream(req: FuzzRequest, out: Outcome) -> list[Problem]:
    where = f"{req.method} {req.path}"
    events = out.events or []
    if out.status != 200:
        return [Problem(f"{out.status} on {where}: a stream", "an error status as a stream")]
    if out.error is not None:
        return [Problem(f"stream cut on {where}: {out.error.split(':')[0]}", out.error)]
    if req.path == RESPONSES:
        return _responses_stream(req, out)
    if req.path == MESSAGES:
        return _messages_stream(req, out)
    if req.path not in (CHAT, COMPLETIONS):
        return [Problem(f"stream on {where}: where none is", f"{len(events)} events")]
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
    ok = [c for c in chunks if isinstance(c, dict) and "error" not in c]
    return _stream_output(req, ok, whole=len(ok) == len(chunks))


def _stream_output(req: FuzzRequest, chunks: list[dict[str, Any]],
                   whole: bool) -> list[Problem]:
    """Each choice's output, its chunks reassembled by `index` as clients do; `whole`:
    no error event ended the stream, so every choice asked for is there."""
    text: dict[Any, list[str]] = {}
    finish: dict[Any, Any] = {}
    called: set[Any] = set()
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            i = choice.get("index")
            delta = choice.get("delta", {}) if req.path == CHAT else {"content": choice.get(
                "text")}
            text.setdefault(i, []).append(delta.get("content") or "")
            if delta.get("tool_calls"):
                called.add(i)
            finish[i] = choice.get("finish_reason") or finish.get(i)
    if whole and sorted(finish, key=str) != list(range(choices_asked(req))):
        return [Problem(f"stream on {req.method} {req.path}: not its n choices",
                        f"indexes {sorted(finish, key=str)}")]
    problems = [_check_constrained(req, finish[i], "".join(text[i]), i in called)
                for i in sorted(finish, key=str)]
    return [p for p in problems if p][:1]


def _typed(req: FuzzRequest, out: Outcome) -> tuple[list[dict[str, Any]], Problem | None]:
    """A stream's events as JSON objects with a `type` that their `event:` name spells
    (as the Responses and Messages APIs send them: their clients go by the names)."""
    where = f"{req.method} {req.path}"
    events = out.events or []
    names = out.names or [None] * len(events)
    datas = []
    for name, text in zip(names, events):
        data = _json(text)
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return [], Problem(f"stream on {where}: an event that is not JSON with a type",
                               text[:200])
        if name != data["type"]:
            return [], Problem(f"stream on {where}: an event named other than its type",
                               f"event: {name}\ndata: {text[:200]}")
        datas.append(data)
    return datas, None


def _responses_stream(req: FuzzRequest, out: Outcome) -> list[Problem]:
    """OpenAI's events: named by their type, sequence_number increasing, response.created
    first, and last (once) response.completed, .incomplete or .failed (after an `error`
    event, if any, and not for a server error but a 503's); the output deltas add up to
    the final Response's text, which keeps a JSON text.format."""
    where = f"{req.method} {req.path}"
    datas, wrong = _typed(req, out)
    if wrong:
        return [wrong]
    types = [d["type"] for d in datas]
    numbers = [d.get("sequence_number") for d in datas]
    ints = [n for n in numbers if type(n) is int]
    if len(ints) != len(numbers) or any(b <= a for a, b in zip(ints, ints[1:])):
        return [Problem(f"stream on {where}: sequence_number not increasing",
                        str(numbers[:60]))]
    if not types or types[0] != "response.created":
        return [Problem(f"stream on {where}: does not begin with response.created",
                        str(types[:5]))]
    if types[-1] not in RESPONSE_ENDS:
        return [Problem(f"stream on {where} without response.completed, .incomplete or "
                        ".failed", f"{len(types)} events, the last {types[-3:]}")]
    if any(t in RESPONSE_ENDS for t in types[:-1]) or \
            "error" in types and types.index("error") != len(types) - 2:
        return [Problem(f"stream on {where}: events after its end or an error",
                        str(types[-6:]))]
    status = types[-1].removeprefix("response.")
    final = datas[-1].get("response")
    if not isinstance(final, dict) or final.get("object") != "response" or \
            final.get("status") != status:
        return [Problem(f"stream on {where}: {types[-1]} without a Response of that status",
                        out.events[-1][:300] if out.events else "")]
    if status == "failed":
        err = final.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            return [Problem(f"stream on {where}: response.failed without its error",
                            str(err)[:200])]
        if err.get("code") == "server_error":
            return [Problem(f"stream on {where}: server_error event: "
                            f"{_which(err['message'], *reversed(out.log))}", err["message"])]
        return []
    output, _ = _response_output(final)
    deltas = "".join(str(d.get("delta", "")) for d in datas
                     if d["type"] == "response.output_text.delta")
    if deltas != output:
        return [Problem(f"stream on {where}: the text deltas are not the Response's text",
                        f"deltas {deltas!r}, output {output!r}")]
    problem = _response_promises(req, final)
    return [problem] if problem else []


def _messages_stream(req: FuzzRequest, out: Outcome) -> list[Problem]:
    """Anthropic's events: named by their type, message_start first, message_stop last
    unless an `error` event (Anthropic-shaped, not api_error: a server error) ended it;
    between them content blocks one at a time (start, deltas, stop; indices 0, 1, ...) and
    one message_delta after the last; a JSON output_config.format kept."""
    where = f"{req.method} {req.path}"
    datas, wrong = _typed(req, out)
    if wrong:
        return [wrong]
    types = [d["type"] for d in datas]
    if not types or types[0] != "message_start" or not isinstance(
            datas[0].get("message"), dict) or datas[0]["message"].get("type") != "message":
        return [Problem(f"stream on {where}: does not begin with message_start",
                        str(types[:5]))]
    if types[-1] not in ("message_stop", "error"):
        return [Problem(f"stream on {where} without message_stop or an error",
                        f"{len(types)} events, the last {types[-3:]}")]
    if "message_stop" in types[:-1] or "error" in types[:-1]:
        return [Problem(f"stream on {where}: events after message_stop or an error",
                        str(types[-6:]))]
    if types[-1] == "error":
        wrong_shape = anthropic_error_shape(datas[-1])
        if wrong_shape:
            return [Problem(f"stream on {where}: an error event not Anthropic-shaped",
                            wrong_shape)]
        err = datas[-1]["error"]
        if err["type"] == "api_error":
            return [Problem(f"stream on {where}: api_error event: "
                            f"{_which(err['message'], *reversed(out.log))}", err["message"])]
        return []
    walked = _blocks(datas[1:-1])
    if isinstance(walked, str):
        return [Problem(f"stream on {where}: {walked}", str(types[:12]))]
    ended, text, calls = walked
    if ended is None or not isinstance(ended.get("delta"), dict) or \
            ended["delta"].get("stop_reason") not in STOP_REASONS:
        return [Problem(f"stream on {where}: message_stop without a message_delta's "
                        "stop_reason", str(ended))]
    problem = _message_promises(req, {**ended["delta"], "usage": ended.get("usage")}, text,
                                calls)
    return [problem] if problem else []


def _blocks(datas: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str, list[Any]] | str:
    """The events between message_start and message_stop walked: content blocks one at
    a time (start, deltas, stop; indices 0, 1, ...), pings, and one message_delta after
    the last block. (the message_delta, the text, the names the tool_use blocks call),
    or what came out of place."""
    open_block: int | None = None
    count, ended, text, calls = 0, None, [], []
    for data in datas:
        kind, index = data["type"], data.get("index")
        if kind == "content_block_start" and open_block is None and index == count and \
                ended is None:
            open_block, count = count, count + 1
            block = data.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(block.get("name"))
        elif kind == "content_block_delta" and index == open_block is not None:
            piece = data.get("delta")
            if isinstance(piece, dict) and piece.get("type") == "text_delta":
                text.append(str(piece.get("text", "")))
        elif kind == "content_block_stop" and index == open_block is not None:
            open_block = None
        elif kind == "message_delta" and open_block is None and ended is None:
            ended = data
        elif kind != "ping":
            return f"{kind} out of place"
    return ended, "".join(text), calls
