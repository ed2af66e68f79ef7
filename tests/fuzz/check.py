"""The judge of one answer (`check`): what it breaks of the API's promises, by its status
and endpoint; a follow-up's first answer judged too, a stream handed to streams.py."""

from __future__ import annotations

from typing import Any

from .errors import _counting_refusal, _server_error, _wrong_error
from .exchange import (
    CHAT,
    COMPLETIONS,
    COUNT_TOKENS,
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
    _response_promises,
    choices_asked,
)
from .streams import _check_stream

#: The endpoints that stream when asked to
STREAMING = {CHAT, COMPLETIONS, RESPONSES, MESSAGES}


def check(req: FuzzRequest, out: Outcome) -> list[Problem]:
    """What an answer breaks of the API's promises (empty: none); a follow-up's first
    request's answer included."""
    first = check(req.before, out.before) if req.before and out.before else []
    return first + _check(req, out)


def _check(req: FuzzRequest, out: Outcome) -> list[Problem]:
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
        wrong = _wrong_error(req, out.status, body)
        if wrong:
            problems.append(Problem(f"{out.status} on {where}: not {wrong[0]} error shape",
                                    wrong[1]))
        problems.append(_counting_refusal(req, out.status, body))
    if out.status == 200:
        sent = req.json
        if isinstance(sent, dict) and sent.get("stream") is True and req.path in STREAMING:
            problems.append(Problem(f"200 on {where}: JSON for a stream", out.text[:200]))
        else:
            problems.append(_check_success(req, body, out.text))
    return [p for p in problems if p is not None]


def _check_success(req: FuzzRequest, body: Any, text: str) -> Problem | None:
    where = f"{req.method} {req.path}"
    if req.method == "HEAD":
        return None
    if req.path == "/health":
        ok = isinstance(body, dict) and body.get("status") == "ok"
        return None if ok else Problem(f"200 on {where}: not ok", text[:200])
    if req.path == "/v1/models":
        ok = isinstance(body, dict) and body.get("object") == "list"
        return None if ok else Problem(f"200 on {where}: not a list", text[:200])
    if req.path.startswith(RESPONSES + "/") and req.method in ("GET", "DELETE"):
        kind = "response" if req.method == "GET" else "response.deleted"
        ok = isinstance(body, dict) and body.get("object") == kind
        return None if ok else Problem(f"200 on {req.method} {RESPONSES}/{{id}}: not a "
                                       f"{kind}", text[:300])
    if req.method != "POST":
        return None
    if req.path == RESPONSES:
        return _check_response(req, body, text)
    if req.path == MESSAGES:
        return _check_message(req, body, text)
    if req.path == COUNT_TOKENS:
        ok = isinstance(body, dict) and list(body) == ["input_tokens"] and \
            type(body["input_tokens"]) is int and body["input_tokens"] >= 0
        return None if ok else Problem(f"200 on {where}: not a token count", text[:200])
    if req.path not in (CHAT, COMPLETIONS):
        return None
    if not isinstance(body, dict) or body.get("object") != _OBJECTS[req.path] or \
            not isinstance(body.get("choices"), list) or \
            [c.get("index") for c in body["choices"]] != list(range(choices_asked(req))):
        return Problem(f"200 on {where}: not a {_OBJECTS[req.path]} of its n choices",
                       text[:300])
    for choice in body["choices"]:
        output = choice.get("message", {}).get("content") if req.path == CHAT else \
            choice.get("text")
        problem = _check_constrained(req, choice.get("finish_reason"), output, bool(
            req.path == CHAT and choice["message"].get("tool_calls")))
        if problem:
            return problem
    return None


def _check_response(req: FuzzRequest, body: Any, text: str) -> Problem | None:
    if not isinstance(body, dict) or body.get("object") != "response" or \
            body.get("status") not in ("completed", "incomplete") or \
            not isinstance(body.get("output"), list):
        return Problem(f"200 on {req.method} {req.path}: not a Response", text[:300])
    return _response_promises(req, body)


def _check_message(req: FuzzRequest, body: Any, text: str) -> Problem | None:
    where = f"{req.method} {req.path}"
    if not isinstance(body, dict) or body.get("type") != "message" or \
            body.get("role") != "assistant" or not isinstance(body.get("content"), list) or \
            body.get("stop_reason") not in STOP_REASONS:
        return Problem(f"200 on {where}: not a Message", text[:300])
    content = [b for b in body["content"] if isinstance(b, dict)]
    uses = [b for b in content if b.get("type") == "tool_use"]
    if any(not isinstance(b.get("input"), dict) for b in uses):
        return Problem(f"200 on {where}: a tool_use whose input is not an object", text[:300])
    output = "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")
    return _message_promises(req, body, output, [b.get("name") for b in uses])
