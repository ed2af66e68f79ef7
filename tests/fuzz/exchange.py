"""What passes between the fuzzer and a server: a request (FuzzRequest, its body JSON with
raw parts spliced in), the endpoints' paths, the answer (Outcome) and a broken promise
(Problem)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, repr=False)
class Raw:
    """JSON text put into a body as it is: what json.dumps cannot write (a number of
    5,000 digits, NaN's cousins, nesting deeper than Python's recursion)."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({shorten(self.text.encode())})"


def encode(value: Any) -> bytes:
    """`value` as JSON in UTF-8 (not ASCII-escaped), its Raw parts spliced in."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"', raw, 1)
    return text.encode("utf-8")


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    kind: str = "other"  # what it was drawn as: counted by kind in the report
    # sent first, its answer's id (and first call's call_id) put in for PREVIOUS_ID (and
    # PREVIOUS_CALL) in this one's path and body
    before: FuzzRequest | None = None

    def __repr__(self) -> str:
        head = f"{self.method} {self.path}"
        if self.content_type != "application/json":
            head += f" [content-type: {self.content_type}]"
        head = head if self.body is None else f"{head} {shorten(self.body)}"
        return head if self.before is None else f"{head}\n   after: {self.before!r}"

    @property
    def json(self) -> Any:
        """The body as JSON, None when it is not."""
        try:
            return json.loads(self.body or b"")
        except (ValueError, RecursionError):
            return None


_RUN = re.compile(r"(.{1,4}?)\1{15,}", re.DOTALL)


def shorten(data: bytes, limit: int = 4000) -> str:
    """A body for a reader: runs of a few characters written once with their count,
    bytes that are not UTF-8 as escapes."""
    text = data.decode("utf-8", "backslashreplace")
    text = _RUN.sub(lambda m: f"«{m.group(1)!r} × {len(m.group(0)) // len(m.group(1))}»",
                    text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(data)} bytes)"


#: The endpoints that generate
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"


#: Placeholders of a follow-up (FuzzRequest.before): the first answer's id, and the
#: call_id of its first function_call, put in by Target.send once it has them.
PREVIOUS_ID, PREVIOUS_CALL = "resp_fuzz_previous", "call_fuzz_previous"


@dataclass
class Outcome:
    status: int | None = None  # None: no answer (error says why)
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""  # the body (not a stream's)
    events: list[str] | None = None  # a stream's events' data
    names: list[str | None] | None = None  # their `event:` names (None: none)
    error: str | None = None
    log: list[str] = field(default_factory=list)  # the server's log lines meanwhile
    seconds: float = 0.0
    before: Outcome | None = None  # the answer to the request's `before`

    def describe(self, limit: int = 1500) -> str:
        if self.status is None:
            return f"no answer: {self.error}"
        head = f"{self.status}"
        if "retry-after" in self.headers:
            head += f" (Retry-After: {self.headers['retry-after']})"
        if self.events is not None:
            names = self.names or [None] * len(self.events)
            shown = [f"event: {n}\ndata: {e}" if n is not None else f"data: {e}"
                     for n, e in zip(names, self.events)]
            body = "\n".join(shown[-4:])
            if len(shown) > 4:
                body = f"({len(shown) - 4} events before)\n{body}"
            if self.error:
                body += f"\n(then: {self.error})"
        else:
            body = self.text
        body = body if len(body) <= limit else body[:limit] + "..."
        logged = "".join(f"\n  server log: {line.rstrip()}" for line in self.log[-3:])
        first = "" if self.before is None else \
            f"\n   (the first request's answer: {self.before.describe(300)})"
        return f"{head} {body}{logged}{first}"


@dataclass(frozen=True)
class Problem:
    signature: str  # one per kind of failure: what hypothesis shrinks separately
    detail: str


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
