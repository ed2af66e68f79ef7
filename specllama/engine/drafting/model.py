"""The draft model as a drafter: it samples the draft one token at a time from its own q.

`p_min` stops a draft early when the draft's most likely next token has less than that
probability (under a fixed draft length; auto's stop rule learns where to stop). The
decision depends on q alone, never on which token is then drawn, so the acceptance rule
stays exact. A draft ends after a token that ends generation: nothing after it is used.

A cheaper source may feed the model (`Feeder`, a lookup):
- "splice": where several earlier replies agree on what comes next (the fixed parts of a
  reply of one shape), those tokens join the draft free, q all on each, after a drawn
  one: a deterministic function of the text, as a lookup is;
- "verify" (the hierarchical chain): after each drawn token the model decodes the
  lookup's guess of what follows in the same batch, and checks each guessed token as the
  acceptance rule would (`sampling.check_proposal`). Every token still follows its q, so
  the target sees the model's own draft, sooner where the guesses hold.

While the policy keeps the model idle but may call it back, the round loop reports p(x)
of each token the target draws alone (`accept(alone_p=...)`); catching up, the model
reads its rows there and reports in `ModelWork.shadow` whether it would have guessed
them: a measure of acceptance that costs no target time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from ..constraint import masked
from ..llama import DraftModel
from ..penalties import Penalties, penalized_after
from ..sampling import (
    check_proposal,
    confidence,
    first_draft_acceptance,
    probabilities,
    sample,
)
from .ahead import Ahead, AheadWorker
from .base import Ask, Draft, DraftStep, ModelWork, Origin, Start, always_more

#: At most this many rows of a catch-up are read for the shadow (each row read costs the
#: draft's output layer and a softmax; the latest tokens tell most about now).
SHADOW_ROWS = 64
#: Tokens of a feeder's guess the model verifies in one batch at most.
FEED_MAX = 8

Feed = Literal["splice", "verify"]


class Feeder(Protocol):
    """A cheap source that drafts for the draft model (a lookup)."""

    def splices(self) -> bool:
        """Whether `agreed` may give anything now (asked before building its argument)."""
        ...

    def agreed(self, tokens: Sequence[int], k: int) -> tuple[list[int], Origin]:
        """Up to k tokens known to follow `tokens` (every followed document agrees), and
        where they were seen; changes no state."""
        ...

    def peek(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens the text seen so far expects after `context`; no state changes."""
        ...


def _p_min(ask: Ask, p_min: float) -> float:
    """The cutoff a draft obeys: none where the policy has a stop rule of its own (auto's
    learns what each confidence is worth; p_min's 0.2 was chosen on the SmolLM2 pair and
    cut half the drafts of a near-copy MTP layer that were accepted 99% of the time)."""
    return p_min if ask.lengths.extend is always_more else 0.0


def _row_before(logits: np.ndarray, context: Sequence[int], j: int,
                penalties: Penalties | None) -> np.ndarray:
    """The row that predicted context[j], penalized for the text before it (as the
    target's row there was, whose p the shadow compares it with)."""
    return logits if penalties is None else penalized_after(logits, context[:j], penalties)


@dataclass
class _Run:
    """One round's draft in progress: each row read, each token taken."""

    ask: Ask
    k: int
    p_min: float
    origin: Origin
    ends: Callable[[int], bool]
    #: a policy with a stop rule reads the draft's confidence; greedy that costs a softmax
    #: over the vocabulary (0.2-0.3 ms a row here), so only then
    reads: bool
    draft: Draft = field(default_factory=Draft)
    rows: int = 0
    done: bool = False

    def next(self, logits: np.ndarray, proposed: int | None = None) -> int | None:
        """Read one row: the token drawn from its q (a `proposed` one checked against q),
        or None where the draft stops before it. Penalized as the target's row at this
        position is (the committed text, then the draft so far), so q is close to p."""
        ask = self.ask
        if ask.params.penalties is not None:
            logits = penalized_after(logits, ask.context, ask.params.penalties,
                                     self.draft.tokens)
        if ask.constraint is not None:
            logits = masked(logits, ask.constraint.allowed())
        self.rows += 1
        i = len(self.draft.tokens)
        q = None if ask.params.greedy else probabilities(logits, ask.params)
        sure = confidence(logits, ask.params, q) if self.reads or q is not None else 1.0
        if sure < self.p_min and q is not None:
            self.done = True
            return None
        step: DraftStep = ask.lengths.extend(i, sure)
        if step == "stop":
            self.done = True
            return None
        token = self._draw(logits, q, proposed)
        self.take([token], [q], self.origin, [sure])
        self.done = step == "last" or len(self.draft.tokens) >= self.k or self.ends(token)
        return token

    def _draw(self, logits: np.ndarray, q: np.ndarray | None, proposed: int | None) -> int:
        if q is None:
            return int(np.argmax(logits))
        if proposed is None:
            return sample(q, self.ask.rng)
        return check_proposal(q, proposed, self.ask.rng)

    def take(self, tokens: list[int], qs: list[np.ndarray | None], origin: Origin,
             sure: list[float]) -> None:
        if self.ask.constraint is not None:
            self.ask.constraint.advance(tokens)
        self.draft.add(tokens, qs, origin)
        if self.reads:
            self.draft.confidences += sure
        if len(self.draft.tokens) >= self.k:
            self.done = True

    def context(self) -> list[int]:
        return [*self.ask.context, *self.draft.tokens]


class ModelDrafter:
    """A draft model (or a cross-vocabulary view of one) drafting in target ids."""

    def __init__(self, model: DraftModel, p_min: float = 0.0, *,
                 ends: Callable[[int], bool] = lambda token: False, shadow: bool = True,
                 feeder: Feeder | None = None, feed: Feed = "splice",
                 idle: bool = False, ahead: int = 0, ahead_threads: int = 0,
                 origin: Origin = "model") -> None:
        """ends: the target's end of generation; shadow: read rows where the target drew
        alone (not across tokenizers: the draft's rows are not the target's positions);
        idle: never draft, only keep the cache a prefix of the text; ahead: draft up to
        that many tokens ahead while the target verifies (drafting/ahead.py; 0: never), on
        `ahead_threads` of the model's threads (its others are the target's then)."""
        self.model, self.p_min, self.ends = model, p_min, ends
        self.feeder, self.feed, self.idle = feeder, feed, idle
        self.name: str = "lookup>model" if feeder is not None and feed == "verify" else origin
        self.origin = origin  # "mtp": the model is the target's own MTP layers
        self.shadow_ok = shadow
        self.target_p: dict[int, float] = {}  # position -> p(token) the target drew alone
        #: Whether it drafted (drew a token or read a row) the last time it was asked.
        self.drafting = True
        self._shadow = False
        self._committed = 0
        self._dirty = True  # it decoded since its cache was last cut to the text
        self.ahead, self.ahead_threads = ahead, ahead_threads
        self._worker: AheadWorker | None = None  # made on first use
        self._threads = 0  # the model's threads when drafting in turn
        self._ahead_on = False  # the worker has a job
        self._after: list[int] = []  # the text the worker's tokens continue
        self._pre: Ahead | None = None  # drawn ahead, continuing the text: the next draft
        self.hidden_s = 0.0  # decode time behind the target's (not a draft step's)

    @property
    def decode_s(self) -> float:
        """Decode time spent drafting in turn (what drafting ahead hid is not counted)."""
        return self.model.decode_s - self.hidden_s

    @property
    def behind(self) -> int:
        return max(0, self._committed - 1 - len(self.model.cached))

    def begin(self, start: Start) -> None:
        """The prompt goes into the model's cache only if it may draft in this call,
        paying for that prompt too; otherwise it catches up the first time it drafts."""
        m, prefix = self.model, list(start.prompt[:-1])
        self._dirty = True
        if not start.keep_cache:
            m.clear()
        self.target_p.clear()
        self._committed = len(start.prompt)
        self._shadow = not self.idle and self.shadow_ok and start.lengths.may_draft("model")
        kept = m.sync_to(prefix)  # every cache stays a prefix of the history
        if not self.idle and start.lengths.may_draft("model", len(prefix) - kept):
            m.decode(prefix[kept:], "none")

    def accept(self, committed: Sequence[int], alone_p: float | None = None) -> None:
        if self._shadow and alone_p is not None:
            self.target_p[len(committed) - 1] = alone_p
        self._committed = len(committed)
        self._pre = self._kept(committed, self._stop_ahead())
        if self._pre is None and self._dirty:  # else the cache is a prefix of the text
            self.model.sync_to(list(committed[:-1]))
            self._dirty = False

    def end(self, committed: Sequence[int]) -> None:
        self._stop_ahead()
        if self._worker is not None:  # a thread a generation, not a thread a process
            self._worker.close()
            self._worker = None
        self._pre = None
        self._committed = len(committed)
        self.model.sync_to(list(committed[:-1]))
        self._dirty = False

    def draft(self, ask: Ask) -> Draft:
        k = 0 if self.idle else ask.choose("model")
        if k <= 0:
            self.drafting = False
            return Draft()
        draft = self._from_ahead(ask, k) or self._drawn(ask, k)
        self._start_ahead(ask, draft)
        return draft

    def _drawn(self, ask: Ask, k: int) -> Draft:
        """Up to k tokens drawn now, one draft step each."""
        context = list(ask.context)
        self._dirty = True
        kept = self._keep(context)
        caught_up = len(context) - 1 - kept
        shadow = self._catch_up(context, kept, ask)
        if not self.model.can_draft():  # a cross-vocabulary draft lost the text
            self.drafting = False
            return Draft(work=ModelWork(caught_up=caught_up, shadow=shadow))
        # The draft's own tokens are decoded one at a time and cut back after the
        # verdict: a recurrent draft keeps its state from here (rewind.py).
        if k > 1:
            self.model.checkpoint()
        run = _Run(ask, k, _p_min(ask, self.p_min), self.origin, self.ends,
                   ask.lengths.extend is not always_more)
        steps_from = self.model.decode_s
        if self.feeder is not None and self.feed == "verify":
            self._draw_verified(run)
        else:
            self._draw(run)
        self.drafting = bool(run.draft.tokens or run.rows)
        run.draft.work = ModelWork(run.rows, self.model.decode_s - steps_from, caught_up, shadow)
        return run.draft

    # ---------------------------------------------------------------- drawing
    def _draw(self, run: _Run) -> None:
        """Read a row, draw a token, decode it (with what the feeder splices after it)."""
        while not run.done:
            token = run.next(self.model.logits_row(-1))
            if token is None or run.done:
                return
            free = self._spliced(run)
            self.model.decode([token, *free], "last")

    def _spliced(self, run: _Run) -> list[int]:
        """What the feeder says comes next (within k and the constraint), taken free."""
        if self.feeder is None or not self.feeder.splices():
            return []
        free, origin = self.feeder.agreed(run.context(), run.k - len(run.draft.tokens))
        c = run.ask.constraint
        if c is not None and free:
            free = free[: c.fits(free)]
        if free:
            run.take(free, [None] * len(free), origin, [1.0] * len(free))
        return free

    def _draw_verified(self, run: _Run) -> None:
        """After each drawn token, decode the feeder's guess of what follows in the same
        batch and check it row by row; a guess that fails is replaced by the model's own
        draw there, which is decoded next with a new guess."""
        m = self.model
        pending = run.next(m.logits_row(-1))
        while pending is not None and not run.done:
            guess = self.feeder.peek(run.context(), min(run.k - len(run.draft.tokens),
                                                        FEED_MAX)) if self.feeder else []
            m.decode([pending, *guess], "all" if guess else "last")
            pending = None
            for j, proposed in enumerate(guess):
                token = run.next(m.logits_row(j), proposed)
                if token is None or run.done:
                    return
                if token != proposed:
                    m.truncate(len(m.cached) - (len(guess) - j))  # the rest was never drafted
                    pending = token
                    break
            else:
                pending = run.next(m.logits_row(len(guess) if guess else -1))

    # ---------------------------------------------------------------- drafting ahead
    def _start_ahead(self, ask: Ask, draft: Draft) -> None:
        """While the target verifies `draft`, draw what follows it on the model's threads
        (not under a constraint: its matcher follows the round loop's text)."""
        if not self.ahead or not draft.tokens or ask.constraint is not None \
                or self.ends(draft.tokens[-1]):
            return
        before = len(ask.context) + len(draft.tokens) - 1
        self.model.truncate(before)  # (a fed draft may hold guesses past its end)
        if len(self.model.cached) != before:
            return  # the cache does not hold the text before the draft's last token
        self._after = [*ask.context, *draft.tokens]
        rng = np.random.default_rng(int(ask.rng.integers(2**63)))  # the worker's own
        if self._worker is None:
            self._worker = AheadWorker(self.model, p_min=self.p_min, ends=self.ends)
        self._worker.p_min = _p_min(ask, self.p_min)  # (idle until start)
        # In turn it drafts on every thread; ahead, beside the target, on its own few.
        self._threads = self.model.n_threads
        self.model.set_threads(self.ahead_threads or self._threads)
        self._worker.start(draft.tokens[-1], ask.params, rng, self.ahead, self._after)
        self._ahead_on = True

    def _stop_ahead(self) -> Ahead | None:
        if not self._ahead_on or self._worker is None:
            return None
        self._ahead_on = False
        done = self._worker.stop()
        self.model.set_threads(self._threads)
        self.hidden_s += done.seconds
        if done.error is not None:
            raise done.error
        return done

    def _kept(self, committed: Sequence[int], done: Ahead | None) -> Ahead | None:
        """What was drawn ahead and continues `committed`: every draft accepted and the
        target's own token the first one drawn ahead. The cache then holds the text and
        those tokens (the last pending)."""
        if done is None or len(done.tokens) < 2 or len(committed) != len(self._after) + 1 \
                or committed[-1] != done.tokens[0] or list(committed[:-1]) != self._after:
            return None
        return Ahead(done.tokens[1:], done.qs[1:], done.sure[1:], done.pending)

    def _from_ahead(self, ask: Ask, k: int) -> Draft | None:
        """The tokens drawn ahead that open this draft, as far as the policy takes them
        at their confidence; the rest are dropped from the cache."""
        pre, self._pre = self._pre, None
        if pre is None or len(ask.context) != self._committed:
            return None
        take = 0
        for j, sure in enumerate(pre.sure[:k]):
            step = ask.lengths.extend(j, sure)
            if step == "stop":
                break
            take += 1
            if step == "last":
                break
        if take == 0:
            return None
        draft = Draft(confidences=pre.sure[:take], work=ModelWork(ahead=take))
        draft.add(pre.tokens[:take], pre.qs[:take], self.origin)
        self.drafting = True
        return draft

    # ---------------------------------------------------------------- the cache
    def _keep(self, context: list[int]) -> int:
        """Keep what the cache shares with `context`, but never `last` itself: its
        logits are q_1, so it must be decoded now."""
        kept = self.model.sync_to(context)
        if kept == len(context):
            kept = self.model.sync_to(context[:-1])
        return kept

    def _catch_up(self, context: list[int], kept: int, ask: Ask) -> tuple[float, ...]:
        """Decode context[kept:]; where it holds tokens the target drew alone, read the
        rows that predicted them (the last SHADOW_ROWS at most): the shadow."""
        m, n = self.model, len(context)
        first = max(kept, n - SHADOW_ROWS)
        alone = [j for j in range(first + 1, n) if j in self.target_p]
        if not alone:
            m.decode(context[kept:], "last")
            return ()
        m.decode(context[kept:first], "none")
        m.decode(context[first:], "all")
        chances = (first_draft_acceptance(_row_before(m.logits_row(j - first - 1), context, j,
                                                      ask.params.penalties),
                                          context[j], self.target_p[j], ask.params,
                                          _p_min(ask, self.p_min))
                   for j in alone)
        return tuple(c for c in chances if c is not None)
