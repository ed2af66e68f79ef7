"""How one sequence of a model's memory drops a suffix, by the cheapest exact path.

Speculation cuts rejected drafts out of every cache each round. A transformer's KV cache
drops cells. A recurrent or hybrid model (Mamba, Qwen3.5, LFM2, ...) keeps a running state
instead, and llama.cpp can bring back an earlier one only in some cases, so each cut takes
the first path that is exact:

- "trim": a KV cache drops the cells (`llama_memory_seq_rm`).
- "snapshot": llama.cpp keeps per-token states (`n_rs_seq`) for the archs it lists
  (qwen35, lfm2, nemotron_h, ...), but only those *inside the last decoded batch*: a cut
  may go back at most `n_rs_seq` tokens, must keep that batch's first token, and only
  once per decode. Outside that, `llama_memory_seq_rm` still returns True and leaves a
  stale state (logits off by up to 1.9 on a tiny qwen35), so the return value proves
  nothing and these conditions are checked here.
- "copy": a checkpoint of the state in a spare sequence (`llama_memory_seq_cp`, which
  shares the attention cells and copies the recurrent state on write), taken before the
  tokens that may go; the cut puts it back, and the kept tokens after it are owed
  (`Model.owed`): the next batch decodes them first, so a round cut back this way costs
  a wider next batch, not a decode of its own.
- "redecode": from nothing, every kept token again (owed the same way): the last
  resort, correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .backend import lc

RewindPath = Literal["trim", "snapshot", "copy", "redecode"]
#: How a model's memory is cut back at best: "trim" (a KV cache), "snapshot" or "copy".
Rewind = Literal["trim", "snapshot", "copy"]
#: Per-token states llama.cpp keeps for a rollback (`n_rs_seq`): the longest draft a
#: target verifies in one batch and still cuts back without a copy (auto drafts 8 at
#: most). Each costs one recurrent state per sequence and its spare: 19 MiB each on the
#: qwen3.5-2b layout, ~50 MiB on a Qwen3.5 9B (docs/lab/2026-12-hybrid-mtp.md).
SNAPSHOTS = 8


@dataclass
class Rewinds:
    """How many cuts took each path, and the tokens decoded again because of them."""

    trim: int = 0
    snapshot: int = 0
    copy: int = 0
    redecode: int = 0
    redecoded_tokens: int = 0
    checkpoints: int = 0

    def paths(self) -> tuple[RewindPath, ...]:
        """The paths that ran, cheapest first."""
        order: tuple[RewindPath, ...] = ("trim", "snapshot", "copy", "redecode")
        return tuple(p for p in order if getattr(self, p))

    def since(self, before: Rewinds) -> Rewinds:
        """The counts added after `before` (a copy taken then)."""
        return Rewinds(*(getattr(self, n) - getattr(before, n) for n in _FIELDS))

    def describe(self, best: Rewind) -> str:
        """One line for the stats: how a model's cuts ran ("" for a KV cache)."""
        if best == "trim":
            return ""
        done = [f"{getattr(self, p)} {p}" for p in self.paths()]
        if self.redecoded_tokens:
            done.append(f"{self.redecoded_tokens} tokens decoded again")
        return f"{best} ({', '.join(done) or 'no cuts'})"


_FIELDS = ("trim", "snapshot", "copy", "redecode", "redecoded_tokens", "checkpoints")


@dataclass
class Rewinder:
    """The bookkeeping of one sequence: its last batch, whether that batch was already
    rolled back, and its checkpoint (a position of the spare sequence's copy)."""

    mem: Any
    seq: int
    spare: int  # the sequence holding the checkpoint (-1: no spare, "trim" models)
    best: Rewind
    rollback_max: int  # n_rs_seq as llama.cpp granted it (0 outside "snapshot")
    batch_start: int = -1  # the first position of the last decoded batch
    batch_end: int = -1  # one past its last position
    rolled: bool = True  # a rollback happened since that decode (none is possible now)
    mark: int | None = None  # the checkpoint's position, if one is held
    last: RewindPath | None = None  # the path the latest cut took
    counts: Rewinds = field(default_factory=Rewinds)

    def for_seq(self, seq: int, spare: int) -> Rewinder:
        """The same memory seen from another sequence (`serve --parallel`)."""
        return Rewinder(self.mem, seq, spare, self.best, self.rollback_max)

    # ------------------------------------------------------------ what happened
    def decoded(self, start: int, end: int) -> None:
        """A batch of positions start..end-1 landed."""
        self.batch_start, self.batch_end, self.rolled = start, end, False

    def failed(self) -> None:
        """A decode failed: what the state holds past its start is not known."""
        self.rolled = True

    def forget(self) -> None:
        """The sequence was cleared or replaced: no snapshot or checkpoint holds."""
        self.rolled = True
        self.batch_start = self.batch_end = -1
        self._drop_mark()

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, length: int, next_batch: int | None) -> None:
        """The state of the first `length` tokens may be wanted back. next_batch: the
        one batch that follows, if a cut will keep at least its first token (a verify
        pass); llama.cpp's snapshots cover that when they reach far enough."""
        if self.best == "trim":
            return
        if next_batch is not None and self.best == "snapshot" \
                and next_batch - 1 <= self.rollback_max:
            return
        self._drop_mark()
        lc.llama_memory_seq_cp(self.mem, self.seq, self.spare, -1, -1)
        self.mark = length
        self.counts.checkpoints += 1

    def _drop_mark(self) -> None:
        if self.mark is not None:
            lc.llama_memory_seq_rm(self.mem, self.spare, -1, -1)
            self.mark = None

    # ------------------------------------------------------------ cutting
    def plan(self, n: int, length: int) -> RewindPath:
        """The path a cut from `length` tokens to `n` takes."""
        if self.best == "trim":
            return "trim"
        if self.best == "snapshot" and not self.rolled and length == self.batch_end \
                and self.batch_start < n and length - n <= self.rollback_max:
            return "snapshot"
        if self.mark is not None and self.mark <= n:
            return "copy"
        return "redecode"

    def cut(self, n: int, length: int) -> int:
        """Cut the sequence from `length` tokens to `n`; returns how many tokens it
        really holds afterwards (n, or fewer: the caller decodes the rest again)."""
        if n == 0:  # everything goes: no state to take back (a new prompt)
            self.forget()
            return 0 if lc.llama_memory_seq_rm(self.mem, self.seq, -1, -1) else -1
        path = self.last = self.plan(n, length)
        if self.mark is not None and n < self.mark:
            self._drop_mark()  # it holds tokens the sequence no longer has
        if path in ("trim", "snapshot"):
            ok = lc.llama_memory_seq_rm(self.mem, self.seq, n, -1)
            if not ok:
                return -1  # refused: the caller reports it
            setattr(self.counts, path, getattr(self.counts, path) + 1)
            if path == "snapshot":
                self.rolled = True
                self.batch_end = n
            elif self.batch_end > n:
                self.batch_end = n
            return n
        lc.llama_memory_seq_rm(self.mem, self.seq, -1, -1)
        self.rolled = True
        self.batch_start = self.batch_end = -1
        if path == "copy":
            assert self.mark is not None
            lc.llama_memory_seq_cp(self.mem, self.spare, self.seq, -1, -1)
            self.counts.copy += 1
            return self.mark
        self.counts.redecode += 1
        self._drop_mark()
        return 0


def memory_kind(model: Any) -> str:
    """"transformer", "recurrent" (Mamba, RWKV) or "hybrid" (attention plus recurrent layers)."""
    if lc.llama_model_is_recurrent(model):
        return "recurrent"
    is_hybrid = getattr(lc, "llama_model_is_hybrid", None)  # newer llama.cpp only
    if is_hybrid is not None and is_hybrid(model):
        return "hybrid"
    return "transformer"
