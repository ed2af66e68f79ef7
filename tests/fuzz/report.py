"""What a run found (Report): the requests by kind and status, the most frequent errors,
what of the APIs the 200s used, each kind of failure with its smallest request; as text
and as JSON."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .errors import ANTHROPIC_PATHS
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


@dataclass
class Found:
    signature: str
    detail: str
    request: FuzzRequest  # the smallest that failed this way
    outcome: Outcome
    seen: int = 0  # examples that failed this way
    shrunk: bool = False  # by hypothesis (else: the smallest of those seen)


@dataclass
class Report:
    examples: int  # asked for
    seed: int
    requests: int = 0  # the examples sent
    shrink_requests: int = 0  # sent while shrinking
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, status)
    errors: Counter[str] = field(default_factory=Counter)  # "kind, status: message" (N: digits)
    served: Counter[str] = field(default_factory=Counter)  # what the 200s' requests used
    found: dict[str, Found] = field(default_factory=dict)
    after: list[str] = field(default_factory=list)  # the checks after the run
    tracebacks: list[str] = field(default_factory=list)  # from the server's log
    hypothesis: list[str] = field(default_factory=list)  # what its shrinking runs raised
    seconds: float = 0.0
    shrink_seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.found or self.after or self.tracebacks)

    def record(self, req: FuzzRequest, out: Outcome, problems: list[Problem]) -> None:
        """An example of the search: counted, its problems kept."""
        self.requests += 1
        self.statuses[req.kind, str(out.status) if out.status else "none"] += 1
        if out.status == 200:
            self.served.update(features(req))
        if out.status and out.status >= 400:
            body = _json(out.text)
            err = body.get("error") if isinstance(body, dict) else None
            message = err.get("message") if isinstance(err, dict) else out.text
            text = re.sub(r"[0-9]+", "N", str(message))[:80]
            self.errors[f"{req.kind}, {out.status}: {text}"] += 1
        for p in problems:
            self.keep(req, out, p).seen += 1

    def keep(self, req: FuzzRequest, out: Outcome, p: Problem, shrunk: bool = False) -> Found:
        old = self.found.get(p.signature)
        if old is None or _size(req) < _size(old.request):
            self.found[p.signature] = Found(p.signature, p.detail, req, out,
                                            old.seen if old else 0)
        found = self.found[p.signature]
        found.shrunk = found.shrunk or shrunk
        return found

    def lines(self) -> list[str]:
        kinds = sorted({k for k, _ in self.statuses})
        codes = sorted({s for _, s in self.statuses})
        out = [f"{self.requests} examples (seed {self.seed}) in {self.seconds:.1f} s"
               + (f"; then {self.shrink_requests} requests in {self.shrink_seconds:.1f} s "
                  "shrinking the failures" if self.shrink_requests else ""), "",
               "statuses by request kind:", "  " + "kind".ljust(28) + "".join(
                   c.rjust(6) for c in codes)]
        for k in kinds:
            out.append("  " + k.ljust(28) + "".join(
                str(self.statuses[k, c] or "").rjust(6) for c in codes))
        out += ["", "answered 200 with: " + (", ".join(
            f"{k} {n}" for k, n in sorted(self.served.items())) or "nothing")]
        out += ["", "the most frequent errors:"]
        out += [f"  {n:5d}  {e}" for e, n in self.errors.most_common(15)]
        out.append("")
        if not self.failed:
            return [*out, "no failure: every answer kept the API's promises"]
        out.append(f"{len(self.found)} kinds of failure, each with its smallest request:")
        for i, f in enumerate(sorted(self.found.values(), key=lambda f: f.signature), 1):
            how = "shrunk by hypothesis" if f.shrunk else "the smallest seen, not shrunk"
            out += [f"{i}. {f.signature}  ({f.seen} of the examples; {how})",
                    f"   problem: {f.detail[:300]}",
                    f"   request: {f.request!r}",
                    f"   answer:  {f.outcome.describe()}"]
        out += [f"after the run: {a}" for a in self.after]
        out += [f"traceback in the server's log:\n{t}" for t in self.tracebacks]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples, "seed": self.seed, "requests": self.requests,
            "shrink_requests": self.shrink_requests, "seconds": round(self.seconds, 1),
            "shrink_seconds": round(self.shrink_seconds, 1),
            "statuses": {f"{k} {s}": n for (k, s), n in sorted(self.statuses.items())},
            "errors": dict(self.errors.most_common()), "served": dict(self.served),
            "failures": [{"signature": f.signature, "detail": f.detail, "seen": f.seen,
                          "shrunk": f.shrunk,
                          "request": {"method": f.request.method, "path": f.request.path,
                                      "content_type": f.request.content_type,
                                      "body": None if f.request.body is None else
                                      f.request.body.decode("utf-8", "backslashreplace")},
                          "answer": f.outcome.describe(limit=10_000)}
                         for f in self.found.values()],
            "after": self.after, "tracebacks": self.tracebacks, "hypothesis": self.hypothesis,
        }


def features(req: FuzzRequest) -> set[str]:
    """What of the API a request uses: streams, tools, earlier calls, the JSON formats;
    for the Responses and Messages APIs each named after its endpoint."""
    if req.path.startswith(RESPONSES + "/"):
        return {f"{req.method} {RESPONSES}/{{id}}"}
    body = req.json if req.path in (CHAT, COMPLETIONS, RESPONSES, MESSAGES,
                                    COUNT_TOKENS) else None
    if not isinstance(body, dict):
        return set()
    if req.path == RESPONSES:
        return {"responses", *(f"responses {f}" for f in _responses_features(body))}
    if req.path in ANTHROPIC_PATHS:
        api = "messages" if req.path == MESSAGES else "count_tokens"
        return {api, *(f"{api} {f}" for f in _messages_features(body))}
    found = {req.path.removeprefix("/v1/"), *_common_features(body)}
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        found.add(f"response_format {fmt.get('type')}")
    if any(isinstance(m, dict) and m.get("tool_calls") for m in body.get("messages") or []):
        found.add("earlier tool calls")
    return found


def _common_features(body: dict[str, Any]) -> set[str]:
    found = {"stream"} if body.get("stream") is True else set()
    if body.get("tools"):
        found.add("tools")
    if "tool_choice" in body:
        found.add("tool_choice")
    return found


def _responses_features(body: dict[str, Any]) -> set[str]:
    found = _common_features(body)
    items = body.get("input")
    if isinstance(items, str):
        found.add("input string")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            found.add(f"{item.get('type', 'message')} items")
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict):
        found.add(f"text.format {fmt.get('type')}")
    for name in ("previous_response_id", "instructions", "reasoning"):
        if name in body:
            found.add(name)
    return found


def _messages_features(body: dict[str, Any]) -> set[str]:
    found = _common_features(body)
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") in (
                    "tool_use", "tool_result", "thinking", "redacted_thinking"):
                found.add(f"{block['type']} blocks")
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        found.add(f"thinking {thinking.get('type')}")
    config = body.get("output_config")
    if isinstance(config, dict) and "format" in config:
        found.add("output_config.format")
    for name in ("stop_sequences", "system"):
        if body.get(name):
            found.add(name)
    return found


def _size(req: FuzzRequest) -> tuple[int, int]:
    return len(req.body or b""), len(req.path)
