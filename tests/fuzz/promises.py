"""What a 200's output must keep, whether answered whole or streamed: calls of the
request's tools only, output tokens within its limit, a stop_sequence of its own, and
output under a JSON format that is JSON."""

from __future__ import annotations

from typing import Any

from .exchange import CHAT, COMPLETIONS, MESSAGES, RESPONSES, FuzzRequest, Problem, _json

#: A Message's stop_reason, and those that cut the answer short
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use",
                "model_context_window_exceeded"}
CUT_SHORT = {"max_tokens", "model_context_window_exceeded"}


_OBJECTS = {CHAT: "chat.completion", COMPLETIONS: "text_completion"}


def _response_output(response: dict[str, Any]) -> tuple[Any, bool]:
    """A Response's message text, and whether it holds a function call."""
    items = [i for i in response.get("output") or [] if isinstance(i, dict)]
    text = "".join(str(p.get("text", "")) for i in items if i.get("type") == "message"
                   for p in i.get("content") or [] if isinstance(p, dict)
                   and p.get("type") == "output_text")
    return text, any(i.get("type") == "function_call" for i in items)


def _response_promises(req: FuzzRequest, body: dict[str, Any]) -> Problem | None:
    """A Response's calls name the request's tools, its output tokens are within
    max_output_tokens, and its text keeps a JSON text.format."""
    output, called = _response_output(body)
    calls = [i.get("name") for i in body.get("output") or []
             if isinstance(i, dict) and i.get("type") == "function_call"]
    return _within(req, calls, body.get("usage"), "max_output_tokens") or _constrained(
        req, output, cut=body["status"] == "incomplete", stopped=False, called=called,
        finish=body["status"])


def _message_promises(req: FuzzRequest, ended: dict[str, Any], output: str,
                      calls: list[Any]) -> Problem | None:
    """A Message's (or its stream's message_delta's) stop_sequence is the request's that
    ended it (with stop_reason stop_sequence) or null, its tool_use blocks name the
    request's tools, its output tokens are within max_tokens, its text keeps a JSON
    output_config.format."""
    stop, sequence = ended.get("stop_reason"), ended.get("stop_sequence")
    sent = req.json if isinstance(req.json, dict) else {}
    stops = sent.get("stop_sequences")
    stops = stops if isinstance(stops, list) else []
    if (stop == "stop_sequence") != (sequence is not None) or \
            sequence is not None and sequence not in stops:
        return Problem(f"200 on {req.method} {req.path}: stop_reason {stop} with "
                       f"stop_sequence {'null' if sequence is None else 'set'}",
                       f"stop_sequence {sequence!r}; the request's {stops!r}")
    return _within(req, calls, ended.get("usage"), "max_tokens") or _constrained(
        req, output, cut=stop in CUT_SHORT, stopped=stop == "stop_sequence",
        called=bool(calls), finish=stop)


def _within(req: FuzzRequest, calls: list[Any], usage: Any, limit: str) -> Problem | None:
    """An answer's calls name tools of the request, and its output tokens are at most
    the request's `limit` (when it sent one)."""
    where = f"{req.method} {req.path}"
    sent = req.json if isinstance(req.json, dict) else {}
    tools = sent.get("tools")
    names = {t.get("name") for t in tools if isinstance(t, dict)} \
        if isinstance(tools, list) else set()
    strange = [c for c in calls if c not in names]
    if strange:
        return Problem(f"200 on {where}: a call of a tool not among the tools", str(strange))
    most = sent.get(limit)
    used = usage.get("output_tokens") if isinstance(usage, dict) else None
    if type(most) is int and type(used) is int and used > most:
        return Problem(f"200 on {where}: more output tokens than {limit}",
                       f"{used} > {most}")
    return None


def _format_of(req: FuzzRequest) -> tuple[str, Any]:
    """The field that asks for JSON output in the request's API, and its type as sent."""
    sent = req.json if isinstance(req.json, dict) else {}
    if req.path == RESPONSES:
        text = sent.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        return "text.format", fmt.get("type") if isinstance(fmt, dict) else None
    if req.path == MESSAGES:
        config = sent.get("output_config")
        fmt = config.get("format") if isinstance(config, dict) else None
        return "output_config.format", fmt.get("type") if isinstance(fmt, dict) else None
    fmt = sent.get("response_format")
    return "response_format", fmt.get("type") if isinstance(fmt, dict) else None


def choices_asked(req: FuzzRequest) -> int:
    """The choices a Chat Completions or Completions request asked for: n_cmpl, else n,
    as pydantic reads a number (2.0 and "2" are 2)."""
    sent = req.json if isinstance(req.json, dict) else {}
    n = sent.get("n_cmpl") if sent.get("n_cmpl") is not None else sent.get("n")
    try:
        return int(n) if n is not None and not isinstance(n, bool) else 1
    except (TypeError, ValueError):
        return 1


def _check_constrained(req: FuzzRequest, finish: Any, output: Any,
                       called: bool) -> Problem | None:
    """Chat Completions' and Completions' output: cut short unless it stopped on its own;
    at a stop string when the request has stop strings."""
    sent = req.json
    stops = bool(sent.get("stop")) if isinstance(sent, dict) else False
    return _constrained(req, output, cut=finish != "stop", stopped=stops, called=called,
                        finish=finish)


def _constrained(req: FuzzRequest, output: Any, *, cut: bool, stopped: bool, called: bool,
                 finish: Any) -> Problem | None:
    """Output under a JSON format (response_format, text.format, output_config.format)
    and no tool call begins as JSON does (an object for json_object), and when it ended on
    its own (not `cut` short, not `stopped` at a stop string) it is a whole JSON
    document."""
    name, kind = _format_of(req)
    if kind not in ("json_object", "json_schema") or called or not isinstance(output, str):
        return None
    text = output.lstrip()
    starts = "{" if kind == "json_object" else '{["-0123456789tfn'
    whole = cut or stopped or (
        _json(output) is not None or text.rstrip() == "null") and (
        kind != "json_object" or isinstance(_json(output), dict))
    if text and text[0] not in starts or not whole:
        return Problem(f"200 on {req.method} {req.path}: {name} {kind} not followed",
                       f"output {output!r} ({finish})")
    return None
