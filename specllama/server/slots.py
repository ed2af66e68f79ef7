"""Several requests at once on one pair (`serve --parallel N`): N slots.

A `Slot` (jobs.py) is a decoder whose models are one sequence each of a target context
and a draft context that hold N (engine/llama/batched.py); all share one prompt cache.
A request takes the free slot whose cache shares the longest prefix with its prompt (a
conversation's next turn finds its own), and runs there on the caller's thread while
the batcher decodes every slot's drafts, then rounds, together. With N = 1 there is one
plain Slot, as before: its decodes run on the calling thread.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import SpeculativeDecoder
from ..engine.drafting.kinds import slot_draft
from ..engine.llama.batched import Batcher, SeqView
from .calls import ChatCalls
from .jobs import InProcess, Item, Order, Outcome, Slot
from .promptcache import CacheFigures, PromptCache, shared


class Slots(InProcess):
    """N slots sharing one target context; `run` is safe from N threads at once."""

    def __init__(self, decoder: SpeculativeDecoder,
                 prepare: Callable[[], None] | None = None, cache_bytes: int = 0,
                 on_lost: Callable[[str], None] | None = None) -> None:
        """decoder: one slot per sequence its target was loaded with (Model(n_seq)): N
        is set once, where `serve --parallel N` loads the models. on_lost(why): the
        batcher's compute thread died or hangs (Batcher)."""
        self.n = n = decoder.target.n_seq
        self.prompt_cache = PromptCache(cache_bytes)
        self._first = Slot(decoder, prepare, prompt_cache=self.prompt_cache)
        self.batcher: Batcher | None = None
        self.slots = [self._first]
        if n > 1:
            assert decoder.draft is None or decoder.draft.traits.parallel, "the draft too"
            self.batcher = Batcher(decoder.target, on_lost)
        self._free = list(range(n))
        self._cond = threading.Condition()

    def prepare(self) -> str | None:
        """Measure auto's costs (on the thread that decodes), then make the other slots."""
        if self.batcher is None:
            return self._first.prepare()
        why = self.batcher.call(self._first.prepare)
        first = self._first.decoder
        first.target.clear()  # (sequence 0: what measuring left)
        if first.draft is not None:
            first.draft.clear()
        self.slots = [self._slot(s) for s in range(self.n)]
        return why

    def _slot(self, seq: int) -> Slot:
        """Slot `seq`: its views of the models, auto's measured costs, and the one suffix
        cache (its corpus, the history of every slot's answers)."""
        first = self._first.decoder
        assert self.batcher is not None
        target = SeqView(self.batcher, seq)
        # as its kind makes it: a draft model's sequence of the shared draft context, an
        # MTP context of its own over the target's view (decodes taking turns with batches)
        draft = slot_draft(first.draft, target, self.batcher, seq)
        decoder = SpeculativeDecoder(target, draft, p_min=first.p_min,
                                     drafters=first.default_drafters,
                                     cross_vocab=first.cross_vocab)
        decoder.policy_state = copy.deepcopy(first.policy_state)
        decoder.threads = first.threads
        decoder.draft_cache = first.draft_cache  # each slot drafts from all answers
        return Slot(decoder, prompt_cache=self.prompt_cache)

    # --------------------------------------------------------------- serving
    def run(self, order: Order, put: Callable[[Item], None],
            cancelled: Callable[[], bool]) -> Outcome:
        assert len(self.slots) == self.n, "prepare() makes the slots"
        with self._slot_for(list(order.work.tokens)) as seq:
            # Active in the batcher only while it generates (Slot.run), not while it
            # sets up or tidies up: batches would wait for its share meanwhile.
            return self.slots[seq].run(order, put, cancelled, lambda: self._active(seq))

    def call(self, name: str, *args: Any) -> Any:
        """One of ChatCalls' CALLS (calls.py), on a free slot."""
        with self._slot_for([]) as seq, self._active(seq):
            return getattr(ChatCalls(self.slots[seq].decoder), name)(*args)

    def _active(self, seq: int) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext() if self.batcher is None else self.batcher.active(seq)

    @contextlib.contextmanager
    def _slot_for(self, prompt: list[int]) -> Iterator[int]:
        """The free slot whose cache shares most with `prompt` (waiting for one)."""
        with self._cond:
            while not self._free:
                self._cond.wait()
            best = max(self._free, key=lambda s: shared(
                self.slots[s].decoder.target.cached, prompt))
            self._free.remove(best)
        try:
            yield best
        finally:
            with self._cond:
                self._free.append(best)
                self._cond.notify()

    @property
    def parallel(self) -> int:  # type: ignore[override]
        return self.n

    def figures(self) -> CacheFigures:
        return self.prompt_cache.figures()

    def close(self) -> None:
        first = self._first
        for slot in self.slots:
            if slot is not first:
                slot.close()  # views: the contexts stay (the history saved once)
        if self.batcher is not None:
            self.batcher.close()
        first.close()
