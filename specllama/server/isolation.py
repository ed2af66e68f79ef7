"""The decoder in a child process, so that llama.cpp can die without the server.

llama.cpp aborts the process when its RPC client loses the server (GGML_ABORT) and on
some internal errors; the OOM killer ends it the same way. Python cannot catch that, so
`specllama serve` keeps its HTTP side in the parent and its models in an engine process
(multiprocessing's spawn: no fork of a threaded process). The two talk over one pipe:
the parent sends an Order, the child sends the request's events and then its Outcome.
With `serve --parallel N` several orders run at once, each message tagged with its
order's id (pipe.py); a cancellation is a message too, read by the child between
rounds and a long prompt's steps, and sent only after its order. When the child dies,
`run` raises EngineLost with its last words (backend.on_fatal) or its exit status, and
the worker starts another (`start`).
The child's side is child.py.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import SpecLlamaError
from . import child
from .calls import CALLS
from .child import CLOSE_S, Factory
from .jobs import Item, Order, Outcome
from .pipe import Call, LastWords, Link, LoadFailed, Ready, Reply

__all__ = ["EngineLost", "EngineProcess", "Factory"]


# A load that has not ended after this long is hung (an RPC server that accepted the
# connection and stopped answering mid-upload), not slow: the child is killed.
LOAD_BOUND_S = 600.0


class EngineLost(SpecLlamaError):
    """The engine process died; `remote`: because its RPC server was lost or hung."""

    def __init__(self, message: str, remote: bool = False) -> None:
        super().__init__(message)
        self.remote = remote


class EngineProcess:
    """The parent's side: start (or start again) the child, run orders (several at once
    with `parallel` > 1), close."""

    def __init__(self, factory: Factory, cache_bytes: int = 0) -> None:
        self._factory = factory
        self._cache_bytes = cache_bytes  # the prompt cache's limit (promptcache.py)
        self.parallel = 1  # orders served at once (slots.py), as the child tells
        self._mp = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._link: Link | None = None
        self._calls = itertools.count(-1, -1)
        self.pid: int | None = None
        # Two threads reaping one child at once: one waitpid gets its status, the other
        # an error, and multiprocessing then reports no exit status at all.
        self._reaping = threading.Lock()
        self.starts = 0

    def start(self) -> Any:
        """Load the pair in a new child; returns what the factory told. A load that
        fails raises its error (the first load's is the command's one-line error)."""
        self.kill()
        first = self.starts == 0
        self.starts += 1
        ours, theirs = self._mp.Pipe()
        proc = self._mp.Process(target=child.main, args=(self._factory, first, theirs,
                                                     self._cache_bytes),
                                name="specllama-engine", daemon=True)
        self._proc, words = proc, None
        try:
            with _main_script_hidden():
                proc.start()
            theirs.close()
            if not ours.poll(LOAD_BOUND_S):
                raise EngineLost(f"loading the models took over {LOAD_BOUND_S:g} s; "
                                 "given up", remote=True)
            while isinstance(message := ours.recv(), LastWords):
                words = message
        except EOFError:
            ours.close()
            self.kill()
            raise self._lost(proc, words) from None
        except BaseException:  # Ctrl-C while loading included: no child left behind
            ours.close()
            self.kill()
            raise
        if isinstance(message, LoadFailed):
            ours.close()
            self.kill()
            raise message.error
        assert isinstance(message, Ready)
        self._link = Link(ours, proc)
        self.pid = message.pid
        self.parallel = message.slots
        return message.info

    def prepare(self) -> str | None:
        return None  # the child measured auto's costs before it said it was ready

    @property
    def running(self) -> bool:
        return self._link is not None

    def run(self, order: Order, put: Callable[[Item], None],
            cancelled: Callable[[], bool]) -> Outcome:
        """As Slot.run, in the child. `cancelled` is read before the order is sent,
        once it is sent and at every message back; a cancel between those reads comes
        through `cancel` (the worker's Job.on_cancel), so none is lost."""
        if cancelled():
            return Outcome(None)
        for message in self.messages(order, cancelled):
            if isinstance(message, Outcome):
                return message
            put(message)
        raise EngineLost("the engine process sent no outcome")  # pragma: no cover

    def messages(self, order: Order, cancelled: Callable[[], bool] = lambda: False,
                 ) -> Iterator[Item | Outcome]:
        """Send the order; yield what comes back, its Outcome last. Once `cancelled()`
        the child is told to stop it."""
        link = self._connection()
        told = False

        def check() -> None:
            nonlocal told
            if not told and cancelled():
                told = True
                link.cancel(order.id)

        try:
            for message in link.exchange(order.id, order, sent=check):
                yield message
                if isinstance(message, Outcome):
                    return
                check()
        except (EOFError, OSError):
            raise self._lost(link.proc, link.last_words) from None

    def call(self, name: str, *args: Any) -> Any:
        """One of ChatCalls' CALLS (calls.py), in the child; its value, or its error raised here."""
        assert name in CALLS, name
        link = self._connection()
        call_id = next(self._calls)
        replies = link.exchange(call_id, Call(call_id, name, args))
        try:
            reply = next(replies)
        except (EOFError, OSError, StopIteration):
            raise self._lost(link.proc, link.last_words) from None
        finally:
            replies.close()
        assert isinstance(reply, Reply)
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _connection(self) -> Link:
        if self._link is None:
            raise EngineLost("the engine process is not running")
        return self._link

    def cancel(self, order_id: int) -> None:
        """From any thread: the child stops the order at its next round (an order not
        sent yet, or ended, is not told: `run` reads `cancelled` once it is sent)."""
        link = self._link
        if link is not None:
            link.cancel(order_id)

    def close(self) -> None:
        """Let the child close its decoder (its draft cache is saved), then make sure."""
        if self._link is not None and self._proc is not None and self._proc.is_alive():
            self._link.send(None)
            self._proc.join(CLOSE_S)
        self.kill()

    def kill(self) -> None:
        proc, self._proc, self.pid = self._proc, None, None
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            with self._reaping:
                proc.join(5)
        if self._link is not None:
            self._link.conn.close()
            self._link = None

    def _lost(self, proc: Any, words: LastWords | None) -> EngineLost:
        """Why the child `proc` is gone: its last words, else its exit status. (The
        caller names the child its own link reached: another thread may be starting
        the next one meanwhile.)"""
        if proc is not None:
            with self._reaping:
                proc.join(5)
        if words is not None:
            return EngineLost(words.message, words.remote)
        code = proc.exitcode if proc is not None else None
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return EngineLost(f"the engine process was killed ({signal.Signals(-code).name})")
        return EngineLost(f"the engine process ended (exit status {code})")


@contextlib.contextmanager
def _main_script_hidden() -> Iterator[None]:
    """spawn runs the parent's main script again in the child (as __mp_main__): for the
    `specllama` command, all of cli/. The factories live in importable modules (loading.py),
    so the engine process starts without it."""
    main = sys.modules["__main__"]
    path = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path
