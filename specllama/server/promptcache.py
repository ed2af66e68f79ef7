"""The prompt cache across requests: KV caches of earlier prompts, kept in memory.

The models' KV caches hold one text, the last request's. A request that shares only a
short prefix with it but a long one with an earlier request (two conversations taking
turns, an agent's scratchpad after a side question, one of several system prompts)
would evaluate that long prefix again. Before a request cuts the live caches back, the
cache keeps a copy of them (llama.cpp's sequence state, both models); a request that
shares more with a copy than with the live caches gets the copy back, cut to the
shared prefix. Copies are bounded in bytes and the least recently used leave first;
a copy's size is known before it is made, so none is made that would not fit. A copy
llama.cpp will not take back is dropped and the prompt evaluated afresh.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..engine.llama import KVState, Model
from ..engine.llama.backend import lc
from ..engine.llama.batched import SeqView
from ..errors import KVCacheError

#: Fewer shared tokens than this are evaluated again rather than copied back and forth:
#: a copy moves the whole cache, a few tokens cost less than that.
MIN_GAIN = 32


@dataclass(frozen=True)
class CacheFigures:
    """What /health and /metrics report."""

    entries: int = 0
    bytes: int = 0
    limit_bytes: int = 0
    hits: int = 0  # requests that got a copy back
    misses: int = 0  # requests that shared at most MIN_GAIN tokens with every copy
    tokens_restored: int = 0  # prompt tokens not evaluated again thanks to a copy
    restore_failures: int = 0  # copies llama.cpp would not take back (then dropped)


@dataclass(frozen=True)
class _Entry:
    target: KVState
    draft: KVState | None

    @property
    def size(self) -> int:
        return len(self.target.data) + (len(self.draft.data) if self.draft else 0)


def shared(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    """The length of the common prefix (of a tuple and a list too)."""
    n = min(len(a), len(b))
    head_a, head_b = list(a[:n]), list(b[:n])
    if head_a == head_b:  # the usual case, at C speed
        return n
    return next(i for i, (x, y) in enumerate(zip(head_a, head_b)) if x != y)


def state_size(model: Model) -> int:
    """The bytes `model.save_state()` would copy, known without copying: llama.cpp
    counts them with a writer that writes nothing."""
    # A view's context is shared: its cells change under the batcher's lock (batched.py).
    lock = model.batcher.lock if isinstance(model, SeqView) else contextlib.nullcontext()
    with lock:
        return int(lc.llama_state_seq_get_size(model.shared.ctx, model.seq))


def available_memory() -> int | None:
    """Bytes this machine can give a process now: /proc/meminfo's MemAvailable (else the
    physical memory), or a cgroup v2 limit where that is lower; None if unknown."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    with contextlib.suppress(OSError, ValueError):  # "max": no limit
        found.append(int(Path("/sys/fs/cgroup/memory.max").read_text()))
    return max(0, min(found)) if found else None


def beyond_memory(limit_bytes: int) -> str | None:
    """Why `limit_bytes` of copies cannot be had here; None when they can."""
    have = available_memory()
    if have is None or limit_bytes <= have:
        return None
    return (f"{limit_bytes >> 20} MiB is more than this machine has available "
            f"({have >> 20} MiB)")


class PromptCache:
    """Copies of the target's (and a same-vocabulary draft model's) KV caches, keyed by
    the target's tokens, at most `limit_bytes` in all."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(0, limit_bytes)
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = self.tokens_restored = self.restore_failures = 0
        self._lock = threading.Lock()  # `serve --parallel`: one cache, several slots

    def figures(self) -> CacheFigures:
        return CacheFigures(len(self._entries), self._bytes, self.limit_bytes, self.hits,
                            self.misses, self.tokens_restored, self.restore_failures)

    def prepare(self, prompt: list[int], target: Model, draft: Model | None,
                sibling: bool = False) -> int:
        """Before `prompt` is evaluated: keep a copy of the live caches if the prompt
        would drop much of them, and bring back the copy that shares most with the
        prompt where it beats the live caches. Returns the prompt tokens restored.
        sibling: a later choice of one request: live caches that hold the whole prompt
        hold an earlier choice's answer after it, not kept (one copy a request)."""
        if self.limit_bytes == 0:
            return 0
        with self._lock:
            return self._prepare(prompt, target, draft, sibling)

    def _prepare(self, prompt: list[int], target: Model, draft: Model | None,
                 sibling: bool) -> int:
        live = shared(target.cached, prompt)
        best, best_key = live, None
        for key in self._entries:
            n = shared(key, prompt)
            if n > best:
                best, best_key = n, key
        entry = None
        if best_key is not None and best - live > MIN_GAIN:
            entry = self._entries[best_key]
            self._entries.move_to_end(best_key)  # so the copy of the live caches keeps it
        # (a cache an interrupt left mid-update is sync_to's to repair, not to keep)
        keep = not (sibling and live == len(prompt))
        if keep and len(target.cached) - live > MIN_GAIN and \
                target.pos_max() + 1 == len(target.cached):
            self._put(target, draft)
        if entry is None or best_key is None:
            self.misses += live <= MIN_GAIN
            return 0
        try:
            target.restore(entry.target)
            target.truncate(best)
        except KVCacheError:
            # llama.cpp could not place or read it: the prompt is evaluated afresh from
            # an empty cache, and the copy, likely to fail again, goes.
            target.clear()
            self._refused(best_key)
            return 0
        if draft is not None and entry.draft is not None:
            try:
                draft.restore(entry.draft)  # the draft's own prompt: the drafter syncs it
            except KVCacheError:
                draft.clear()  # (the drafter evaluates it again)
                self._refused(best_key)
        self.hits += 1
        self.tokens_restored += best - live
        return best - live

    def _refused(self, key: tuple[int, ...]) -> None:
        self.restore_failures += 1
        if key in self._entries:  # (unless the copy of the live caches pushed it out)
            self._drop(key)

    def _put(self, target: Model, draft: Model | None) -> None:
        # Sized before it is made: a copy that cannot fit is never made, and room is
        # made first, so the copies stay within the limit even while one is taken.
        size = state_size(target) + (state_size(draft) if draft is not None else 0)
        if size > self.limit_bytes:
            return
        key = tuple(target.cached)
        for old in [k for k in self._entries if shared(k, key) == len(k)]:
            self._drop(old)  # a copy of a prefix of this text adds nothing
        while self._entries and self._bytes + size > self.limit_bytes:
            self._drop(next(iter(self._entries)))
        try:
            entry = _Entry(target.save_state(),
                           draft.save_state() if draft is not None else None)
        except KVCacheError:  # a copy is only a saving: the request goes on without it
            return
        self._entries[key] = entry
        self._bytes += entry.size
        while self._bytes > self.limit_bytes:  # (never, unless llama.cpp wrote more)
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self._bytes -= self._entries.pop(key).size
