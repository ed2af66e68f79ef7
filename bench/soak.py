"""A soak of `specllama serve` whose target lives on a `specllama rpc-server` that fails.

Starts `specllama rpc-server` and `specllama serve --rpc` on it (loopback, free ports,
SPECLLAMA_RPC_TIMEOUT=3 in serve's environment), then sends `--requests` requests from
`--clients` threads (httpx), so requests queue: chat and plain completions, prompts of
5-300 words, max_tokens 4-64, streamed or not, greedy or T = 0.8; about one stream in
six is dropped by its client after its first chunk or two. A client that gets a 503
waits what its Retry-After says (10 s at most) before its next request. Meanwhile the
RPC server is killed (SIGKILL) `--faults` times and stopped (SIGSTOP, longer than the
RPC timeout) `--hangs` times, evenly over the run, and started again on the same port
after `--down` seconds. Every request must end with an HTTP status, a stream with
`data: [DONE]`; anything else (an exception, a reset, a timeout, a stream cut short) is
LOST, and there must be none. The RSS of serve and of its engine process (engine_pid
from /health; a new one after each restart) is sampled every `--sample-s` seconds.

    python bench/soak.py                                     # 1,000 requests, default pair
    python bench/soak.py --requests 60 --faults 2 --max-minutes 5
    python bench/soak.py --target t.gguf --draft d.gguf --clients 6 --json soak.json

Every process it starts is killed at the end, whatever happens. Models resolve through
the user's cache as for any specllama command; nothing else is written outside a
temporary folder (serve's and the RPC server's logs, kept with `--logs DIR`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
READY = re.compile(r"serving (\S+) at (http://\S+)/v1")
RPC_TIMEOUT_S = 3
# Common English words, all whole tokens of tests/tinymodels.py's vocabulary too.
WORDS = ("the a of and to in is it that was for on are with as I he she they we you hello "
         "world cat dog this from or had by not but what all can there an which one have "
         "be at his her will so if do how up out some time like see no two").split()
KINDS = ("completed", "dropped", "503", "5xx", "4xx", "error event", "lost")


# ------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Spec:
    index: int
    chat: bool
    stream: bool
    drop_after: int  # data lines read before hanging up; 0: read to the end
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


def plan(n: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        stream = rng.random() < 0.5
        words = int(math.exp(rng.uniform(math.log(5), math.log(300))))
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        specs.append(Spec(i, chat=rng.random() < 0.67, stream=stream,
                          drop_after=rng.choice((1, 2)) if stream and rng.random() < 1 / 6 else 0,
                          temperature=rng.choice((0.0, 0.8)),
                          max_tokens=rng.choice((4, 8, 16, 32, 48, 64)), prompt=text))
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


# ------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class RpcServer:
    """`specllama rpc-server` on one loopback port, started again there after a fault."""

    def __init__(self, threads: int, log: Path) -> None:
        self.port, self.threads, self.log = free_port(), threads, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()  # no start from the fault thread after close()

    def start(self, timeout: float = 60) -> None:
        with self._lock, open(self.log, "ab") as log:
            if self.closed:
                raise RuntimeError("the soak is over")
            self.proc = subprocess.Popen(
                [SPECLLAMA, "rpc-server", "--port", str(self.port), "--threads",
                 str(self.threads)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the RPC server did not start (see {self.log})")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self.kill()


class Serve:
    """`specllama serve --port 0 --rpc ...`; its stderr kept in a log, lines counted."""

    def __init__(self, argv: list[str], log: Path, timeout: float) -> None:
        env = {**os.environ, "SPECLLAMA_RPC_TIMEOUT": str(RPC_TIMEOUT_S), "NO_COLOR": "1",
               "PYTHONUNBUFFERED": "1"}
        env.pop("SPECLLAMA_API_KEY", None)
        self.proc = subprocess.Popen([SPECLLAMA, "serve", "--port", "0", *argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.url = self.model = ""
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(open(log, "w"),), daemon=True)
        self._reader.start()
        self._ready.wait(timeout)
        if not self.url:
            self.proc.kill()
            raise RuntimeError(f"serve did not start within {timeout:g} s:\n"
                               + "".join(self.lines[-30:]))

    def _read(self, log: TextIO) -> None:
        assert self.proc.stderr is not None
        with log:
            for line in self.proc.stderr:
                log.write(line)
                log.flush()
                self.lines.append(line)
                found = READY.search(line)
                if found and not self.url:
                    self.model, self.url = found.groups()
                    self._ready.set()
        self._ready.set()  # it exited

    def health(self, timeout: float = 5) -> tuple[int, dict[str, Any]]:
        r = httpx.get(f"{self.url}/health", timeout=timeout)
        return r.status_code, r.json()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 60 s; its exit status (None: it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                return None
        self._reader.join(10)
        return self.proc.returncode


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) if found else None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


# ------------------------------------------------------------------------------ run


@dataclass
class Run:
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


# ---------------------------------------------------------------- faults, samples


def faults(run: Run, rpc: RpcServer, args: argparse.Namespace) -> None:
    """Kills (and hangs, in the middle) at even steps of the requests sent."""
    n = args.faults + args.hangs
    hang_at = {round((k + 1) * (n + 1) / (args.hangs + 1)) - 1 for k in range(args.hangs)}
    for k in range(n):
        threshold = (k + 1) * len(run.specs) // (n + 1)
        while run.issued < threshold and not run.done.is_set():
            run.done.wait(0.2)
        if run.done.is_set():
            return
        fault(run, rpc, "hang" if k in hang_at else "kill", args)


def fault(run: Run, rpc: RpcServer, kind: str, args: argparse.Namespace) -> None:
    """One fault: the RPC server killed (after --hang-s stopped, for a hang), down for
    --down s, started again on its port; then until /health says serving again."""
    at = run.now()
    record: dict[str, Any] = {"kind": kind, "at_s": round(at, 1), "at_request": run.issued}
    print(f"  {at:6.0f} s: RPC server {'stopped' if kind == 'hang' else 'killed'}",
          file=sys.stderr)
    rpc.signal(signal.SIGSTOP if kind == "hang" else signal.SIGKILL)
    first_503 = watch_health(run, args.hang_s if kind == "hang" else 0)
    rpc.kill()
    first_503 = watch_health(run, args.down) if first_503 is None else first_503
    time.sleep(max(0.0, at + args.hang_s * (kind == "hang") + args.down - run.now()))
    try:
        rpc.start()
    except RuntimeError as exc:
        record["error"] = str(exc)
        print(f"  {exc}", file=sys.stderr)
    back, serving = run.now(), None
    while serving is None and run.now() - back < 120:  # (no traffic left: it may not know)
        status = health_status(run.serve)
        if status == 503 and first_503 is None:
            first_503 = run.now()
        if status == 200 and (first_503 is not None or run.done.is_set()):
            serving = run.now()
        time.sleep(0.5)
    record.update(rpc_back_s=round(back, 1),
                  first_503_after_s=None if first_503 is None else round(first_503 - at, 1),
                  serving_again_after_back_s=None if serving is None else round(serving - back, 1))
    run.faults.append(record)


def watch_health(run: Run, seconds: float) -> float | None:
    """Poll /health for `seconds`; when it first answered 503, if it did."""
    first, end = None, time.monotonic() + seconds
    while time.monotonic() < end:
        if first is None and health_status(run.serve) == 503:
            first = run.now()
        time.sleep(0.5)
    return first


def health_status(serve: Serve) -> int | None:
    try:
        return serve.health(timeout=5)[0]
    except (httpx.HTTPError, ValueError):
        return None


def sample(run: Run) -> None:
    """/health's status and engine_pid, and the RSS of serve and of that engine."""
    s: dict[str, Any] = {"t": round(run.now(), 1), "health": None, "engine_pid": None}
    try:
        s["health"], h = run.serve.health(timeout=5)
        s["engine_pid"] = h.get("engine_pid")
    except (httpx.HTTPError, ValueError) as exc:
        s["error"] = f"{type(exc).__name__}: {exc}"
    s["serve_kib"] = rss_kib(run.serve.proc.pid)
    s["engine_kib"] = rss_kib(s["engine_pid"])
    run.samples.append(s)


def sampler(run: Run, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        sample(run)


# ---------------------------------------------------------------------------- summary


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def spread(xs: list[float]) -> dict[str, float | None]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p95": percentile(xs, 95)}


def rss(samples: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    xs = [s[key] / 1024 for s in samples if s.get(key)]
    return {"start": xs[0], "max": max(xs), "end": xs[-1]} if xs else None


def summarize(run: Run, final: dict[str, Any]) -> dict[str, Any]:
    outs = run.outcomes
    done = [o for o in outs if o.kind == "completed"]
    details = Counter(f"{o.kind}: {o.detail}" for o in outs if o.kind not in ("completed",
                                                                             "dropped"))
    return {
        "requests": len(run.specs), "sent": run.issued, "answered": len(outs),
        "seconds": round(run.ended_s, 1),
        "outcomes": {k: sum(o.kind == k for o in outs) for k in KINDS},
        "details": dict(details.most_common()),
        "lost": [asdict(o) for o in outs if o.kind == "lost"],
        "latency_s": {"all": spread([o.seconds for o in done]),
                      "plain": spread([o.seconds for o in done if not o.stream]),
                      "stream": spread([o.seconds for o in done if o.stream]),
                      "stream_first_token": spread([o.first_token_s for o in done
                                                    if o.first_token_s is not None])},
        "rss_mib": {"serve": rss(run.samples, "serve_kib"),
                    "engine": rss(run.samples, "engine_kib")},
        "engine_pids": list(dict.fromkeys(s["engine_pid"] for s in run.samples
                                          if s["engine_pid"])),
        "health_errors": [s for s in run.samples if "error" in s],
        "faults": run.faults, **final,
        "samples": run.samples,
        "outcomes_by_request": [{**asdict(o), "words": len(run.specs[o.index].prompt.split()),
                                 "max_tokens": run.specs[o.index].max_tokens,
                                 "chat": run.specs[o.index].chat} for o in outs],
    }


def print_summary(s: dict[str, Any]) -> None:
    print(f"\n{s['sent']} of {s['requests']} requests sent, {s['answered']} answered, "
          f"in {s['seconds']:.0f} s"
          + (" (stopped: --max-minutes)" if s["sent"] < s["requests"] else "")
          + (f"; {s['clients_hung']} client(s) never returned" if s["clients_hung"] else ""))
    for kind, n in s["outcomes"].items():
        print(f"  {kind:12} {n:6}{'   <- must be 0' if kind == 'lost' and n else ''}")
    for what, n in s["details"].items():
        print(f"    {n:5}  {what[:100]}")
    print("latency of completed requests (s)     n     p50     p95")
    for name, d in s["latency_s"].items():
        p50, p95 = (f"{d[k]:7.2f}" if d[k] is not None else "      -" for k in ("p50", "p95"))
        print(f"  {name:32} {d['n']:5} {p50} {p95}")
    print("RSS (MiB)      start     max     end")
    for name, d in s["rss_mib"].items():
        if d:
            print(f"  {name:8} {d['start']:9.1f} {d['max']:7.1f} {d['end']:7.1f}")
    print(f"  engine processes seen: {len(s['engine_pids'])}; /health without an answer: "
          f"{len(s['health_errors'])} of the samples")
    print("faults: at s (request), kind; first /health 503 after s; serving again s after "
          "the RPC server was back")
    for f in s["faults"]:
        print(f"  {f['at_s']:6.0f} ({f['at_request']:4}) {f['kind']:5} "
              f"{f['first_503_after_s']!s:>6} {f['serving_again_after_back_s']!s:>6}")
    print(f"at the end: /health {s['final_health_status']} {json.dumps(s['final_requests'])}; "
          f"serve exit status {s['serve_exit']}, engine left running: {s['engine_left']}; "
          f"tracebacks in serve's log: {s['tracebacks']}")


# ------------------------------------------------------------------------------ main


def final_state(run: Run, timeout: float = 60) -> dict[str, Any]:
    """After the last request: /health serving again (within `timeout`), its totals."""
    status: int | None = None
    h: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, h = run.serve.health()
        except (httpx.HTTPError, ValueError):
            status = None
        if status == 200:
            break
        time.sleep(0.5)
    return {"final_health_status": status, "final_requests": h.get("requests"),
            "final_engine_pid": h.get("engine_pid")}


def soak(args: argparse.Namespace, serve_argv: list[str], tmp: Path) -> dict[str, Any]:
    rpc = RpcServer(args.threads, tmp / "rpc-server.log")
    serve: Serve | None = None
    try:
        rpc.start()
        serve = Serve([*serve_argv, "--rpc", f"127.0.0.1:{rpc.port}"], tmp / "serve.log",
                      args.start_timeout)
        print(f"serving {serve.model} at {serve.url}, RPC server on port {rpc.port}; "
              f"logs in {tmp}", file=sys.stderr)
        run = Run(plan(args.requests, args.seed), serve,
                  deadline=time.monotonic() + 60 * args.max_minutes)
        sample(run)
        stop_sampling = threading.Event()
        threads = [threading.Thread(target=sampler, args=(run, args.sample_s, stop_sampling),
                                    daemon=True),
                   threading.Thread(target=faults, args=(run, rpc, args), daemon=True)]
        clients = [threading.Thread(target=client, args=(run,), daemon=True)
                   for _ in range(args.clients)]
        for t in threads + clients:
            t.start()
        for t in clients:  # each request is bounded by its timeouts
            t.join(max(1, run.deadline - time.monotonic()) + 300)
        hung = sum(t.is_alive() for t in clients)
        run.ended_s = run.now()
        run.done.set()
        threads[1].join(180)  # a fault under way ends with the server serving again
        final = final_state(run)
        stop_sampling.set()
        threads[0].join(10)
        sample(run)
        engine = final["final_engine_pid"]
        final.update(clients_hung=hung, serve_exit=serve.stop(),
                     engine_left=bool(engine and not gone_within(engine, 10)),
                     tracebacks=sum("Traceback" in line for line in serve.lines))
        return summarize(run, final)
    finally:
        if serve is not None and serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait(10)
        rpc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--faults", type=int, default=4, help="times the RPC server is killed")
    parser.add_argument("--hangs", type=int, default=1,
                        help="times it is stopped (SIGSTOP) for --hang-s, then killed")
    parser.add_argument("--down", type=float, default=3, help="seconds it stays down")
    parser.add_argument("--hang-s", type=float, default=8, help="seconds it stays stopped "
                        f"(more than SPECLLAMA_RPC_TIMEOUT={RPC_TIMEOUT_S})")
    parser.add_argument("--max-minutes", type=float, default=30,
                        help="stop sending after this long and report")
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--target", help="target GGUF (with --draft, instead of --pair)")
    parser.add_argument("--draft", help="draft GGUF (or 'lookup')")
    parser.add_argument("--threads", type=int, default=2, help="for serve and the RPC server")
    parser.add_argument("--serve-args", default="", help="more flags for specllama serve")
    parser.add_argument("--sample-s", type=float, default=2, help="seconds between RSS samples")
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0, help="of the request mix")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--logs", type=Path, help="keep serve's and the RPC server's logs here")
    args = parser.parse_args()
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together")
    pair = ["--target", args.target, "--draft", args.draft] if args.target \
        else ["--pair", args.pair]
    serve_argv = [*pair, "--threads", str(args.threads), *shlex.split(args.serve_args)]
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    print(f"command: {command}\ncpu: {cpu} ({os.cpu_count()} cores)\n"
          f"serve: {shlex.join(serve_argv)} --rpc 127.0.0.1:PORT "
          f"(SPECLLAMA_RPC_TIMEOUT={RPC_TIMEOUT_S})")
    # a kill of this script still stops serve and the RPC server (the finally in soak)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specllama-soak-") as tmp:
        summary = soak(args, serve_argv, args.logs or Path(tmp))
    summary.update(command=command, cpu=cpu, args=vars(args))
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=str))
    sys.exit(1 if summary["outcomes"]["lost"] or summary["clients_hung"] else 0)


if __name__ == "__main__":
    main()
