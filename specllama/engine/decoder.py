"""The round loop: draft, verify in one batch, accept exactly, cut the caches back.

Read `SpeculativeDecoder._run` top to bottom; docs/architecture.md ("One round")
describes it. Invariant between rounds: both KV caches hold exactly
`committed[:-1]` (the draft's may lag behind; it catches up when it drafts next).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

import numpy as np

from ..errors import ContextOverflowError, InvalidParameterError
from .compat import check_compatible, check_rewindable
from .drafts import (
    DEFAULT_DRAFT_MODE,
    Draft,
    DraftMode,
    DraftStrategy,
    ModelDraft,
    check_draft_mode,
)
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
    TokensAccepted,
)
from .lengths import DraftLengthPolicy, DraftMax, RoundOutcome, make_policy
from .llama import Model
from .lookup import HybridDraft, LookupDraft
from .sampling import SamplingParams, probabilities, sample_logits_and_p, verify, verify_greedy
from .settings import default, validate_setting
from .stats import Stats
from .textstream import TextStream

# The API's defaults are the settings table's, the same as the command line's.
DEFAULT_MAX_TOKENS: int = default("max_tokens")
DEFAULT_DRAFT_MAX: DraftMax = default("draft_max")
DEFAULT_P_MIN: float = default("p_min")


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


def make_strategy(
    mode: DraftMode, decoder: SpeculativeDecoder, target_p: dict[int, float] | None = None
) -> DraftStrategy | None:
    """The draft strategy for a mode; None means the target decodes alone.

    - "model": the draft model (none loaded: the target alone);
    - "lookup": prompt lookup over prompt + generated text, no draft model used;
    - "hybrid": lookup when the context has a match, the draft model otherwise
      (without a draft model it is the same as "lookup").

    target_p: p(token) where the target drew alone (see ModelDraft).
    """
    check_draft_mode(mode)
    model = (ModelDraft(decoder.draft, decoder.p_min, target_p)
             if decoder.draft is not None else None)
    if mode == "model":
        return model
    if mode == "lookup" or model is None:
        return LookupDraft()
    return HybridDraft(LookupDraft(), model)


class SpeculativeDecoder:
    """A target model, optionally a draft model, and the exact speculative loop."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        p_min: float = DEFAULT_P_MIN,
        draft_mode: DraftMode | None = None,
    ) -> None:
        """draft_mode: what stream()/generate() use when not told; None: "hybrid" with a
        draft model, else "model" (the target alone)."""
        if draft_mode is None:
            draft_mode = DEFAULT_DRAFT_MODE if draft is not None else "model"
        check_draft_mode(draft_mode)
        if draft is not None:
            check_compatible(target, draft)
            check_rewindable(draft, "draft")
            check_rewindable(target, "target")
        self.target = target
        self.draft = draft
        self.p_min: float = validate_setting("p_min", p_min)
        self.default_draft_mode: DraftMode = draft_mode
        # What draft-length policies keep across calls (auto: the measured costs).
        self.policy_state: dict[str, object] = {}

    @classmethod
    def load(
        cls,
        target: str | Path,
        draft: str | Path | None = None,
        *,
        n_ctx: int = default("n_ctx"),
        n_threads: int | None = default("threads"),
        p_min: float = DEFAULT_P_MIN,
        draft_mode: DraftMode | None = None,
        target_rpc: Sequence[str] = (),
    ) -> SpeculativeDecoder:
        """draft: a GGUF path, "lookup" (no draft model: prompt lookup) or None
        (the target alone). draft_mode: the default mode of generate()/stream();
        None means "hybrid" with a draft model, "lookup" for draft="lookup", else
        "model" (the target alone). target_rpc: HOST:PORT of llama.cpp RPC servers that
        hold the target (the draft stays local)."""
        if draft_mode is not None:
            check_draft_mode(draft_mode)
        target_model = Model(target, n_ctx=n_ctx, n_threads=n_threads, rpc=target_rpc)
        draft_model = None
        is_lookup = draft is not None and str(draft) == "lookup"
        if draft is not None and not is_lookup:
            draft_model = Model(draft, n_ctx=n_ctx, n_threads=n_threads)
        return cls(
            target_model,
            draft_model,
            p_min=p_min,
            draft_mode=draft_mode or ("lookup" if is_lookup else None),
        )

    def close(self) -> None:
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx if self.draft is None else min(self.target.n_ctx, self.draft.n_ctx)

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        """A str gets BOS if the model wants one and its special tokens parsed."""
        if isinstance(prompt, str):
            return self.target.tokenize(prompt, add_bos=self.target.adds_bos, special=True)
        return [int(t) for t in prompt]

    def _draft_s(self) -> float:
        return self.draft.decode_s if self.draft is not None else 0.0

    def _draft_behind(self, committed: list[int]) -> int:
        if self.draft is None:
            return 0
        return max(0, len(committed) - 1 - len(self.draft.cached))

    def reset(self) -> None:
        """Forget everything in both KV caches."""
        self.target.clear()
        if self.draft is not None:
            self.draft.clear()

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        draft_max: DraftMax = DEFAULT_DRAFT_MAX,
        stop: Sequence[str] = (),
        keep_cache: bool = False,
        draft_mode: DraftMode | None = None,
    ) -> GenerationResult:
        """Generate to the end; the arguments are those of `stream`."""
        stream = self.stream(prompt, max_tokens=max_tokens, sampling=sampling,
                             draft_max=draft_max, stop=stop, keep_cache=keep_cache,
                             draft_mode=draft_mode)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        draft_max: DraftMax = DEFAULT_DRAFT_MAX,
        stop: Sequence[str] = (),
        keep_cache: bool = False,
        draft_mode: DraftMode | None = None,
    ) -> GenerationStream:
        """Generate, yielding events as tokens are decided; the result is
        `stream.result` once it ends (also after close() or an interrupt).

        sampling: SamplingParams() when None. draft_max: a draft length (0 = the
        target alone), "auto" (cost-aware), "heuristic", or a policy object.
        keep_cache=True reuses whatever prefix of `prompt` the caches already
        hold (the chat REPL); otherwise every call starts clean. draft_mode:
        "model", "lookup" or "hybrid" (see make_strategy); None means
        `self.default_draft_mode`. Bad arguments raise here, before generating.
        """
        params = sampling or SamplingParams()
        validate_setting("max_tokens", max_tokens)
        mode = draft_mode or self.default_draft_mode
        target_p: dict[int, float] = {}  # filled by the round loop, read by ModelDraft
        strategy = make_strategy(mode, self, target_p)
        if strategy is not None and draft_max != 0:
            check_rewindable(self.target, "target")  # lookup drafts are cut back too
        committed = self.tokenize(prompt)
        if not committed:
            raise InvalidParameterError("the prompt is empty")
        if len(committed) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(committed)} tokens but the context window holds "
                f"{self.n_ctx}; raise n_ctx or shorten the prompt"
            )
        policy = make_policy(draft_max, self)  # last: "auto" may measure costs first
        stream = GenerationStream()
        stream._events = self._run(stream, committed, max_tokens, params, policy, mode,
                                   strategy, stop, keep_cache, target_p)
        return stream

    def _run(
        self,
        out: GenerationStream,
        committed: list[int],
        max_tokens: int,
        params: SamplingParams,
        policy: DraftLengthPolicy,
        mode: DraftMode,
        strategy: DraftStrategy | None,
        stop: Sequence[str],
        keep_cache: bool,
        target_p: dict[int, float],
    ) -> Generator[Event, None, None]:
        n_prompt = len(committed)
        rng = np.random.default_rng(params.seed)
        stats = Stats(prompt_tokens=n_prompt, target_at=self.target.placement)
        models = [m for m in (self.target, self.draft) if m is not None]
        if not keep_cache:
            self.reset()

        # Prompt: everything but the last token goes into the target's cache now,
        # and into the draft model's only if it may draft in this call: where it
        # cannot pay (or in lookup mode) it is never read, and should the policy
        # change its mind, ModelDraft.propose catches the cache up first.
        t0 = time.perf_counter()
        prefix = committed[:-1]
        reused = self.target.sync_to(prefix)
        self.target.decode(prefix[reused:], "none")
        if self.draft is not None:
            kept = self.draft.sync_to(prefix)  # every cache stays a prefix of the history
            if mode != "lookup" and policy.may_draft("model"):
                self.draft.decode(prefix[kept:], "none")
        # While the policy keeps the draft model idle but may call it back, note p(x) of
        # each token the target draws alone: catching up, the draft shows how often it
        # would have guessed them (RoundOutcome.shadow), without drafting.
        shadow = self.draft is not None and mode != "lookup" and policy.may_draft("model")
        stats.prompt_reused = reused
        stats.prompt_s = time.perf_counter() - t0
        yield PromptEvaluated(n_prompt, reused, stats.prompt_s)

        text = TextStream(self.target.piece, stop)
        generated: list[int] = []
        finish: FinishReason | None = None
        target = self.target
        draft_s0 = self._draft_s()
        target_s0 = target.decode_s
        t_start = time.perf_counter()
        try:
            while finish is None:
                remaining = max_tokens - len(generated)
                # Verifying [last, d1..dk] needs positions up to len(committed) + k - 1.
                room = self.n_ctx - len(committed)
                if room < 0:
                    finish = "context"
                    break
                limit = min(remaining - 1, room)
                draft_s0_round, target_s0_round = self._draft_s(), target.decode_s
                t_round = time.perf_counter()

                def choose_k(source: str, match: int, lim: int = limit) -> int:
                    return min(policy.choose(source, match), lim)

                draft = (
                    strategy.propose(committed, choose_k, params, rng, policy.extend)
                    if strategy is not None and limit > 0
                    else Draft()
                )
                k = len(draft.tokens)
                if draft.tokens:
                    yield DraftProposed(tuple(draft.tokens), draft.source)

                # Verify: one target pass over [last, d1..dk] gives p_1..p_{k+1}.
                target.decode([committed[-1], *draft.tokens], "all" if draft.tokens else "last")
                seen = _Seen(draft.tokens, draft.qs, target.logits_row, params)
                p_drawn = 1.0  # p(x) of a token drawn from p directly (greedy: 1)

                def draw(i: int, r: np.random.Generator) -> int:
                    nonlocal p_drawn
                    token, p_drawn = sample_logits_and_p(target.logits_row(i), params, r)
                    return token

                if params.greedy:
                    m, x = verify_greedy(seen.argmax, draft.tokens)
                else:
                    m, x = verify(seen.probs, draft.tokens, draft.qs, rng, draw)

                if shadow and not draft.tokens:
                    target_p[len(committed)] = p_drawn

                # Commit d1..dm and x, stopping at end-of-generation or max_tokens.
                new = [*draft.tokens[:m], x]
                emitted: list[int] = []
                for token in new:
                    emitted.append(token)
                    if target.is_eog(token):
                        finish = "eos"
                        break
                    if len(generated) + len(emitted) == max_tokens:
                        finish = "length"
                        break
                n_before = len(generated)
                n_drafted_emitted = min(m, len(emitted))
                released = text.feed(emitted[:n_drafted_emitted])
                if len(emitted) > n_drafted_emitted and not text.stopped:
                    released_x = text.feed(emitted[n_drafted_emitted:])
                else:
                    released_x = ""
                committed.extend(emitted)
                generated.extend(emitted)
                if text.stopped:
                    # Keep tokens only up to the one in which the stop text begins: the
                    # caches, res.tokens and the stats then match the text the user saw,
                    # so a chat's next turn continues from it (the cut may reach back
                    # into earlier rounds when the stop was held back across them).
                    finish = "stop"
                    keep = tokens_covering(self.target, generated, len(text.text))
                    del generated[keep:]
                    del committed[n_prompt + keep :]
                    emitted = emitted[: max(0, keep - n_before)]
                target.truncate(len(committed) - 1)
                if strategy is not None:
                    strategy.settle(committed)
                stats.record_round(len(draft.tokens), m, len(emitted))
                policy.observe(
                    RoundOutcome(
                        k, m, draft.source,
                        target.decode_s - target_s0_round,
                        self._draft_s() - draft_s0_round,
                        time.perf_counter() - t_round,
                        tuple(draft.shadow),
                        draft.steps_s,
                        self._draft_behind(committed),
                        draft.caught_up,
                        tuple(draft.confidences),
                        draft.rows,
                    )
                )

                n_accepted_kept = min(n_drafted_emitted, len(emitted))
                if n_accepted_kept:
                    yield TokensAccepted(tuple(emitted[:n_accepted_kept]), released)
                elif released:  # text held back in earlier rounds, released by the stop
                    yield TextFlushed(released)
                kind: TargetKind = (
                    "plain" if not draft.tokens else ("bonus" if m == k else "correction")
                )
                if len(emitted) > n_drafted_emitted:
                    yield TargetToken(x, released_x, kind)
                elif released_x:
                    yield TextFlushed(released_x)
                yield RoundVerified(
                    tuple(draft.tokens), m, x, kind, len(emitted), tuple(seen.p), seen.q,
                    draft.source, self._draft_s() - draft_s0_round,
                    target.decode_s - target_s0_round, time.perf_counter() - t_round,
                )
        except GeneratorExit:
            finish = "interrupted"
            raise
        except Exception:
            finish = "error"
            raise
        finally:
            # Whatever happened (early close, Ctrl-C, an error), both caches end
            # as a prefix of committed[:-1], so the next call is correct.
            for m_ in models:
                m_.sync_to(committed[:-1])
            stats.generate_s = time.perf_counter() - t_start
            stats.target_s = target.decode_s - target_s0
            stats.draft_s = self._draft_s() - draft_s0
            stats.policy_note = policy.describe()
            stats.policy_detail = policy.explain()
            stats.predicted_speedup = policy.predicted_speedup()
            stats.tokens = len(generated)
            out.result = GenerationResult(
                generated, text.text, finish or "interrupted", stats, n_prompt
            )
        tail = text.flush()
        if tail:
            yield TextFlushed(tail)
        out.result = GenerationResult(generated, text.text, finish, stats, n_prompt)
        yield Finished(out.result)


def tokens_covering(model: Model, tokens: list[int], n_chars: int) -> int:
    """The fewest leading `tokens` whose text reaches `n_chars` characters: where a stop
    string cut the text, the token it begins in is the last one kept."""
    if n_chars <= 0:
        return 0
    for j in range(1, len(tokens) + 1):
        if len(model.detokenize(tokens[:j])) >= n_chars:
            return j
    return len(tokens)


class _Seen:
    """Reads the target's rows for verify() and keeps, for RoundVerified, q_i(d_i) and
    p_i(d_i) of each row read (None where none is). Greedy p is one-hot: 1 where d_i is
    the target's argmax, else 0."""

    def __init__(self, drafts: list[int], qs: list[np.ndarray | None],
                 logits_row: Callable[[int], np.ndarray], params: SamplingParams) -> None:
        self.drafts = drafts
        self._logits_row = logits_row
        self._params = params
        self.p: list[float | None] = [None] * len(drafts)
        self.q = tuple(1.0 if q is None else _at(q, d) for d, q in zip(drafts, qs))

    def probs(self, i: int) -> np.ndarray:
        """p_i, the target's processed distribution at row i."""
        p = probabilities(self._logits_row(i), self._params)
        if i < len(self.drafts):
            self.p[i] = _at(p, self.drafts[i])
        return p

    def argmax(self, i: int) -> int:
        best = int(np.argmax(self._logits_row(i)))
        if i < len(self.drafts):
            self.p[i] = 1.0 if best == self.drafts[i] else 0.0
        return best


def _at(dist: np.ndarray, token: int) -> float:
    """dist(token); 0 for an id beyond it (pairs whose vocabularies differ in size)."""
    return float(dist[token]) if token < dist.shape[0] else 0.0
