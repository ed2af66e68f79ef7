"""The servers the scripts start on loopback ports: `specllama serve`, `specllama
rpc-server` and any OpenAI-compatible server (llama-server too), each stopped at the end
whatever happens (the scripts' `finally`)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import httpx

from bench.lib.common import SPECLLAMA

#: What `specllama serve` prints once it answers.
READY = re.compile(r"serving (\S+) at (http://\S+)/v1")


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

    def __init__(self, threads: int, log: Path | None = None) -> None:
        self.port, self.threads, self.log = free_port(), threads, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()  # no start from a fault thread after close()

    def start(self, timeout: float = 60) -> None:
        with self._lock, open(self.log or os.devnull, "ab") as log:
            if self.closed:
                raise RuntimeError("the RPC server was closed")
            self.proc = subprocess.Popen(
                [*SPECLLAMA, "rpc-server", "--port", str(self.port), "--threads",
                 str(self.threads)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the RPC server did not start (log: {self.log})")
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

    def __enter__(self) -> RpcServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Serve:
    """`specllama serve --port 0 ARGV` with `env` added to this environment (None: a
    variable taken out); its stderr kept (in `log` too), its URL and model id read from
    the line that says it serves."""

    def __init__(self, argv: list[str], *, env: dict[str, str | None] | None = None,
                 log: Path | None = None, timeout: float = 600) -> None:
        given = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        full = {k: v for k, v in given.items() if v is not None}
        self.proc = subprocess.Popen([*SPECLLAMA, "serve", "--port", "0", *argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=full)
        self.lines: list[str] = []
        self.url = self.model = ""
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        args=(open(log or os.devnull, "w"),))
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


def body(model: str, prompt: str, temp: float, seed: int, max_tokens: int,
         stream: bool, chat: bool = True) -> dict[str, Any]:
    """A chat completion's body (a plain completion's for a prompt without a
    template): top-k, top-p and min-p off, so a temperature means the same on every
    server."""
    b: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "temperature": temp, "seed": seed,
        "top_k": 0, "top_p": 1.0, "min_p": 0.0, "stream": stream,
    }
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def request(port: int, path: str, body: dict[str, Any] | None, timeout: float,
            stream: bool = False) -> tuple[int, dict[str, Any], float]:
    """POST (or GET when body is None); the JSON answer (a stream: its last chunk that
    has usage or timings, merged) and the seconds from sending to the last byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not stream or resp.status != 200:
            data = resp.read()
            elapsed = time.perf_counter() - t0
            return resp.status, json.loads(data or b"{}"), elapsed
        merged: dict[str, Any] = {"chunks": 0}
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            merged["chunks"] += 1
            for key in ("usage", "timings", "speculative"):
                if chunk.get(key):
                    merged[key] = chunk[key]
        return resp.status, merged, time.perf_counter() - t0
    finally:
        conn.close()


class ApiServer:
    """An OpenAI-compatible server's process (llama-server, `specllama serve`): `argv`
    and `port_flag` with a free port, ready when /health answers; its stderr into
    `logs/NAME.log` (or nowhere)."""

    def __init__(self, name: str, argv: list[str], port_flag: str, timeout: float,
                 logs: Path | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([*argv, port_flag, str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                sys.exit(f"{name}: the server exited ({self.proc.returncode}):\n{err[-2000:]}")
            try:
                status, _, _ = request(self.port, "/health", None, 5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                sys.exit(f"{name}: not ready after {timeout:.0f} s")
            time.sleep(0.25)
        _, models, _ = request(self.port, "/v1/models", None, 5)
        self.model = str(models["data"][0]["id"])
        # The pipe is not read here while serving: a chatty server must not block on it.
        log = open(logs / f"{name.replace(' ', '_').replace('/', '_')}.log", "ab") \
            if logs else subprocess.DEVNULL
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=log)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
