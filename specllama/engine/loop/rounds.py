"""The round loop of one generation: draft, verify in one batch, accept exactly, commit,
cut the caches back. Read `Generation.run` top to bottom; docs/architecture.md ("One
round") describes it.

Invariant between rounds: both KV caches hold exactly `committed[:-1]` (the draft
model's may lag behind; it catches up the next time it drafts). tests/test_speculative.py
checks it after every round.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..constraint import Constraint, masked
from ..drafting.base import Ask, Draft, Start
from ..drafting.chain import DraftChain
from ..llama import ModelView
from ..penalties import penalized_after
from ..sampling import SamplingParams, Verdict, log_softmax, verify, verify_greedy
from .budget import ReasoningBudget
from .events import (
    DraftProposed,
    Event,
    Finished,
    FinishReason,
    GenerationResult,
    PromptEvaluated,
    PromptProgress,
    RoundVerified,
    TargetKind,
    TargetToken,
    TextFlushed,
    TokenLogprob,
    TokensAccepted,
)
from .lengths import DraftLengthPolicy
from .rows import Rows, tokens_covering
from .stats import Stats
from .textstream import Stop, TextStream


class GenerationStream(Iterator[Event]):
    """The events of one generation. `result` is set once it has ended, however
    it ended: finished, closed early, or stopped by an error or Ctrl-C (None only
    when it was closed before its first round: while or right after its prompt was
    evaluated)."""

    def __init__(self) -> None:
        self.result: GenerationResult | None = None
        self._events: Generator[Event, None, None] | None = None

    def __next__(self) -> Event:
        assert self._events is not None
        return next(self._events)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


@dataclass(frozen=True)
class Committed:
    """The tokens of a round that joined the output (fewer than accepted + 1 where an
    end of generation, max_tokens or a stop string ended it), and the text each part
    released: `drafted` of them were drafts."""

    tokens: tuple[int, ...]
    drafted: int
    drafted_text: str
    own_text: str


@dataclass(frozen=True)
class Clock:
    """Decode time of the target and the drafters, and the wall clock at a round's start."""

    target_s: float
    draft_s: float
    wall: float


class Generation:
    """One call's state: the history, the output so far, and how it ends."""

    def __init__(
        self,
        target: ModelView,
        chain: DraftChain,
        committed: list[int],
        *,
        n_ctx: int,
        max_tokens: int,
        params: SamplingParams,
        policy: DraftLengthPolicy,
        stop: Sequence[Stop],
        keep_cache: bool,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
        draft_model: ModelView | None = None,
        banned: np.ndarray | None = None,
        budget: ReasoningBudget | None = None,
    ) -> None:
        """chain: who drafts (forced tokens of `constraint` first where it has them);
        constraint: what the output must follow (every row masked by it); logprobs: keep
        each token's log-probability and the n likeliest (None: not at all); banned: ids
        at -inf on every row (ignore_eos: the end-of-generation tokens); budget: the
        reasoning's, its close forced on the rows past it (loop/budget.py)."""
        self.target, self.chain = target, chain
        self.committed = committed  # prompt + output; both caches hold committed[:-1]
        self.generated: list[int] = []
        self.n_prompt = len(committed)
        self.n_ctx, self.max_tokens = n_ctx, max_tokens
        self.params, self.policy = params, policy
        self.penalties = params.penalties  # None: off, and no row is copied for them
        self._drafts: list[int] = []  # the round's draft, whose prefixes the rows follow
        self.keep_cache = keep_cache
        self.constraint = constraint
        self.banned = banned
        self.budget = budget  # None once the reasoning has closed: no row checks it then
        self.logprobs = logprobs
        self.token_logprobs: list[TokenLogprob] = []
        self.rng = np.random.default_rng(params.seed)
        self.text = TextStream(target.piece, stop)
        self.stats = Stats(prompt_tokens=self.n_prompt, target_at=target.placement)
        self.finish: FinishReason | None = None
        # How each cache's cuts ran this call (recurrent models: llama/rewind.py).
        self._rewinds = [(role, m, replace(m.rewinder.counts)) for role, m in
                         (("target", target), ("draft", draft_model)) if m is not None]

    def run(self, out: GenerationStream) -> Generator[Event, None, None]:
        start, began = self._clock(), False
        try:
            # Inside the try: a close between the prompt's steps leaves the caches as
            # any other close does.
            yield from self._evaluate_prompt()
            start, began = self._clock(), True
            self.text.begin()
            if self.max_tokens == 0:  # the prompt only, into the caches (a cache warm-up)
                self.finish = "length"
            while self.finish is None:
                limit = self._draft_limit()
                if limit is None:
                    self.finish = "context"
                    break
                clock = self._clock()
                draft = self.chain.draft(Ask(self.committed, limit, self.policy,
                                             self.params, self.rng, self.constraint))
                if draft.tokens:
                    yield DraftProposed(tuple(draft.tokens), draft.source,
                                        tuple(draft.origins))
                verdict, rows = self._verify(draft)
                done = self._commit(draft, verdict)
                record = self._record(draft, verdict, rows, done, clock)
                self.stats.record(record)
                self.policy.observe(record)
                yield from self._report(record, done)
        except GeneratorExit:
            self.finish = "interrupted"
            raise
        except Exception:
            self.finish = "error"
            raise
        finally:
            result = self._end(start)
            out.result = result if began else None  # closed before its first round
        tail = self.text.flush()
        if tail:
            yield TextFlushed(tail)
        out.result = self._result(self.finish)
        yield Finished(out.result)

    # ------------------------------------------------------------ the steps
    def _evaluate_prompt(self) -> Iterator[PromptProgress | PromptEvaluated]:
        """Everything but the last token goes into the target's cache, a PromptProgress
        between steps of `target.prompt_step` tokens (whoever reads may close the
        generation there: a server's client gone mid-prompt frees the engine within a
        step); then the drafters begin (a draft model decodes its share only if it may
        draft in this call)."""
        if not self.keep_cache:
            self.target.clear()
        t0 = time.perf_counter()
        prefix = self.committed[:-1]
        reused = self.target.sync_to(prefix)
        self.stats.prompt_reused = reused
        # Steps of n_batch from where decoding starts cut where Model.decode cuts anyway:
        # the same llama_decode calls as one decode, so the same logits, at no cost.
        step = self.target.prompt_step
        for at in range(reused, len(prefix), step):
            if at > reused:
                yield PromptProgress(at, self.n_prompt)
            self.target.decode(prefix[at : at + step], "none")
        self.chain.begin(Start(self.committed, self.keep_cache, self.policy))
        self.stats.prompt_s = time.perf_counter() - t0
        yield PromptEvaluated(self.n_prompt, reused, self.stats.prompt_s)

    def _draft_limit(self) -> int | None:
        """The most tokens this round may draft; None when the context is full.
        Verifying [last, d1..dk] needs positions up to len(committed) + k - 1, and one
        batch with every row's logits (a long forced run is verified over rounds)."""
        room = self.n_ctx - len(self.committed)
        if room < 0:
            return None
        return min(self.max_tokens - len(self.generated) - 1, room, self.target.n_batch - 1)

    def _verify(self, draft: Draft) -> tuple[Verdict, Rows]:
        """One target pass over [last, d1..dk] gives p_1..p_{k+1}; the exact rule."""
        if draft.tokens:  # a recurrent state's way back (llama/rewind.py)
            self.target.checkpoint(1 + len(draft.tokens))
        self.target.decode([self.committed[-1], *draft.tokens],
                           "all" if draft.tokens else "last")
        self._drafts = draft.tokens
        rows = Rows(draft, self._row, self.params)
        if self.params.greedy:
            return verify_greedy(rows.argmax, draft.tokens), rows
        return verify(rows.probs, draft.tokens, draft.qs, self.rng, rows.draw), rows

    def _commit(self, draft: Draft, verdict: Verdict) -> Committed:
        """d1..dm and x join the output up to an end of generation, max_tokens or a stop
        string; then the target's cache is cut back to committed[:-1] and the drafters
        hear where the text stands."""
        tokens: list[int] = []
        for token in [*draft.tokens[: verdict.accepted], verdict.token]:
            tokens.append(token)
            if self.target.is_eog(token):
                self.finish = "eos"
                break
            if len(self.generated) + len(tokens) == self.max_tokens:
                self.finish = "length"
                break
        n_before = len(self.generated)
        if self.logprobs is not None:
            self.token_logprobs += [self._logprob(j, t) for j, t in enumerate(tokens)]
        drafted = min(verdict.accepted, len(tokens))
        drafted_text = self.text.feed(tokens[:drafted])
        own_text = self.text.feed(tokens[drafted:]) if len(tokens) > drafted else ""
        self.committed.extend(tokens)
        self.generated.extend(tokens)
        if self.text.stopped:
            # Keep tokens only up to the one in which the stop text begins: the caches,
            # the result and the stats then match the text the user saw, so a chat's next
            # turn continues from it (the cut may reach back into earlier rounds).
            self.finish = "stop"
            keep = tokens_covering(self.target.piece, self.generated, len(self.text.text))
            del self.generated[keep:]
            del self.token_logprobs[keep:]
            del self.committed[self.n_prompt + keep :]
            tokens = tokens[: max(0, keep - n_before)]
        self.target.truncate(len(self.committed) - 1)
        self.chain.accept(self.committed, None if draft.tokens else verdict.p)
        if self.constraint is not None:
            self.constraint.settle(self.generated)
        if self.budget is not None and self.budget.closed(self.generated):
            self.budget = None
        return Committed(tuple(tokens), min(drafted, len(tokens)), drafted_text, own_text)

    def _record(self, draft: Draft, verdict: Verdict, rows: Rows, done: Committed,
                clock: Clock) -> RoundVerified:
        """The round's one record, timed once it is settled."""
        k, m = len(draft.tokens), verdict.accepted
        kind: TargetKind = "plain" if not k else ("bonus" if m == k else "correction")
        return RoundVerified(
            drafted=tuple(draft.tokens),
            origins=tuple(draft.origins),
            accepted=m,
            token=verdict.token,
            kind=kind,
            emitted=len(done.tokens),
            p=tuple(rows.p),
            q=rows.q,
            source=draft.source,
            draft_s=self.chain.decode_s - clock.draft_s,
            target_s=self.target.decode_s - clock.target_s,
            seconds=time.perf_counter() - clock.wall,
            confidences=tuple(draft.confidences),
            work=draft.work,
            behind=self.chain.behind,
            forced=draft.forced,
            others=self.target.others,
            companions=self.target.companions,
        )

    def _report(self, record: RoundVerified, done: Committed) -> Iterator[Event]:
        """Accepted drafts (green), then the target's own token (yellow), then the
        round's record; text a stop released with them is flushed."""
        if done.drafted:
            yield TokensAccepted(done.tokens[: done.drafted], done.drafted_text)
        elif done.drafted_text:
            yield TextFlushed(done.drafted_text)
        if len(done.tokens) > done.drafted:
            yield TargetToken(record.token, done.own_text, record.kind)
        elif done.own_text:
            yield TextFlushed(done.own_text)
        yield record

    def _end(self, start: Clock) -> GenerationResult:
        """However the call ended (early close, Ctrl-C, an error), every cache ends as a
        prefix of committed[:-1], so the next call is correct."""
        self.target.sync_to(self.committed[:-1])
        self.chain.end(self.committed)
        s = self.stats
        s.generate_s = time.perf_counter() - start.wall
        s.target_s = self.target.decode_s - start.target_s
        s.draft_s = self.chain.decode_s - start.draft_s
        s.policy_note = self.policy.describe()
        s.policy_detail = self.policy.explain()
        s.predicted_speedup = self.policy.predicted_speedup()
        s.tokens = len(self.generated)
        s.rewind = "; ".join(f"{role} {line}" for role, m, before in self._rewinds
                             if (line := m.rewinder.counts.since(before)
                                 .describe(m.rewinder.best)))
        if self.constraint is not None:
            s.mask_s = self.constraint.mask_s
        return self._result(self.finish or "interrupted")

    # ------------------------------------------------------------ small helpers
    def _result(self, finish: FinishReason) -> GenerationResult:
        return GenerationResult(
            self.generated, self.text.text, finish, self.stats, self.n_prompt,
            None if self.logprobs is None else tuple(self.token_logprobs),
            None if self.constraint is None else self.constraint.complete,
            self.text.matched if finish == "stop" else None, self.text.ended_by)

    def _clock(self) -> Clock:
        return Clock(self.target.decode_s, self.chain.decode_s, time.perf_counter())

    def _row(self, i: int) -> np.ndarray:
        """The target's logits at row i of the verify pass, penalized for the text row i
        follows (committed, then the draft's first i tokens), masked by the constraint at
        the state after those tokens, the banned ids at -inf (before temperature and
        top-k, as llama.cpp's logit bias: p renormalised without them)."""
        row = self.target.logits_row(i)
        if self.penalties is not None:
            row = penalized_after(row, self.committed, self.penalties, self._drafts[:i])
        if self.constraint is not None:
            row = masked(row, self.constraint.row_mask(i))
        if self.banned is not None:
            row = np.array(row)  # a view of llama.cpp's logits otherwise
            row[self.banned] = -np.inf
        if self.budget is not None:
            forced = self.budget.forced(self._budget_text(i))
            if forced is not None:  # the close alone (the reasoning grammar allows it)
                only = np.full(row.shape, -np.inf, dtype=row.dtype)
                only[forced] = row[forced] if np.isfinite(row[forced]) else 0.0
                row = only
        return row

    def _budget_text(self, i: int) -> list[int]:
        """The output row i follows: what was generated, then the draft's first i."""
        return [*self.generated, *self._drafts[:i]]

    def _logprob(self, i: int, token: int) -> TokenLogprob:
        """Token `token` decided at row i: the row's log-probabilities are on hand."""
        lp = log_softmax(self._row(i))
        n = self.logprobs or 0
        top = np.argpartition(-lp, n)[:n] if n else np.empty(0, dtype=np.int64)
        # tokens a constraint forbids (log 0) are no alternatives, and -inf is no JSON
        top = top[np.isfinite(lp[top])]
        top = top[np.argsort(-lp[top], kind="stable")]
        return TokenLogprob(token, float(lp[token]), tuple((int(t), float(lp[t])) for t in top))
