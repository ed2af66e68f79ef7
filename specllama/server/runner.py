"""Running the API: a listening socket, uvicorn, and a clean stop on Ctrl-C / SIGTERM.

On the first signal the server stops accepting connections, waiting requests are
answered 503, a non-streaming request in progress finishes, a stream in progress ends at
the next round (sse-starlette sees uvicorn's exit flag and tells the stream); then the
worker stops and `serve` returns the totals. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn

from .. import SpecLlamaError
from ..engine.llama import Vocabulary
from .app import create_app
from .config import GRACE_S, ServeConfig
from .jobs import Decoding
from .worker import Totals, Worker


class ServeError(SpecLlamaError):
    """The server cannot start (the address is taken or invalid)."""


def listen(host: str, port: int) -> socket.socket:
    """Bind now (before the models load), so a taken port is a one-line error at once."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker: Worker, on_ready: Callable[[], None]):
        super().__init__(config)
        self._worker = worker
        self._on_ready = on_ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # As uvicorn's, but without raising the signal again once stopped: for
        # `specllama serve` a stop by signal is the normal end (exit 0, totals).
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._worker.stop_accepting()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_ready()


def serve(
    engine: Decoding,
    vocab: Vocabulary,
    config: ServeConfig,
    sock: socket.socket,
    *,
    on_ready: Callable[[str], None],
    log: Callable[[str], None],
) -> Totals:
    """Serve until a signal; returns what was served. `sock` comes from `listen`;
    `engine`, started already, is closed on the way out; `vocab` is the target's."""
    worker = Worker(
        engine,
        max_waiting=config.max_waiting,
        draft_max=config.draft_max,
        drafters=config.drafters,
        log=log,
    )
    app = create_app(worker, config, vocab, log)
    server = _Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACE_S,
            # The backstop: uvicorn's plain-text 503, for a flood of connections (idle
            # ones, /health probes) past twice as many.
            limit_concurrency=2 * config.limit_concurrency,
        ),
        worker,
        lambda: on_ready(url_of(sock)),
    )
    worker.start()  # returns once `prepare` has run
    try:
        server.run(sockets=[sock])
    finally:
        worker.close()
        sock.close()
    return worker.totals
