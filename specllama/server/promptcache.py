"""The prompt cache across requests: KV caches of earlier prompts, kept in memory.

The models' KV caches hold one text, the last request's. A request that shares only a
short prefix with it but a long one with an earlier request (two conversations taking
turns, an agent's scratchpad after a side question, one of several system prompts)
would evaluate that long prefix again. Before a request cuts the live caches back, the
cache keeps a copy of them (llama.cpp's sequence state, both models); a request that
shares more with a copy than with the live caches gets the copy back, cut to the
shared prefix. Copies are bounded in bytes and the least recently used leave first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..engine.llama import KVState, Model

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


class PromptCache:
    """Copies of the target's (and a same-vocabulary draft model's) KV caches, keyed by
    the target's tokens, at most `limit_bytes` in all."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(0, limit_bytes)
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = self.tokens_restored = 0
        self._lock = threading.Lock()  # `serve --parallel`: one cache, several slots

    def figures(self) -> CacheFigures:
        return CacheFigures(len(self._entries), self._bytes, self.limit_bytes, self.hits,
                            self.misses, self.tokens_restored)

    def prepare(self, prompt: list[int], target: Model, draft: Model | None) -> int:
        """Before `prompt` is evaluated: keep a copy of the live caches if the prompt
        would drop much of them, and bring back the copy that shares most with the
        prompt where it beats the live caches. Returns the prompt tokens restored."""
        if self.limit_bytes == 0:
            return 0
        with self._lock:
            return self._prepare(prompt, target, draft)

    def _prepare(self, prompt: list[int], target: Model, draft: Model | None) -> int:
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
        if len(target.cached) - live > MIN_GAIN and target.pos_max() + 1 == len(target.cached):
            self._put(target, draft)
        if entry is None:
            self.misses += live <= MIN_GAIN
            return 0
        target.restore(entry.target)
        target.truncate(best)
        if draft is not None and entry.draft is not None:
            draft.restore(entry.draft)  # the draft's own prompt: the drafter syncs it
        self.hits += 1
        self.tokens_restored += best - live
        return best - live

    def _put(self, target: Model, draft: Model | None) -> None:
        key = tuple(target.cached)
        for old in [k for k in self._entries if shared(k, key) == len(k)]:
            self._drop(old)  # a copy of a prefix of this text adds nothing
        entry = _Entry(target.save_state(), draft.save_state() if draft is not None else None)
        if entry.size > self.limit_bytes:
            return
        self._entries[key] = entry
        self._bytes += entry.size
        while self._bytes > self.limit_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self._bytes -= self._entries.pop(key).size
