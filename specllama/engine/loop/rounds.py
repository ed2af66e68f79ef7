"""The round loop of one generation: draft, verify in one batch, accept exactly, commit,
cut the caches back. Read `Generation.run` top to bottom; docs/architecture.md ("One
round") describes it.

Invariant between rounds: both KV caches hold exactly `committed[:-1]` (the draft
model's may lag behind; it catches up the next time it drafts). tests/test_speculative.py
checks it after every round.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .constraint import Constraint, masked
from .drafts import Draft, DraftMode, DraftStrategy
from .events import (
    DraftProposed,
    Event,
    Finished,
    FinishReason,
    GenerationResult,
    PromptEvaluated,
    RoundVerified,
    TargetKind,
    TargetToken,
    TextFlushed,
    TokenLogprob,
    TokensAccepted,
)
from .lengths import DraftLengthPolicy, RoundOutcome
from .llama import DraftModel, Model
from .sampling import (
    SamplingParams,
    Verdict,
    log_softmax,
    probabilities,
    sample_logits_and_p,
    verify,
    verify_greedy,
)
from .stats import Stats
from .textstream import TextStream


class GenerationStream(Iterator[Event]):
    """The events of one generation. `result` is set once it has ended, however
    it ended: finished, closed early, or stopped by an error or Ctrl-C (None only
    when it was closed before it began)."""

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
class Verified:
    """What the target said of one draft: m drafts accepted, then one token of its own,
    and for RoundVerified p_i(d_i) and q_i(d_i) of each draft (p None where unread)."""

    verdict: Verdict
    kind: TargetKind
    p: tuple[float | None, ...]
    q: tuple[float, ...]


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
    """Decode time of both models and the wall clock at a round's start."""

    target_s: float
    draft_s: float
    wall: float


class Generation:
    """One call's state: the history, the output so far, and how it ends."""

    def __init__(
        self,
        target: Model,
        draft: DraftModel | None,
        committed: list[int],
        *,
        n_ctx: int,
        max_tokens: int,
        params: SamplingParams,
        policy: DraftLengthPolicy,
        mode: DraftMode,
        strategy: DraftStrategy | None,
        stop: Sequence[str],
        keep_cache: bool,
        target_p: dict[int, float],
        constraint: Constraint | None = None,
        force: bool = False,
        logprobs: int | None = None,
    ) -> None:
        """constraint: what the output must follow (every row masked by it); force: draft
        the tokens it forces (speculation is on), free of any draft model; logprobs: keep
        each token's log-probability and the n likeliest (None: not at all)."""
        self.target, self.draft = target, draft
        self.committed = committed  # prompt + output; both caches hold committed[:-1]
        self.generated: list[int] = []
        self.n_prompt = len(committed)
        self.n_ctx, self.max_tokens = n_ctx, max_tokens
        self.params, self.policy, self.mode, self.strategy = params, policy, mode, strategy
        self.keep_cache = keep_cache
        self.target_p = target_p  # p(x) where the target drew alone, for ModelDraft.shadow
        self.constraint = constraint
        self.force = force and constraint is not None
        self.logprobs = logprobs
        self.token_logprobs: list[TokenLogprob] = []
        self.rng = np.random.default_rng(params.seed)
        self.text = TextStream(target.piece, stop)
        self.stats = Stats(prompt_tokens=self.n_prompt, target_at=target.placement)
        self.finish: FinishReason | None = None
        # While the policy keeps the draft model idle but may call it back, note p(x) of
        # each token the target draws alone: catching up, the draft shows how often it
        # would have guessed them (RoundOutcome.shadow), without drafting.
        self.shadow = draft is not None and mode != "lookup" and policy.may_draft("model")

    def run(self, out: GenerationStream) -> Generator[Event, None, None]:
        yield self._evaluate_prompt()
        start = self._clock()
        try:
            while self.finish is None:
                limit = self._draft_limit()
                if limit is None:
                    self.finish = "context"
                    break
                clock = self._clock()
                draft = self._propose(limit)
                if draft.tokens:
                    yield DraftProposed(tuple(draft.tokens), draft.source)
                seen = self._verify(draft)
                done = self._commit(draft, seen.verdict)
                self._learn(draft, seen, done, clock)
                yield from self._report(draft, seen, done, clock)
        except GeneratorExit:
            self.finish = "interrupted"
            raise
        except Exception:
            self.finish = "error"
            raise
        finally:
            out.result = self._end(start)
        tail = self.text.flush()
        if tail:
            yield TextFlushed(tail)
        out.result = self._result(self.finish)
        yield Finished(out.result)

    # ------------------------------------------------------------ the steps
    def _evaluate_prompt(self) -> PromptEvaluated:
        """Everything but the last token goes into the target's cache, and into the draft
        model's only if it may draft in this call, paying for that prompt too: where it
        cannot (or in lookup mode) it is never read, and should the policy change its
        mind, ModelDraft.propose catches the cache up first."""
        if not self.keep_cache:
            for model in self._models():
                model.clear()
        t0 = time.perf_counter()
        prefix = self.committed[:-1]
        reused = self.target.sync_to(prefix)
        self.target.decode(prefix[reused:], "none")
        if self.draft is not None:
            kept = self.draft.sync_to(prefix)  # every cache stays a prefix of the history
            if self.mode != "lookup" and self.policy.may_draft("model", len(prefix) - kept):
                self.draft.decode(prefix[kept:], "none")
        self.stats.prompt_reused = reused
        self.stats.prompt_s = time.perf_counter() - t0
        return PromptEvaluated(self.n_prompt, reused, self.stats.prompt_s)

    def _draft_limit(self) -> int | None:
        """The most tokens this round may draft; None when the context is full.
        Verifying [last, d1..dk] needs positions up to len(committed) + k - 1."""
        room = self.n_ctx - len(self.committed)
        if room < 0:
            return None
        return min(self.max_tokens - len(self.generated) - 1, room)

    def _propose(self, limit: int) -> Draft:
        """The tokens a constraint forces from here (free), then the strategy's draft
        after them, both within `limit`."""
        c = self.constraint
        forced = c.forced(limit) if c is not None and self.force and limit > 0 else []
        if c is not None:
            c.advance(forced)
        room = limit - len(forced)
        if self.strategy is None or room <= 0:
            return Draft(forced, [None] * len(forced), "lookup", forced=len(forced)) \
                if forced else Draft()

        def choose_k(source: str, match: int) -> int:
            return min(self.policy.choose(source, match), room)

        context = self.committed + forced if forced else self.committed
        draft = self.strategy.propose(context, choose_k, self.params, self.rng,
                                      self.policy.extend, c)
        if forced:
            draft.tokens[:0] = forced
            draft.qs[:0] = [None] * len(forced)
            draft.forced = len(forced)
        return draft

    def _verify(self, draft: Draft) -> Verified:
        """One target pass over [last, d1..dk] gives p_1..p_{k+1}; the exact rule."""
        self.target.decode([self.committed[-1], *draft.tokens],
                           "all" if draft.tokens else "last")
        rows = _Rows(draft, self._row, self.params)
        if self.params.greedy:
            verdict = verify_greedy(rows.argmax, draft.tokens)
        else:
            verdict = verify(rows.probs, draft.tokens, draft.qs, self.rng, rows.draw)
        if self.shadow and not draft.tokens:
            self.target_p[len(self.committed)] = verdict.p
        k, m = len(draft.tokens), verdict.accepted
        kind: TargetKind = "plain" if not k else ("bonus" if m == k else "correction")
        return Verified(verdict, kind, tuple(rows.p), rows.q)

    def _commit(self, draft: Draft, verdict: Verdict) -> Committed:
        """d1..dm and x join the output up to an end of generation, max_tokens or a stop
        string; then the target's cache is cut back to committed[:-1]."""
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
        if self.strategy is not None:
            self.strategy.settle(self.committed)
        if self.constraint is not None:
            self.constraint.settle(self.generated)
        return Committed(tuple(tokens), min(drafted, len(tokens)), drafted_text, own_text)

    def _learn(self, draft: Draft, seen: Verified, done: Committed, clock: Clock) -> None:
        # Forced tokens are counted apart: the policy and the acceptance figures see
        # the drafts that came from a source, the verify cost sees the whole batch.
        f = draft.forced
        k, m = len(draft.tokens) - f, max(0, seen.verdict.accepted - f)
        seconds = time.perf_counter() - clock.wall
        target_s = self.target.decode_s - clock.target_s
        draft_s = self._draft_s() - clock.draft_s
        self.stats.record_round(k, m, len(done.tokens), seconds=seconds,
                                own_s=seconds - target_s - draft_s, forced=f,
                                forced_accepted=min(f, seen.verdict.accepted),
                                origin=draft.origin, spliced=draft.spliced,
                                spliced_origin=draft.spliced_origin)
        self.policy.observe(RoundOutcome(
            k=k,
            accepted=m,
            forced=f,
            source=draft.source,
            target_s=target_s,
            draft_s=draft_s,
            seconds=seconds,
            shadow=tuple(draft.shadow),
            draft_steps_s=draft.steps_s,
            draft_behind=self._draft_behind(),
            draft_caught_up=draft.caught_up,
            confidences=tuple(draft.confidences),
            draft_rows=draft.rows,
        ))

    def _report(self, draft: Draft, seen: Verified, done: Committed,
                clock: Clock) -> Iterator[Event]:
        """Accepted drafts (green), then the target's own token (yellow), then the
        verdict on the whole draft; text a stop released with them is flushed."""
        if done.drafted:
            yield TokensAccepted(done.tokens[: done.drafted], done.drafted_text)
        elif done.drafted_text:
            yield TextFlushed(done.drafted_text)
        if len(done.tokens) > done.drafted:
            yield TargetToken(seen.verdict.token, done.own_text, seen.kind)
        elif done.own_text:
            yield TextFlushed(done.own_text)
        yield RoundVerified(
            drafted=tuple(draft.tokens),
            accepted=seen.verdict.accepted,
            token=seen.verdict.token,
            kind=seen.kind,
            emitted=len(done.tokens),
            p=seen.p,
            q=seen.q,
            source=draft.source,
            origin=draft.origin,
            draft_s=self._draft_s() - clock.draft_s,
            target_s=self.target.decode_s - clock.target_s,
            seconds=time.perf_counter() - clock.wall,
        )

    def _end(self, start: Clock) -> GenerationResult:
        """However the call ended (early close, Ctrl-C, an error), both caches end as a
        prefix of committed[:-1], so the next call is correct."""
        for model in self._models():
            model.sync_to(self.committed[:-1])
        s = self.stats
        s.generate_s = time.perf_counter() - start.wall
        s.target_s = self.target.decode_s - start.target_s
        s.draft_s = self._draft_s() - start.draft_s
        s.policy_note = self.policy.describe()
        s.policy_detail = self.policy.explain()
        s.predicted_speedup = self.policy.predicted_speedup()
        s.tokens = len(self.generated)
        if self.constraint is not None:
            s.mask_s = self.constraint.mask_s
        return self._result(self.finish or "interrupted")

    # ------------------------------------------------------------ small helpers
    def _result(self, finish: FinishReason) -> GenerationResult:
        return GenerationResult(
            self.generated, self.text.text, finish, self.stats, self.n_prompt,
            None if self.logprobs is None else tuple(self.token_logprobs),
            None if self.constraint is None else self.constraint.complete)

    def _models(self) -> list[Model | DraftModel]:
        return [m for m in (self.target, self.draft) if m is not None]

    def _clock(self) -> Clock:
        return Clock(self.target.decode_s, self._draft_s(), time.perf_counter())

    def _row(self, i: int) -> np.ndarray:
        """The target's logits at row i of the verify pass, masked by the constraint at
        the state after the draft's first i tokens."""
        row = self.target.logits_row(i)
        return row if self.constraint is None else masked(row, self.constraint.row_mask(i))

    def _logprob(self, i: int, token: int) -> TokenLogprob:
        """Token `token` decided at row i: the row's log-probabilities are on hand."""
        lp = log_softmax(self._row(i))
        n = self.logprobs or 0
        top = np.argpartition(-lp, n)[:n] if n else np.empty(0, dtype=np.int64)
        top = top[np.argsort(-lp[top], kind="stable")]
        return TokenLogprob(token, float(lp[token]), tuple((int(t), float(lp[t])) for t in top))

    def _draft_s(self) -> float:
        return self.draft.decode_s if self.draft is not None else 0.0

    def _draft_behind(self) -> int:
        if self.draft is None:
            return 0
        return max(0, len(self.committed) - 1 - len(self.draft.cached))


def tokens_covering(piece: Callable[[int], bytes], tokens: Sequence[int], n_chars: int) -> int:
    """The fewest leading `tokens` whose text reaches `n_chars` characters: where a stop
    string cut the text, the token it begins in is the last one kept. One pass, decoding
    as TextStream does (a character split across tokens counts once it is whole)."""
    if n_chars <= 0:
        return 0
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    length = 0
    for j, token in enumerate(tokens, 1):
        length += len(utf8.decode(piece(token)))
        if length >= n_chars:
            return j
    return len(tokens)


class _Rows:
    """Reads the target's rows for the acceptance rule and keeps, for RoundVerified,
    q_i(d_i) and p_i(d_i) of each row read (None where none is). Greedy p is one-hot:
    1 where d_i is the target's argmax, else 0."""

    def __init__(self, draft: Draft, logits_row: Callable[[int], np.ndarray],
                 params: SamplingParams) -> None:
        self.drafts = draft.tokens
        self._logits_row = logits_row
        self._params = params
        self.p: list[float | None] = [None] * len(self.drafts)
        self.q = tuple(1.0 if q is None else _at(q, d) for d, q in zip(self.drafts, draft.qs))

    def probs(self, i: int) -> np.ndarray:
        """p_i, the target's processed distribution at row i."""
        p = probabilities(self._logits_row(i), self._params)
        if i < len(self.drafts):
            self.p[i] = _at(p, self.drafts[i])
        return p

    def draw(self, i: int, rng: np.random.Generator) -> tuple[int, float]:
        """A token straight from p_{i+1} (the bonus, or a plain step), and its p."""
        return sample_logits_and_p(self._logits_row(i), self._params, rng)

    def argmax(self, i: int) -> int:
        best = int(np.argmax(self._logits_row(i)))
        if i < len(self.drafts):
            self.p[i] = 1.0 if best == self.drafts[i] else 0.0
        return best


def _at(dist: np.ndarray, token: int) -> float:
    """dist(token); 0 for an id beyond it (pairs whose vocabularies differ in size)."""
    return float(dist[token]) if token < dist.shape[0] else 0.0
