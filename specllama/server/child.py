"""The engine process's side (isolation.py has the parent's): load the pair, then run
the orders and calls that come down the pipe, on one thread per slot (slots.py)."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .. import SpecLlamaError, SpeculativeDecoder
from ..engine.llama import backend
from ..engine.llama.batched import compute_bound
from .calls import CALLS
from .jobs import Failure, Order, Outcome
from .pipe import Call, Cancel, LastWords, LoadFailed, Ready, Reply, Tagged
from .slots import Slots

#: What builds the decoder in the child, given whether this is the server's first
#: load; returns it, how to measure auto's costs, and what to tell the parent (the
#: settings it loaded with). Pickled by reference: a module-level function or a
#: functools.partial of one.
Factory = Callable[[bool], tuple[SpeculativeDecoder, Callable[[], None], Any]]

CLOSE_S = 30.0  # the child saves its draft cache on the way out


def main(factory: Factory, first: bool, conn: Connection, cache_bytes: int) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    lock = threading.Lock()

    def send(message: object) -> None:
        with lock:
            conn.send(message)

    def last_words(message: str, remote: bool) -> None:
        # From llama.cpp's abort or the RPC stall watch; the process ends right after.
        if lock.acquire(timeout=2):
            conn.send(LastWords(message, remote))

    def lost(why: str) -> None:
        # The compute thread died or hangs (batched.py): every slot waits on it. Ending
        # here is the engine-lost path: the parent answers and starts another engine.
        last_words(why, False)
        os._exit(3)

    backend.on_fatal(last_words)
    backend.watch_local_decodes(compute_bound())  # one slot: no compute thread watches
    try:
        decoder, prepare, info = factory(first)
        slots = Slots(decoder, prepare, cache_bytes, lost)
    except BaseException as exc:
        send(LoadFailed(_picklable(exc)))
        return
    served = _Served(slots, send)
    try:
        why = served.start()
        if why:
            print(why, file=sys.stderr)
        send(Ready(info, multiprocessing.current_process().pid or 0, slots.n))
        while (message := conn.recv()) is not None:
            served.take(message)
    except (EOFError, OSError):  # the parent is gone
        pass
    finally:
        served.close()


class _Served:
    """The child's orders and calls, each run on one thread per slot (with one:
    every decode on that thread, `prepare`'s too; with more they decode on the
    batcher's thread)."""

    def __init__(self, slots: Slots, send: Callable[[object], None]) -> None:
        self.slots, self._send = slots, send
        self._todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._live: set[int] = set()  # orders received and not ended
        self._cancelled: set[int] = set()
        # Cancels of orders not (yet) received: kept for when the order comes. The
        # parent sends none before its Order (pipe.Link.cancel); this keeps a reordering
        # from losing one. Bounded: a Cancel that crossed its order's outcome stays here.
        self._early: deque[int] = deque(maxlen=64)
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._serve, name=f"specllama-slot-{i}",
                                          daemon=True) for i in range(slots.n)]

    def start(self) -> str | None:
        for thread in self._threads:
            thread.start()
        done: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._todo.put(lambda: done.put(self.slots.prepare()))
        return done.get()

    def take(self, message: Any) -> None:
        if isinstance(message, Cancel):
            with self._lock:
                if message.id in self._live:
                    self._cancelled.add(message.id)
                else:
                    self._early.append(message.id)
            return
        if isinstance(message, Order):
            with self._lock:
                self._live.add(message.id)
                if message.id in self._early:
                    self._early.remove(message.id)
                    self._cancelled.add(message.id)
        self._todo.put(message)

    def _serve(self) -> None:
        while (item := self._todo.get()) is not None:
            if callable(item):
                item()
            elif isinstance(item, Call):
                self._call(item)
            else:
                self._run(item)

    def _call(self, call: Call) -> None:
        try:
            reply = Reply(self.slots.call(call.name, *call.args)) if call.name in CALLS \
                else Reply(None, SpecLlamaError(f"no such call: {call.name}"))
        except Exception as exc:
            reply = Reply(None, _picklable(exc))
        self._send(Tagged(call.id, reply))

    def _run(self, order: Order) -> None:
        def put(message: object) -> None:
            self._send(Tagged(order.id, message))

        try:
            outcome = self.slots.run(order, put, lambda: order.id in self._cancelled)
        except Exception as exc:  # (Slot.run answers its own; this is the slots' failure)
            outcome = Outcome(None, Failure.of(exc))
        finally:
            with self._lock:
                self._live.discard(order.id)
                self._cancelled.discard(order.id)
        put(outcome)

    def close(self) -> None:
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join(CLOSE_S)
        self.slots.close()


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
