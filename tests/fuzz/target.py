"""A server under fuzzing (Target): sends a request (a follow-up after its first, the
first answer's ids put in), reads its answer or its stream to the end, and the server's
log lines meanwhile."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import httpx

from .errors import _EXCEPTION
from .exchange import PREVIOUS_CALL, PREVIOUS_ID, FuzzRequest, Outcome, _json, encode
from .streams import server_sent_events

# An error event's marks: OpenAI's server_error, the Responses API's, Anthropic's api_error
_FAILED = re.compile(r'"(server_error|api_error)"')


def follow_up(req: FuzzRequest, first: Any) -> FuzzRequest:
    """The follow-up to a stored response: `req` with the id of the Response `first` (and
    the call_id of its first function call) put in for the placeholders; `req` itself when
    `first` is no Response."""
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        return req
    calls = [i.get("call_id") for i in first.get("output") or []
             if isinstance(i, dict) and i.get("type") == "function_call"]
    swaps = [(PREVIOUS_ID, first["id"])]
    if calls and isinstance(calls[0], str):
        swaps.append((PREVIOUS_CALL, calls[0]))
    path, body = req.path, req.body
    for placeholder, value in swaps:
        path = path.replace(placeholder, urllib.parse.quote(value, safe=""))
        if body is not None:
            body = body.replace(json.dumps(placeholder).encode(), encode(value))
    return FuzzRequest(req.method, path, body, req.content_type, req.kind)


class Target:
    """A running server: where to send, its model id, and (when we started it) its log
    lines as they come, to name the exception behind a 500."""

    def __init__(self, url: str, model: str, log: Sequence[str] | None = None,
                 timeout: float = 60, api_key: str | None = None) -> None:
        self.url, self.model, self.log = url.rstrip("/"), model, log
        self.http = httpx.Client(timeout=timeout, headers={"authorization": f"Bearer {api_key}"}
                                 if api_key else None)

    def _since(self, start: int, wait: bool) -> list[str]:
        if self.log is None:
            return []
        deadline = time.monotonic() + (1.0 if wait else 0)
        while True:
            lines = list(self.log[start:])
            if any(_EXCEPTION.search(line) for line in lines) or time.monotonic() >= deadline:
                return lines
            time.sleep(0.02)

    def send(self, req: FuzzRequest) -> Outcome:
        before = None
        if req.before is not None:  # its answer's ids put in for the placeholders
            before = self.send(req.before)
            req = follow_up(req, _json(before.text))
        start = len(self.log) if self.log is not None else 0
        headers = {"content-type": req.content_type} if req.content_type else {}
        out = Outcome(before=before)
        t0 = time.perf_counter()
        try:
            with self.http.stream(req.method, self.url + req.path, content=req.body,
                                  headers=headers) as r:
                out.status, out.headers = r.status_code, dict(r.headers)
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    out.events, out.names = [], []
                    for name, data in server_sent_events(r.iter_text()):
                        out.names.append(name)
                        out.events.append(data)
                else:
                    out.text = r.read().decode("utf-8", "replace")
        except httpx.HTTPError as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        out.seconds = time.perf_counter() - t0
        suspect = out.status is None or out.status >= 500 or out.error is not None or bool(
            out.events and any(_FAILED.search(e) for e in out.events))
        out.log = self._since(start, suspect)
        return out

    def close(self) -> None:
        self.http.close()
