"""What an error answer must be: in its API's shape (OpenAI's, Anthropic's on the Messages
API's routes), a 5xx only as a documented 503 with Retry-After, and no refusal from
count_tokens for the max_tokens it does not take; the exception a failure names."""

from __future__ import annotations

import re
from typing import Any

from .exchange import COUNT_TOKENS, MESSAGES, FuzzRequest, Outcome, Problem

#: The documented 503s' codes (queue full, engine down, shutting down)
RETRY_CODES = {"queue_full", "engine_unavailable", "shutting_down"}
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b")
#: The routes whose errors are Anthropic's shape (their POSTs')
ANTHROPIC_PATHS = {MESSAGES, COUNT_TOKENS}
#: What the guard refuses before any route, OpenAI-shaped on every path (docs/serve.md,
#: "Security"): a foreign Host or Origin, a POST that is not application/json


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


def anthropic_error_shape(body: Any) -> str | None:
    """What is wrong with an error body; None: it is Anthropic's shape, {"type": "error",
    "error": {"type": str, "message": str}}."""
    if not isinstance(body, dict) or set(body) != {"type", "error"} or \
            body["type"] != "error" or not isinstance(body["error"], dict):
        return "the body is not {'type': 'error', 'error': {...}}"
    err = body["error"]
    if set(err) != {"type", "message"}:
        return f"the error's keys are {sorted(err)}, not type, message"
    for key in ("type", "message"):
        if not isinstance(err[key], str) or not err[key]:
            return f"error.{key} is not a string"
    return None


def _wrong_error(req: FuzzRequest, status: int, body: Any) -> tuple[str, str] | None:
    """(the shape expected, what is wrong) for an error body not in its API's shape.
    The Messages API's routes answer in Anthropic's shape, the guard's refusals
    included; a wrong method on their paths, answered before any route, may be in
    either."""
    if req.path in ANTHROPIC_PATHS and req.method != "POST":
        wrong = error_shape(body) and anthropic_error_shape(body)
        return ("OpenAI's or Anthropic's", wrong) if wrong else None
    if req.path in ANTHROPIC_PATHS:
        wrong = anthropic_error_shape(body)
        return ("Anthropic's", wrong) if wrong else None
    wrong = error_shape(body)
    return ("OpenAI's", wrong) if wrong else None


def _which(*texts: str) -> str:
    """The exception a message or log line names, the first found ('' when none)."""
    for text in texts:
        found = _EXCEPTION.search(text)
        if found:
            return found.group(1)
    return ""


def _server_error(req: FuzzRequest, out: Outcome, body: Any) -> Problem | None:
    """A 5xx that is not a documented 503 with Retry-After (Anthropic's shape names it
    overloaded_error, without a code)."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    if out.status == 503 and out.headers.get("retry-after", "").isdigit() and (
            err.get("code") in RETRY_CODES or req.path in ANTHROPIC_PATHS
            and err.get("type") == "overloaded_error"):
        return None
    message = str(err.get("message", out.text))
    cause = _which(message, *reversed(out.log)) or re.sub(r"\d+", "N", message)[:80]
    return Problem(f"{out.status} on {req.method} {req.path}: {cause}",
                   f"{out.status} where no 5xx but a documented 503 is allowed")


def _counting_refusal(req: FuzzRequest, status: int, body: Any) -> Problem | None:
    """count_tokens takes no max_tokens: a refusal that names it, when the request did
    not send it, refuses for the server's own stand-in."""
    sent = req.json
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if req.path != COUNT_TOKENS or status != 400 or not isinstance(sent, dict) or \
            "max_tokens" in sent or not isinstance(message, str) or "max_tokens" not in message:
        return None
    return Problem(f"{status} on {req.method} {req.path}: refused for the max_tokens it "
                   "has not", message)
