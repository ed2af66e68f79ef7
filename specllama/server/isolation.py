"""The decoder in a child process, so that llama.cpp can die without the server.

llama.cpp aborts the process when its RPC client loses the server (GGML_ABORT) and on
some internal errors; the OOM killer ends it the same way. Python cannot catch that, so
`specllama serve` keeps its HTTP side in the parent and its models in an engine process
(multiprocessing's spawn: no fork of a threaded process). The two talk over one pipe:
the parent sends an Order, the child sends the request's events and then its Outcome.
A cancellation is one shared integer (cancel every order up to this id), read by the
child between rounds. When the child dies, `run` raises EngineLost with its last words
(backend.on_fatal) or its exit status, and the worker starts another (`start`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .. import Event, SpecLlamaError, SpeculativeDecoder
from ..engine.llama import backend
from .jobs import CALLS, Engine, Evaluated, Order, Outcome

#: What builds the decoder in the child, given whether this is the server's first
#: load; returns it, how to measure auto's costs, and what to tell the parent (the
#: settings it loaded with). Pickled by reference: a module-level function or a
#: functools.partial of one.
Factory = Callable[[bool], tuple[SpeculativeDecoder, Callable[[], None], Any]]

# A load that has not ended after this long is hung (an RPC server that accepted the
# connection and stopped answering mid-upload), not slow: the child is killed.
LOAD_BOUND_S = 600.0
_CLOSE_S = 30.0  # the child saves its draft cache on the way out


class EngineLost(SpecLlamaError):
    """The engine process died; `remote`: because its RPC server was lost or hung."""

    def __init__(self, message: str, remote: bool = False) -> None:
        super().__init__(message)
        self.remote = remote


@dataclass(frozen=True)
class _Ready:
    info: Any
    pid: int


@dataclass(frozen=True)
class _LoadFailed:
    error: BaseException


@dataclass(frozen=True)
class _LastWords:
    message: str
    remote: bool


@dataclass(frozen=True)
class _Call:
    name: str  # one of jobs.CALLS
    args: tuple[Any, ...]


@dataclass(frozen=True)
class _Reply:
    value: Any
    error: BaseException | None = None


class EngineProcess:
    """The parent's side: start (or start again) the child, run orders, close."""

    def __init__(self, factory: Factory, cache_bytes: int = 0) -> None:
        self._factory = factory
        self._cache_bytes = cache_bytes  # the prompt cache's limit (promptcache.py)
        self._mp = multiprocessing.get_context("spawn")
        self._cancel = self._mp.RawValue(ctypes.c_int64, 0)
        self._proc: Any = None
        self._conn: Connection | None = None
        self._last_words: _LastWords | None = None
        self.pid: int | None = None
        self.starts = 0

    def start(self) -> Any:
        """Load the pair in a new child; returns what the factory told. A load that
        fails raises its error (the first load's is the command's one-line error)."""
        self.kill()
        first = self.starts == 0
        self.starts += 1
        ours, theirs = self._mp.Pipe()
        proc = self._mp.Process(target=_child, args=(self._factory, first, theirs, self._cancel,
                                                     self._cache_bytes),
                                name="specllama-engine", daemon=True)
        self._proc, self._conn, self._last_words = proc, ours, None
        try:
            proc.start()
            theirs.close()
            if not ours.poll(LOAD_BOUND_S):
                raise EngineLost(f"loading the models took over {LOAD_BOUND_S:g} s; "
                                 "given up", remote=True)
            message = ours.recv()
        except EOFError:
            self.kill()
            raise self._lost() from None
        except BaseException:  # Ctrl-C while loading included: no child left behind
            self.kill()
            raise
        if isinstance(message, _LoadFailed):
            self.kill()
            raise message.error
        assert isinstance(message, _Ready)
        self.pid = message.pid
        return message.info

    def prepare(self) -> str | None:
        return None  # the child measured auto's costs before it said it was ready

    @property
    def running(self) -> bool:
        return self._conn is not None

    def run(self, order: Order, put: Callable[[Event | Evaluated], None],
            cancelled: Callable[[], bool]) -> Outcome:
        for message in self.messages(order):
            if isinstance(message, Outcome):
                return message
            put(message)
        raise EngineLost("the engine process sent no outcome")  # pragma: no cover

    def messages(self, order: Order) -> Iterator[Event | Evaluated | Outcome]:
        """Send the order; yield what comes back, its Outcome last."""
        conn = self._connection()
        try:
            conn.send(order)
            while True:
                message = self._receive(conn)
                yield message
                if isinstance(message, Outcome):
                    return
        except (EOFError, OSError):
            raise self._lost() from None

    def call(self, name: str, *args: Any) -> Any:
        """One of the Engine's CALLS, in the child; its value, or its error raised here."""
        assert name in CALLS, name
        conn = self._connection()
        try:
            conn.send(_Call(name, args))
            reply = self._receive(conn)
        except (EOFError, OSError):
            raise self._lost() from None
        assert isinstance(reply, _Reply)
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _connection(self) -> Connection:
        if self._conn is None:
            raise EngineLost("the engine process is not running")
        return self._conn

    def _receive(self, conn: Connection) -> Any:
        while isinstance(message := conn.recv(), _LastWords):
            self._last_words = message
        return message

    def cancel(self, order_id: int) -> None:
        """From any thread: the child stops the order at its next round."""
        if self._cancel.value < order_id:
            self._cancel.value = order_id

    def close(self) -> None:
        """Let the child close its decoder (its draft cache is saved), then make sure."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            self._proc.join(_CLOSE_S)
        self.kill()

    def kill(self) -> None:
        proc, self._proc, self.pid = self._proc, None, None
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(5)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _lost(self) -> EngineLost:
        """Why the child is gone: its last words, else its exit status."""
        proc = self._proc
        if proc is not None:
            proc.join(5)
        words = self._last_words
        if words is not None:
            return EngineLost(words.message, words.remote)
        code = proc.exitcode if proc is not None else None
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return EngineLost(f"the engine process was killed ({signal.Signals(-code).name})")
        return EngineLost(f"the engine process ended (exit status {code})")


# ------------------------------------------------------------------ the child's side
def _child(factory: Factory, first: bool, conn: Connection, cancel: Any,
           cache_bytes: int) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    lock = threading.Lock()

    def send(message: object) -> None:
        with lock:
            conn.send(message)

    def last_words(message: str, remote: bool) -> None:
        # From llama.cpp's abort or the RPC stall watch; the process ends right after.
        if lock.acquire(timeout=2):
            conn.send(_LastWords(message, remote))

    backend.on_fatal(last_words)
    try:
        decoder, prepare, info = factory(first)
    except BaseException as exc:
        send(_LoadFailed(_picklable(exc)))
        return
    engine = Engine(decoder, prepare, cache_bytes)
    why = engine.prepare()
    if why:
        print(why, file=sys.stderr)
    send(_Ready(info, multiprocessing.current_process().pid or 0))
    try:
        while (message := conn.recv()) is not None:
            if isinstance(message, _Call) and message.name in CALLS:
                try:
                    send(_Reply(getattr(engine, message.name)(*message.args)))
                except Exception as exc:
                    send(_Reply(None, _picklable(exc)))
                continue
            send(engine.run(message, send, functools.partial(_cancelled, cancel, message.id)))
    except (EOFError, OSError):  # the parent is gone
        pass
    finally:
        engine.close()


def _cancelled(cancel: Any, order_id: int) -> bool:
    return bool(cancel.value >= order_id)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return SpecLlamaError(f"{type(exc).__name__}: {exc}")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies, however it dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
