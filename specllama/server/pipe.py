"""The pipe between `specllama serve` and its engine process (isolation.py, child.py):
the messages, and the parent's end, which hands each message to the order it is for."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any


@dataclass(frozen=True)
class Ready:
    info: Any
    pid: int
    slots: int  # requests served at once: the sequences the models were loaded with


@dataclass(frozen=True)
class LoadFailed:
    error: BaseException


@dataclass(frozen=True)
class LastWords:
    message: str
    remote: bool


@dataclass(frozen=True)
class Call:
    id: int  # negative: apart from orders' ids
    name: str  # one of calls.CALLS
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Reply:
    value: Any
    error: BaseException | None = None


@dataclass(frozen=True)
class Tagged:
    """A message of one order (or call) from the child: orders run side by side."""

    id: int
    message: Any


@dataclass(frozen=True)
class Cancel:
    id: int


GONE = object()  # the child is gone: every order waiting hears it


class Link:
    """One child's pipe: a reader thread hands each message to the order it belongs to."""

    def __init__(self, conn: Connection, proc: Any = None) -> None:
        """proc: the child at the other end (its exit status says why it is gone)."""
        self.conn = conn
        self.proc = proc
        self.last_words: LastWords | None = None  # from llama.cpp's abort, if it came
        self._queues: dict[int, queue.SimpleQueue[Any]] = {}
        self._lock = threading.Lock()  # the queues, and sending
        self._gone = False
        self._reader = threading.Thread(target=self._read, name="specllama-engine-pipe",
                                        daemon=True)
        self._reader.start()

    def exchange(self, id_: int, message: Any,
                 sent: Callable[[], None] | None = None) -> Generator[Any, None, None]:
        """Send a message (an Order or a Call); yield what comes back for it. `sent`
        runs once it is on its way, before the first wait."""
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            if self._gone:
                raise EOFError
            self._queues[id_] = inbox
            try:
                self.conn.send(message)
            except BaseException:
                del self._queues[id_]
                raise
        try:
            if sent is not None:
                sent()
            while (item := inbox.get()) is not GONE:
                yield item
            raise EOFError
        finally:
            with self._lock:
                self._queues.pop(id_, None)

    def send(self, message: Any) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            if not self._gone:
                self.conn.send(message)

    def cancel(self, id_: int) -> None:
        """Cancel order `id_` if it is in flight. Under the lock its Order is sent with:
        a Cancel never overtakes its Order (the child would not know it yet), and none
        goes out for an order whose outcome has been read."""
        with self._lock, contextlib.suppress(OSError, ValueError):
            if not self._gone and id_ in self._queues:
                self.conn.send(Cancel(id_))

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if isinstance(message, LastWords):
                    self.last_words = message
                    continue
                assert isinstance(message, Tagged)
                with self._lock:
                    inbox = self._queues.get(message.id)
                if inbox is not None:
                    inbox.put(message.message)
        except (EOFError, OSError, ValueError):
            pass
        with self._lock:
            self._gone = True
            for inbox in self._queues.values():
                inbox.put(GONE)
