"""Remote devices on llama.cpp's RPC backend: endpoints, and a bounded check of a server.

ggml's own client aborts the whole process when it cannot connect, and its connect
has no timeout (a host that drops packets holds it for minutes). So before llama.cpp
sees an endpoint, `check_server` talks to it here with bounded timeouts: a TCP
connect, then ggml's HELLO, whose reply carries the server's protocol version.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import InvalidParameterError, RpcError

if TYPE_CHECKING:
    from .model import Model

DEFAULT_PORT = 50052
# ggml-rpc.h / ggml-rpc.cpp of llama.cpp as bundled with llama-cpp-python 0.3.36.
RPC_PROTO_MAJOR = 7
_CMD_HELLO = 14  # "RPC_CMD_HELLO must be always 14"
_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: the HELLO request is just these bytes
#: Seconds to wait for a server to accept and answer HELLO.
CHECK_TIMEOUT_S = 5.0


def endpoint_problem(text: str) -> str | None:
    """Why `text` is not HOST:PORT, or None."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port:
        return f"expected HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT}), got {text!r}"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"the port must be a number in 1..65535, got {text!r}"
    if any(c.isspace() for c in host) or host.startswith("["):
        return f"the host must be an IPv4 address or a host name, got {text!r}"
    return None


def check_endpoint(text: str, label: str = "--rpc") -> str:
    """HOST:PORT, stripped, or InvalidParameterError naming `label`."""
    problem = endpoint_problem(text)
    if problem is not None:
        raise InvalidParameterError(f"{label}: {problem}")
    return text.strip()


def check_host(host: str) -> str:
    """ggml's server binds with inet_addr, so it takes an IPv4 address only."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise InvalidParameterError(
            f"--host: expected an IPv4 address (127.0.0.1, 0.0.0.0, ...), got {host!r}"
        ) from None
    return host


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.IPv4Address(host).is_loopback


def check_server(endpoint: str, timeout: float | None = None) -> None:
    """Connect and say HELLO within `timeout` seconds each (default CHECK_TIMEOUT_S),
    or raise RpcError. The server serves one client at a time: one that does not
    answer is busy."""
    timeout = CHECK_TIMEOUT_S if timeout is None else timeout
    host, _, port = endpoint.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except ConnectionRefusedError:
        raise RpcError(f"no RPC server at {endpoint} (connection refused); start one there "
                       f"with: specllama rpc-server --host HOST --port {port}") from None
    except TimeoutError:
        raise RpcError(f"RPC server {endpoint} did not accept a connection within "
                       f"{timeout:g} s (host down, or a firewall?)") from None
    except OSError as exc:
        raise RpcError(f"cannot reach the RPC server {endpoint}: "
                       f"{exc.strerror or exc}") from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS_SIZE) + bytes(_CAPS_SIZE))
            size = struct.unpack("<Q", _recv_exactly(sock, 8))[0]
            reply = _recv_exactly(sock, size) if 0 < size < 1024 else b""
        except TimeoutError:
            raise RpcError(f"RPC server {endpoint} accepted but did not answer within "
                           f"{timeout:g} s (busy with another client?)") from None
        except OSError as exc:
            raise RpcError(f"RPC server {endpoint} closed the connection during the "
                           f"handshake ({exc.strerror or exc}); is it a ggml rpc-server?"
                           ) from None
    if len(reply) < 3:
        raise RpcError(f"{endpoint} did not answer like a ggml RPC server")
    major, minor, patch = reply[0], reply[1], reply[2]
    if major != RPC_PROTO_MAJOR:
        raise RpcError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this "
                       f"client {RPC_PROTO_MAJOR}.x; install the same specllama and "
                       "llama-cpp-python version on both machines")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError(104, "connection closed")
        data += chunk
    return data


def keep_alive(endpoints: list[str]) -> int:
    """Turn on TCP keepalive for this process's connections to `endpoints`, so a
    server whose host vanishes mid-generation fails in ~20 s instead of hanging.
    ggml owns these sockets; options belong to the socket, so a dup'ed fd can set
    them. Linux only (/proc). Returns the number of sockets changed."""
    peers: set[tuple[str, int]] = set()
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        try:
            peers.add((socket.gethostbyname(host), int(port)))
        except OSError:
            continue
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    changed = 0
    for fd in fds:
        try:
            copy = os.dup(fd)
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.getpeername()[:2] not in peers:
                    continue
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 3),
                                    ("TCP_KEEPCNT", 5), ("TCP_USER_TIMEOUT", 20_000)):
                    if hasattr(socket, name):
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
                changed += 1
            except OSError:
                continue
    return changed


def warm_batch_sizes(model: Model, sizes: Sequence[int]) -> int:
    """On RPC devices: decode each batch size of `sizes` once (logits of every row),
    untimed, and cut the cache and the counters back, so a measurement that follows
    times what a decode of that size costs from then on. Local models: nothing.
    Returns the number of decodes made.

    Why: the first decode of a new batch shape makes ggml's RPC client ask the server
    for the compute size of each MUL_MAT shape, one synchronous round trip each (five
    for a llama-type model; ggml-rpc.cpp get_alloc_size, cached per shape); a shape
    seen before waits for one reply only. Not worth it before generation: one decode
    costs more than the round trips it saves."""
    if not model.rpc:
        return 0
    base = len(model.cached)
    todo = [n for n in dict.fromkeys(int(n) for n in sizes) if 1 < n <= model.n_batch
            and n not in model.shared.warm_sizes and base + n <= model.n_ctx]
    if not todo:
        return 0
    saved = (model.decode_s, model.decode_calls, model.tokens_evaluated)
    try:
        for n in todo:
            model.decode([model._stand_in] * n, "all")
            model.truncate(base)
            model.shared.warm_sizes.add(n)
    finally:
        model.truncate(base)
        model.decode_s, model.decode_calls, model.tokens_evaluated = saved
    return len(todo)
