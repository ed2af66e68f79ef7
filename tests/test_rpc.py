"""A target on llama.cpp's RPC backend: real `specllama rpc-server` processes on
127.0.0.1, real clients, greedy output equal to the local target's, clean failures."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import NO_RPC_REASON
from noise import split_noise, tolerance

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.engine import llama
from specllama.engine.llama import backend, rpc
from specllama.engine.llama.backend import rpc_available
from specllama.errors import RpcError
from specllama.policy.calibration import cache_key, cache_path

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
GREEDY = SamplingParams(temperature=0.0)
_USED_PORTS: set[int] = set()

pytestmark = pytest.mark.skipif(not rpc_available(), reason=NO_RPC_REASON)


def free_port() -> int:
    """A loopback port nobody listens on, never one an earlier test used: ggml keeps
    a connection per endpoint for the life of the process."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _USED_PORTS:
            _USED_PORTS.add(port)
            return port


@contextlib.contextmanager
def rpc_server_process(*extra: str):
    """`specllama rpc-server` on a free loopback port; yields (endpoint, process),
    killed at the end whatever happens."""
    port = free_port()
    proc = subprocess.Popen([SPECLLAMA, "rpc-server", "--port", str(port), "--threads", "1",
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                rpc.check_server(endpoint, timeout=2)
                break
            except RpcError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield endpoint, proc
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture(scope="module")
def server():
    """One server for the tests that connect from this process (it serves one
    client at a time, and this process keeps its connection)."""
    with rpc_server_process() as (endpoint, _):
        yield endpoint


def generate(target, draft, *, rpc_endpoints=(), draft_max=4, max_tokens=32, prompt="the cat"):
    dec = SpeculativeDecoder.load(target, draft, n_ctx=512, n_threads=1,
                                  target_rpc=rpc_endpoints)
    try:
        return dec.generate(prompt, max_tokens=max_tokens, sampling=GREEDY,
                            draft_max=draft_max)
    finally:
        dec.close()


# ----------------------------------------------------------------------- equal output


@pytest.mark.parametrize("draft_max", [0, 4])
def test_greedy_output_through_rpc_equals_local(server, tiny_target, tiny_draft, draft_max):
    local = generate(tiny_target, tiny_draft, draft_max=draft_max)
    remote = generate(tiny_target, tiny_draft, rpc_endpoints=[server], draft_max=draft_max)
    assert remote.tokens == local.tokens and len(remote.tokens) > 0
    assert remote.stats.target_at == f"rpc {server}"
    assert local.stats.target_at == "local CPU"
    if draft_max:
        assert remote.stats.drafted > 0 and remote.stats.accepted > 0
    assert remote.stats.target_s > 0  # remote decodes are waited for, so they are timed


def test_generate_command_through_rpc(server, tiny_target, tiny_draft):
    args = ["generate", "--target", tiny_target, "--draft", tiny_draft, "--threads", "1",
            "--n-ctx", "256", "--temperature", "0", "--max-tokens", "16", "--draft-max", "3",
            "the dog"]
    local = CliRunner().invoke(cli, [str(a) for a in args])
    remote = CliRunner().invoke(cli, [str(a) for a in args[:1] + ["--rpc", server] + args[1:]])
    assert local.exit_code == 0 and remote.exit_code == 0, remote.stderr
    assert remote.stdout == local.stdout
    assert f"rpc {server}" in remote.stderr and "local CPU" in local.stderr

    as_json = CliRunner().invoke(cli, [str(a) for a in args[:1] + ["--rpc", server, "--json"]
                                       + args[1:]])
    data = json.loads(as_json.stdout)
    assert data["settings"]["rpc"] == [server]
    assert data["stats"]["target_at"] == f"rpc {server}"


def test_auto_calibrates_the_remote_target_apart(server, tiny_target, tiny_draft):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                      str(tiny_draft), "--threads", "1", "--rpc", server,
                                      "--temperature", "0", "--max-tokens", "8", "hi"])
    assert result.exit_code == 0, result.stderr
    assert cache_key(tiny_target, 1, f"rpc {server}") != cache_key(tiny_target, 1)
    assert cache_path(tiny_target, 1, f"rpc {server}") != cache_path(tiny_target, 1)


def test_models_toml_target_rpc(server, tmp_path, tiny_target, tiny_draft):
    config = tmp_path / "models.toml"
    config.write_text(f"""
[pairs.remote]
target = {{ path = "{tiny_target}", rpc = ["{server}"] }}
draft = "{tiny_draft}"
""")
    args = ["generate", "--config", str(config), "--threads", "1", "--n-ctx", "256",
            "--temperature", "0", "--max-tokens", "12", "--draft-max", "3", "--json", "a b"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["settings"]["rpc"] == [server]
    local = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                     str(tiny_draft), *args[3:]])
    assert data["tokens"] == json.loads(local.stdout)["tokens"]
    shown = CliRunner().invoke(cli, ["pairs", "show", "remote", "--config", str(config)])
    assert f"target on:   rpc {server}" in shown.stdout


@pytest.mark.parametrize("value, message", [
    ('"127.0.0.1:50052"', 'pairs.remote.target.rpc: must be an array of "HOST:PORT" strings'),
    ('["nohost"]', "pairs.remote.target.rpc: expected HOST:PORT"),
    ('["h:99999"]', "pairs.remote.target.rpc: the port must be a number in 1..65535"),
    ("[]", "pairs.remote.target.rpc: must name at least one RPC server"),
])
def test_models_toml_rpc_mistakes(tmp_path, tiny_target, tiny_draft, value, message):
    config = tmp_path / "models.toml"
    config.write_text(f"""
[pairs.remote]
target = {{ path = "{tiny_target}", rpc = {value} }}
draft = "{tiny_draft}"
""")
    result = CliRunner().invoke(cli, ["generate", "--config", str(config), "hi"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr


# --------------------------------------------------------------------------- failures


def one_line_error(result, *parts):
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specllama: error: "), result.stderr
    for part in parts:
        assert part in lines[0]


def test_refused_connection_is_one_line(tiny_target, tiny_draft):
    endpoint = f"127.0.0.1:{free_port()}"  # nobody listens there
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                      str(tiny_draft), "--rpc", endpoint, "hi"])
    one_line_error(result, f"no RPC server at {endpoint}", "specllama rpc-server")


def test_bad_endpoint_is_one_line(tiny_target):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                      "lookup", "--rpc", "localhost", "hi"])
    one_line_error(result, "--rpc: expected HOST:PORT")


def test_a_server_that_never_answers_times_out(monkeypatch, tiny_target):
    """Accepts the connection, then says nothing (as a server busy with another
    client does): a bounded wait, then one line."""
    monkeypatch.setattr(rpc, "CHECK_TIMEOUT_S", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        _USED_PORTS.add(port)
        t0 = time.monotonic()
        result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                          "lookup", "--rpc", f"127.0.0.1:{port}", "hi"])
        assert time.monotonic() - t0 < 30
    one_line_error(result, "did not answer within 0.5 s", "busy")


def test_a_server_that_is_not_ggml_is_refused(tiny_target):
    """Answers HELLO with nonsense and closes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        _USED_PORTS.add(port)

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_target), "--draft",
                                          "lookup", "--rpc", f"127.0.0.1:{port}", "hi"])
        thread.join(10)
    assert result.exit_code == 2 and "RPC server" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sig, message", [
    (signal.SIGKILL, "lost the RPC server {}"),
    # stopped: the connection stays up but nothing answers (SPECLLAMA_RPC_TIMEOUT=3 below)
    (signal.SIGSTOP, "the RPC server {} has not answered for 3 s"),
])
def test_server_lost_mid_session_is_one_line(tiny_target, tiny_draft, tmp_path, sig, message):
    """A server that dies or stops while the models are loaded: the next generation
    ends the process with one line and exit code 2, promptly, without a C backtrace."""
    script = tmp_path / "client.py"
    script.write_text(f"""
import sys
from specllama import SamplingParams, SpeculativeDecoder
dec = SpeculativeDecoder.load({str(tiny_target)!r}, {str(tiny_draft)!r}, n_ctx=256,
                              n_threads=1, target_rpc=[sys.argv[1]])
print(dec.generate("hi", max_tokens=4, sampling=SamplingParams(temperature=0)).text,
      flush=True)
print("ready", flush=True)
sys.stdin.readline()
dec.generate("hello again", max_tokens=8, sampling=SamplingParams(temperature=0))
print("not reached", flush=True)
""")
    with rpc_server_process() as (endpoint, server_proc):
        client = subprocess.Popen([sys.executable, str(script), endpoint], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE,
                                  env={**os.environ, "SPECLLAMA_RPC_TIMEOUT": "3"})
        try:
            assert client.stdout is not None
            client.stdout.readline()
            assert client.stdout.readline().strip() == "ready"
            server_proc.send_signal(sig)
            if sig == signal.SIGKILL:
                server_proc.wait(10)
            out, err = client.communicate("go\n", timeout=60)
        finally:
            client.kill()
    assert client.returncode == 2, err
    assert "not reached" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("specllama: error: " + message.format(endpoint))


def test_chat_outlives_a_lost_server_and_retries(tiny_target, tiny_draft, tmp_path):
    """The target's RPC server dies mid-conversation: that turn ends with one line, the
    conversation stays, /retry fails in one line while the server is away and answers
    once it is back on the same port."""
    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    from servers import RpcServerProcess

    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "NO_COLOR": "1",
           "SPECLLAMA_CACHE_DIR": str(tmp_path / "cache")}
    port = free_port()
    rpc_server = RpcServerProcess(port)
    child = pexpect.spawn(SPECLLAMA, ["chat", "--target", str(tiny_target), "--draft",
                                      str(tiny_draft), "--rpc", rpc_server.endpoint,
                                      "--threads", "1", "--temperature", "0",
                                      "--max-tokens", "8"],
                          env=env, encoding="utf-8", timeout=60, dimensions=(40, 200))
    try:
        child.expect_exact("/help for commands")
        child.sendline("hello")
        child.expect(r"\d+ tok .*tok/s")
        # Ctrl-C mid-reply reaches the engine process; both caches stay consistent.
        child.sendline("/set max_tokens 2000")
        child.expect_exact("max_tokens = 2000")
        child.sendline("the cat and the dog")
        child.expect("\x1b\\[\\?2004l" + r"[^\x1b\r\n]{8}")  # the reply is under way
        child.sendintr()
        child.expect_exact("(interrupted)")
        child.sendline("/debug-cache")
        child.expect_exact("consistent=True")
        rpc_server.kill()
        child.sendline("hello again")
        child.expect_exact(f"lost the RPC server {rpc_server.endpoint}")
        child.expect_exact("the conversation is kept; /retry sends your message again")
        child.sendline("/retry")
        child.expect_exact("the target is still unreachable: ")
        rpc_server = RpcServerProcess(port)
        child.sendline("/retry")
        child.expect(r"\d+ tok .*tok/s")
        child.sendline("/stats")
        child.expect(r"conversation: \d+ of \d+ context tokens; 6 messages in context")
        child.sendline("/retry")
        child.expect_exact("nothing to retry")
        child.expect_exact("\x1b[?2004h")  # the prompt is back
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
        rpc_server.kill()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")


# ------------------------------------------------------------------------- the server


def test_rpc_server_refuses_a_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["rpc-server", "--port", str(port)])
    one_line_error(result, f"cannot listen on 127.0.0.1:{port}: in use")


def test_rpc_server_takes_an_ipv4_host():
    result = CliRunner().invoke(cli, ["rpc-server", "--host", "example.org"])
    one_line_error(result, "--host: expected an IPv4 address")


def test_rpc_server_stops_on_sigterm(tmp_path):
    with rpc_server_process("--cache", str(tmp_path / "rpc-cache")) as (endpoint, proc):
        assert (tmp_path / "rpc-cache").is_dir()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        _, err = proc.communicate(timeout=10)
    assert f"serving this machine's CPU on {endpoint}" in err.decode()
    assert "WARNING" not in err.decode()  # loopback: no warning


def test_a_build_without_rpc_names_the_fix():
    """What a build without GGML_RPC meets: the registry has no such function."""
    with pytest.raises(RpcError, match=r'CMAKE_ARGS="-DGGML_RPC=on" pip install'):
        backend._rpc_proc("ggml_backend_rpc_not_in_this_build", backend._ADD_SERVER)


def test_connections_to_the_server_get_keepalive(server, tiny_target):
    dec = SpeculativeDecoder.load(tiny_target, None, n_ctx=256, n_threads=1,
                                  target_rpc=[server])
    try:
        assert rpc.keep_alive([server]) >= 1  # the connection ggml computes over
    finally:
        dec.close()


# ------------------------------------------------------------- round trips per decode


def _bench_module():
    """bench/rpc_latency.py: its tracing proxy."""
    import bench.rpc_latency

    return bench.rpc_latency


def test_one_round_trip_per_decode_once_a_batch_size_is_warm(tiny_target):
    """The first decode of a new batch size asks the server for compute sizes, one
    synchronous GET_ALLOC_SIZE each (issue #16: at 5 ms each way this made T(k)/T(1)
    ~2 in calibration); warm_batch_sizes pays that untimed, after which a decode of
    any size waits for one reply (its logits), like a decode of one token."""
    bench = _bench_module()
    trace = bench.WireTrace()
    with rpc_server_process() as (endpoint, _):
        port = int(endpoint.rpartition(":")[2])
        proxy = bench.DelayProxy(port, 0, trace)
        local = llama.Model(tiny_target, n_ctx=256, n_threads=1)
        model = llama.Model(tiny_target, n_ctx=256, n_threads=1,
                            rpc=[f"127.0.0.1:{proxy.port}"])
        try:
            assert local.warm_batch_sizes([2, 3]) == 0 and local.decode_calls == 0
            prompt = model.tokenize("the cat sat on the mat")
            # the server runs this CPU's kernels on the same batches (bit-exact, measured);
            # this CPU's split noise is allowed, a cache holding other cells is not
            bound = tolerance(split_noise(local, prompt))
            for m in (model, local):
                m.decode(prompt, "last")
            counters = (model.decode_s, model.decode_calls, model.tokens_evaluated)
            trace.take()
            assert model.warm_batch_sizes([1, 3, 5, 3]) == 2
            warmed = [name for _, name, _ in trace.take()]
            assert "GET_ALLOC_SIZE" in warmed
            assert model.warm_batch_sizes([3, 5]) == 0
            assert model.cached == prompt and model.pos_max() == len(prompt) - 1
            assert (model.decode_s, model.decode_calls, model.tokens_evaluated) == counters
            for n in (1, 3, 5, 3, 1):
                step = prompt[:n]
                model.decode(step, "all")
                replied = [name for _, name, _ in trace.take() if name in bench.REPLIED]
                assert replied == ["GET_TENSOR"], (n, replied)
                local.decode(step, "all")
                for i in range(n):  # the cache holds what it should: same logits as local
                    np.testing.assert_allclose(model.logits_row(i), local.logits_row(i),
                                               atol=bound)
                model.truncate(len(prompt))
                local.truncate(len(prompt))
        finally:
            model.close()
            local.close()
            proxy.close()


@pytest.mark.parametrize("text, ok", [
    ("127.0.0.1:50052", True), ("gpu-box.local:1", True), ("10.0.0.2:65535", True),
    ("127.0.0.1", False), (":50052", False), ("h:0", False), ("h:65536", False),
    ("h:port", False), ("[::1]:50052", False),
])
def test_endpoints(text, ok):
    assert (rpc.endpoint_problem(text) is None) == ok


# ------------------------------------------------------------------ the real SmolLM2


@pytest.mark.slow
def test_smollm2_greedy_through_rpc_equals_local(smollm2_path):
    with rpc_server_process() as (endpoint, _):
        local = generate(smollm2_path, None, draft_max=0, max_tokens=24,
                         prompt="The capital of France is")
        remote = generate(smollm2_path, smollm2_path, rpc_endpoints=[endpoint], draft_max=3,
                          max_tokens=24, prompt="The capital of France is")
    assert remote.tokens == local.tokens
    assert remote.stats.drafted > 0
