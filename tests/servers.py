"""Servers the tests run: `specllama serve` and `specllama rpc-server` as subprocesses, and
the HTTP app on a thread of the test's own process."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import uvicorn

from specllama.server import listen
from specllama.server.runner import url_of

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
READY = re.compile(r"serving (\S+) at (http://\S+)/v1")


class AppOnThread:
    """An ASGI app served by uvicorn on a thread of this process, on a free port of
    127.0.0.1 (what `specllama serve` runs, less its signal handling)."""

    def __init__(self, app) -> None:
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        sock = listen("127.0.0.1", 0)
        self.url = url_of(sock)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)


@contextlib.contextmanager
def starting(tmp_path_factory, name: str, *base) -> Iterator[Callable[..., ServerProcess]]:
    """make(*extra_args) -> `specllama serve *base *extra` running; all killed at the end."""
    servers: list[ServerProcess] = []

    def make(*extra) -> ServerProcess:
        server = ServerProcess([*base, *extra], tmp_path_factory.mktemp(name))
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.kill()


class ServerProcess:
    """`specllama serve --port 0 ...` in a subprocess; its stderr collected line by line."""

    def __init__(self, args, tmp_path: Path) -> None:
        env = {**os.environ, "SPECLLAMA_CACHE_DIR": str(tmp_path / "cache"), "NO_COLOR": "1",
               "PYTHONUNBUFFERED": "1"}
        env.pop("SPECLLAMA_API_KEY", None)
        self.proc = subprocess.Popen(
            [SPECLLAMA, "serve", "--port", "0", *map(str, args)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env,
        )
        self.lines: list[str] = []
        self.url = self.model = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self._ready.wait(120)
        if self.url is None:
            self.kill()
            raise AssertionError(f"the server did not start:\n{self.stderr}")

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            found = READY.search(line)
            if found and self.url is None:
                self.model, self.url = found.groups()
                self._ready.set()
        self._ready.set()  # it exited

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def client(self, **kw) -> openai.OpenAI:
        kw = {"api_key": "unused", "timeout": 60, "max_retries": 0, **kw}
        return openai.OpenAI(base_url=f"{self.url}/v1", **kw)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def wait_idle(self, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if (not h["busy"] and not h["waiting"]) or time.monotonic() > deadline:
                return h
            time.sleep(0.05)

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class RpcServerProcess:
    """`specllama rpc-server` on 127.0.0.1:port, listening. It serves one client at a
    time, so readiness is a TCP connection, not a HELLO: an engine that reconnects
    first would hold it."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [SPECLLAMA, "rpc-server", "--port", str(port), "--threads", "1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"no rpc-server on port {port}") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
