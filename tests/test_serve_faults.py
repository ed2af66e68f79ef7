"""`specllama serve` outlives its engine: a real `specllama rpc-server` on loopback killed
(SIGKILL) or stopped (SIGSTOP), the engine process itself killed; the server answers
503/500 in OpenAI's shape, starts its engine again, and serves as before."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import NO_RPC_REASON
from servers import RpcServerProcess, ServerProcess

from specllama.engine.llama.backend import rpc_available

pytestmark = pytest.mark.skipif(not rpc_available(), reason=NO_RPC_REASON)

PROMPT = "the cat and the dog"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def complete(server: ServerProcess, *, max_tokens: int = 16, timeout: float = 60,
             **extra) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", timeout=timeout, json={
        "model": server.model, "prompt": PROMPT, "temperature": 0, "max_tokens": max_tokens,
        **extra})


def stream_lines(server: ServerProcess, on_first=None, max_tokens: int = 480) -> list[str]:
    """A streamed completion's data lines; `on_first()` runs once the first text came."""
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
        "model": server.model, "prompt": PROMPT, "temperature": 0, "max_tokens": max_tokens,
        "stream": True,
    }) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        if on_first is not None:
            on_first()
        return lines


def health(server: ServerProcess) -> httpx.Response:
    return httpx.get(f"{server.url}/health", timeout=10)


def wait_until_serving(server: ServerProcess, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = health(server)
        if r.status_code == 200:
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"the server did not serve again:\n{server.stderr}")


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error"
    return error


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def pair_args(tiny_target, tiny_draft) -> list:
    return ["--target", tiny_target, "--draft", tiny_draft, "--threads", 1, "--n-ctx", 512,
            "--draft-max", 3]


@pytest.fixture(scope="module")
def local_text(tiny_target, tiny_draft, tmp_path_factory) -> str:
    """What the request gives from `specllama serve` with its target local."""
    local = ServerProcess(pair_args(tiny_target, tiny_draft), tmp_path_factory.mktemp("local"))
    try:
        return complete(local).json()["choices"][0]["text"]
    finally:
        local.stop()


@pytest.fixture
def remote(tiny_target, tiny_draft, local_text, tmp_path, monkeypatch):
    """(server, rpc_port, local greedy text): `specllama serve` with its target on a
    `specllama rpc-server`, and what the same request gives with a local target."""
    port = free_port()
    rpc_server = RpcServerProcess(port)
    args, expected = pair_args(tiny_target, tiny_draft), local_text
    monkeypatch.setenv("SPECLLAMA_RPC_TIMEOUT", "3")
    server = ServerProcess([*args, "--rpc", rpc_server.endpoint], tmp_path / "remote")
    servers = {"rpc": rpc_server}
    yield server, port, expected, servers
    server.kill()
    servers["rpc"].kill()


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_a_lost_rpc_server_is_a_503_and_the_server_serves_again(remote, fault):
    server, port, expected, servers = remote
    assert complete(server).json()["choices"][0]["text"] == expected
    rpc_server = servers["rpc"]
    rpc_server.proc.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)

    started = time.monotonic()
    error = assert_openai_error(complete(server), 503)
    assert error["code"] == "engine_unavailable"
    assert "RPC server" in error["message"]
    if fault == "stopped":  # detected by SPECLLAMA_RPC_TIMEOUT (3 s), not a hang
        assert time.monotonic() - started < 20
        assert "has not answered for 3 s" in error["message"]

    # While it is down: 503 with Retry-After for every request; /health says why.
    r = complete(server)
    error = assert_openai_error(r, 503)
    assert int(r.headers["Retry-After"]) >= 1
    h = health(server)
    assert h.status_code == 503 and h.json()["status"] == "unavailable"
    assert "RPC server" in h.json()["reason"]
    assert server.proc.poll() is None

    rpc_server.kill()  # a stopped one too: the machine "rebooted"
    servers["rpc"] = RpcServerProcess(port)
    h = wait_until_serving(server)
    assert h["requests"]["engine_restarts"] == 1
    assert complete(server).json()["choices"][0]["text"] == expected
    assert server.proc.poll() is None
    assert "Traceback" not in server.stderr


def test_a_stream_in_flight_ends_with_an_error_event_then_done(remote):
    server, port, expected, servers = remote
    lines = stream_lines(server, on_first=None, max_tokens=4)  # warm: the engine is up
    assert lines[-1] == "data: [DONE]"

    killed = []

    def kill_on_first_chunk(r):
        for line in r.iter_lines():
            if line.startswith("data: ") and not killed:
                servers["rpc"].proc.send_signal(signal.SIGKILL)
                killed.append(line)
            yield line

    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
        "model": server.model, "prompt": PROMPT, "temperature": 0, "max_tokens": 480,
        "stream": True,
    }) as r:
        assert r.status_code == 200
        lines = [line for line in kill_on_first_chunk(r) if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert last["error"]["type"] == "server_error"
    assert last["error"]["code"] == "engine_unavailable"
    assert server.proc.poll() is None
    servers["rpc"].kill()
    servers["rpc"] = RpcServerProcess(port)
    wait_until_serving(server)
    assert complete(server).json()["choices"][0]["text"] == expected


@pytest.fixture
def local(tiny_target, tiny_draft, tmp_path):
    server = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                            "--n-ctx", 512, "--draft-max", 3], tmp_path)
    yield server
    server.kill()


def test_an_engine_that_dies_mid_request_is_a_500_and_is_restarted(local):
    """What llama.cpp's abort or the OOM killer does to the engine process, for real: it
    dies during a stream. That request ends with a 500 event; one waiting behind it gets
    503; the engine is started again and the next request is served as before."""
    server = local
    expected = complete(server).json()["choices"][0]["text"]
    pid = health(server).json()["engine_pid"]

    waiting: list[httpx.Response] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
        "model": server.model, "prompt": PROMPT, "temperature": 0, "max_tokens": 480,
        "stream": True,
    }) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        os.kill(pid, signal.SIGSTOP)  # held mid-stream while a second request lines up
        behind = threading.Thread(target=lambda: waiting.append(complete(server)))
        behind.start()
        deadline = time.monotonic() + 30
        while health(server).json()["waiting"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    behind.join(60)
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["type"] == "server_error"
    assert error["message"].startswith("generation failed: the engine process was killed "
                                       "(SIGKILL)"), error
    assert_openai_error(waiting[0], 503)
    h = wait_until_serving(server)
    assert h["engine_pid"] != pid and h["requests"]["engine_restarts"] == 1
    assert h["requests"]["failed"] == 1
    assert complete(server).json()["choices"][0]["text"] == expected


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_engine_process_outlives_the_server(local, sig):
    server = local
    complete(server, max_tokens=4)
    pid = health(server).json()["engine_pid"]
    assert alive(pid)
    server.proc.send_signal(sig)
    server.proc.wait(60)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    if sig == signal.SIGTERM:
        assert server.proc.returncode == 0
        assert "stopped: 1 completed" in server.stderr


def test_with_parallel_requests_an_engine_death_fails_each_once_and_one_restart_follows(
        tiny_target, tiny_draft, tmp_path):
    """`--parallel 3`: the engine process dies while three streams are in flight. Each
    ends with its own error event and [DONE]; the engine is started again once, by one
    of the three threads, and all three threads go on serving (three requests at once)."""
    server = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                            "--n-ctx", 512, "--draft-max", 3, "--parallel", 3], tmp_path)
    try:
        expected = complete(server).json()["choices"][0]["text"]
        pid = health(server).json()["engine_pid"]
        ends: list[list[str]] = []
        started = threading.Barrier(4)

        def stream() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60, json={
                "model": server.model, "prompt": PROMPT, "temperature": 0, "max_tokens": 480,
                "stream": True,
            }) as r:
                lines = (line for line in r.iter_lines() if line.startswith("data: "))
                next(lines)
                started.wait(30)
                ends.append(list(lines)[-2:])

        clients = [threading.Thread(target=stream) for _ in range(3)]
        for c in clients:
            c.start()
        started.wait(30)
        assert health(server).json()["serving"] == 3
        os.kill(pid, signal.SIGKILL)
        for c in clients:
            c.join(60)
        assert len(ends) == 3
        for end in ends:
            assert end[-1] == "data: [DONE]"
            assert json.loads(end[0][6:])["error"]["message"].startswith(
                "generation failed: the engine process was killed (SIGKILL)")
        h = wait_until_serving(server)
        assert h["requests"]["engine_restarts"] == 1 and h["requests"]["failed"] == 3
        with ThreadPoolExecutor(3) as pool:
            again = list(pool.map(lambda _: complete(server), range(3)))
        assert [r.json()["choices"][0]["text"] for r in again] == [expected] * 3
        assert "Traceback" not in server.stderr
    finally:
        server.kill()
