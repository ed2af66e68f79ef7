"""`specllama rpc-server`: ggml's own RPC server on this machine's CPU, so another
machine can run a target here (`--rpc HOST:PORT` there)."""

from __future__ import annotations

import errno
import os
import signal
import socket
from pathlib import Path

import click

from ..engine.llama.backend import serve_rpc
from ..engine.llama.rpc import DEFAULT_PORT, check_host, is_loopback
from ..errors import RpcError

# The warning llama.cpp's own rpc-server prints (tools/rpc/rpc-server.cpp).
UNAUTHENTICATED_WARNING = """
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
WARNING: Host ('{host}') is != '127.0.0.1'
         Never expose the RPC server to an open network!
         This is an experimental feature and is not secure!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
"""


def _check_port_free(host: str, port: int) -> None:
    """ggml's server reports a taken port only as 'Failed to create server socket'."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml does
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise RpcError(f"cannot listen on {host}:{port}: {why}") from None


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (an IPv4 address; 0.0.0.0 for every interface).")
@click.option("--port", default=DEFAULT_PORT, show_default=True,
              type=click.IntRange(1, 65535), help="TCP port to listen on.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads for the models it runs (default: all cores).")
@click.option("--cache", "cache", metavar="DIR", default=None,
              help="Keep the large tensors clients send in DIR, so reloading a model "
              "skips sending them again.")
def rpc_server(host: str, port: int, threads: int | None, cache: str | None) -> None:
    """Serve this machine's CPU to specllama (--rpc HOST:PORT) on other machines.

    This is llama.cpp's RPC server: it runs whatever a client sends and has no
    authentication, so keep it on a trusted network."""
    check_host(host)
    cache_dir = None
    if cache is not None:
        cache_dir = Path(cache).expanduser().resolve()
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RpcError(f"--cache: cannot create {cache_dir}: {exc.strerror}") from None
    _check_port_free(host, port)
    if not is_loopback(host):
        click.echo(UNAUTHENTICATED_WARNING.format(host=host), err=True)
    click.echo(f"specllama rpc-server: serving this machine's CPU on {host}:{port}; "
               f"use it with --rpc {host}:{port} (Ctrl-C stops)", err=True)
    # The server loops inside C: let Ctrl-C and SIGTERM end the process at once
    # (it holds nothing that could be left half-written).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    serve_rpc(host, port, n_threads=threads or max(1, os.cpu_count() or 1), cache_dir=cache_dir)
    raise RpcError(f"the RPC server on {host}:{port} could not start (see the lines above)")
