"""bench/soak.py's requests: the mix it sends, and how a client tells what became of each.

Every request must end with an HTTP status, a stream with `data: [DONE]` (or be abandoned
by its client on purpose); anything else (an exception, a reset, a timeout, a stream cut
short) is LOST.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.lib.processes import Serve

# Common English words, all whole tokens of tests/tinymodels.py's vocabulary too.
WORDS = ("the a of and to in is it that was for on are with as I he she they we you hello "
         "world cat dog this from or had by not but what all can there an which one have "
         "be at his her will so if do how up out some time like see no two").split()
KINDS = ("completed", "dropped", "503", "5xx", "4xx", "error event", "lost")


@dataclass(frozen=True)
class Spec:
    index: int
    chat: bool
    stream: bool
    drop_after: int  # data lines read before hanging up (abandoned); 0: read to the end
    temperature: float
    max_tokens: int
    prompt: str


@dataclass
class Outcome:
    index: int
    kind: str  # one of KINDS
    status: int | None
    detail: str  # the error code, or why it is lost
    stream: bool
    at_s: float  # sent, seconds since the run began
    seconds: float  # to the last byte
    first_token_s: float | None = None  # streams: to the first chunk with text
    retry_after: int = 0  # what a non-200's Retry-After header asks for


def plan(n: int, seed: int, abandon: float = 0.25) -> list[Spec]:
    """n requests: chat or plain (2:1), streamed or not, prompts of 5-300 words (log-
    uniform), max_tokens 4-64, greedy or T = 0.8; a share `abandon` of the streams
    abandoned by their client at a random point: after 1 to max_tokens / 3 data lines
    (text arriving together is one line: the later points may come after the end, and
    then the stream completes)."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        stream = rng.random() < 0.5
        words = int(math.exp(rng.uniform(math.log(5), math.log(300))))
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        max_tokens = rng.choice((4, 8, 16, 32, 48, 64))
        drop_after = rng.randint(1, max(2, max_tokens // 3)) if rng.random() < abandon else 0
        specs.append(Spec(i, chat=rng.random() < 0.67, stream=stream,
                          drop_after=drop_after if stream else 0,
                          temperature=rng.choice((0.0, 0.8)), max_tokens=max_tokens,
                          prompt=text))
    return specs


def body(spec: Spec, model: str) -> dict[str, Any]:
    b: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens,
                         "temperature": spec.temperature, "seed": spec.index,
                         "stream": spec.stream}
    if spec.chat:
        b["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        b["prompt"] = spec.prompt
    return b


@dataclass
class Run:
    """One soak in progress: what the clients, the fault thread and the sampler share."""

    specs: list[Spec]
    serve: Serve
    deadline: float  # time.monotonic()
    t0: float = field(default_factory=time.monotonic)
    issued: int = 0
    ended_s: float = 0.0  # when the last client was done
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def next_spec(self) -> Spec | None:
        with self.lock:
            if self.issued >= len(self.specs) or time.monotonic() > self.deadline:
                return None
            self.issued += 1
            if self.issued % max(1, len(self.specs) // 10) == 0:
                kinds = Counter(o.kind for o in self.outcomes)
                print(f"  {self.now():6.0f} s: {self.issued} sent; {dict(kinds)}",
                      file=sys.stderr)
            return self.specs[self.issued - 1]


def client(run: Run) -> None:
    timeout = httpx.Timeout(120, connect=10)
    with httpx.Client(timeout=timeout) as http:
        while (spec := run.next_spec()) is not None:
            at = run.now()
            try:
                out = (send_stream if spec.stream else send_plain)(http, run.serve, spec, at)
            except (httpx.HTTPError, ValueError) as exc:  # no status, a stream cut short
                out = Outcome(spec.index, "lost", None, f"{type(exc).__name__}: {exc}",
                              spec.stream, at, run.now() - at)
            with run.lock:
                run.outcomes.append(out)
            if out.kind == "lost":
                print(f"  LOST request {spec.index}: {out.detail}", file=sys.stderr)
            if out.status == 503:  # as a well-behaved client does
                run.done.wait(min(10, out.retry_after))


def by_status(status: int) -> str:
    return "503" if status == 503 else "5xx" if status >= 500 else "4xx"


def error_code(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"not an OpenAI error: {r.text[:200]!r}"


def refused(spec: Spec, r: httpx.Response, at: float, seconds: float) -> Outcome:
    """A non-200, with how long its Retry-After asks to wait."""
    out = Outcome(spec.index, by_status(r.status_code), r.status_code, error_code(r),
                  spec.stream, at, seconds)
    header = r.headers.get("retry-after", "")
    out.retry_after = int(header) if header.isdigit() else 1
    if out.status == 503 and not header.isdigit():
        out.detail += " (no Retry-After)"
    return out


def send_plain(http: httpx.Client, serve: Serve, spec: Spec, at: float) -> Outcome:
    path = "/v1/chat/completions" if spec.chat else "/v1/completions"
    t0 = time.monotonic()
    r = http.post(f"{serve.url}{path}", json=body(spec, serve.model))
    seconds = time.monotonic() - t0
    if r.status_code != 200:
        return refused(spec, r, at, seconds)
    try:
        choice = r.json()["choices"][0]
        ok = choice["finish_reason"] is not None
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    return Outcome(spec.index, "completed" if ok else "lost", 200,
                   "" if ok else f"200 without a completion: {r.text[:200]!r}", False, at,
                   seconds)


def send_stream(http: httpx.Client, serve: Serve, spec: Spec, at: float) -> Outcome:
    path = "/v1/chat/completions" if spec.chat else "/v1/completions"
    t0 = time.monotonic()
    with http.stream("POST", f"{serve.url}{path}", json=body(spec, serve.model)) as r:
        if r.status_code != 200:
            r.read()
            return refused(spec, r, at, time.monotonic() - t0)
        out = Outcome(spec.index, "lost", 200, "", True, at, 0.0)
        out.kind, out.detail = read_stream(r, spec, out, t0)
        out.seconds = time.monotonic() - t0
        return out  # leaving `with` before the end closes the connection: a drop


def read_stream(r: httpx.Response, spec: Spec, out: Outcome, t0: float) -> tuple[str, str]:
    """The stream's kind and detail from its data lines (its first text's time into
    `out`); returns after `spec.drop_after` lines to drop the stream."""
    lines = finished = 0
    error = None
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            if error is not None:
                return "error event", error
            return ("completed", "") if finished else ("lost", "[DONE] without finish_reason")
        lines += 1
        chunk = json.loads(payload)
        if "error" in chunk:
            error = str(chunk["error"].get("code"))
            continue
        for choice in chunk.get("choices", []):
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text and out.first_token_s is None:
                out.first_token_s = time.monotonic() - t0
            finished += choice.get("finish_reason") is not None
        if spec.drop_after and lines >= spec.drop_after and error is None:
            return "dropped", f"after {lines} chunk(s)"
    return "lost", f"the stream ended without [DONE] (error event: {error})"
