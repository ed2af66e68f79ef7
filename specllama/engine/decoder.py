"""The decoder: a target model, optionally a draft model, and the API of a generation
(`generate`, `stream`). The round loop itself is `engine/loop/rounds.py`; who drafts,
`engine/drafting/chain.py`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path

import numpy as np

from ..errors import ContextOverflowError, InvalidParameterError
from .constraint import Constraint, ConstraintSpec
from .drafting import kinds
from .drafting.chain import NOBODY, DraftChain, Drafters, build_chain, who_drafts
from .drafting.draftcache import DraftCache
from .drafting.prediction import Prediction
from .llama import DraftModel, Model
from .loop.budget import ReasoningBudget
from .loop.events import Event, GenerationResult
from .loop.lengths import DraftMax, make_policy
from .loop.rounds import Generation, GenerationStream
from .loop.textstream import Stop
from .sampling import SamplingParams
from .settings import default, validate_setting

__all__ = ["GenerationResult", "GenerationStream", "SpeculativeDecoder"]

# The API's defaults are the settings table's, the same as the command line's.
DEFAULT_MAX_TOKENS: int = default("max_tokens")
DEFAULT_DRAFT_MAX: DraftMax = default("draft_max")
DEFAULT_P_MIN: float = default("p_min")

#: Who drafts: names in order ("lookup,model"), a shorthand ("hybrid"), or () for nobody.
DraftersArg = str | Sequence[str]
#: Tokens the draft model draws ahead at most while the target verifies one batch.
AHEAD_MAX = 16


class SpeculativeDecoder:
    """A target model, optionally a draft model, and the exact speculative loop."""

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        p_min: float = DEFAULT_P_MIN,
        drafters: DraftersArg | None = None,
        cross_vocab: bool = False,
    ) -> None:
        """drafters: who drafts when stream()/generate() are not told (chain.who_drafts:
        None for the default, lookup then the draft model or the target's MTP layers; ()
        or "none" for nobody, the target alone). cross_vocab: a
        draft whose tokenizer differs drafts through the tokens both vocabularies spell
        alike (engine/drafting/crossvocab.py); without it such a pair is refused."""
        if draft is None:
            draft = kinds.self_draft(target)  # the target drafts for itself (its MTP layers)
        chosen = who_drafts(drafters, draft, target.path.name)
        #: The draft model as the round loop drives it (in target ids; `draft` is the file loaded).
        self.draft_model: DraftModel | None = \
            None if draft is None else kinds.in_target_ids(draft, target, cross_vocab)
        self.cross_vocab = self.draft_model is not None and \
            self.draft_model.traits.vocabulary == "mapped"
        self.target = target
        self.draft = draft
        self.p_min: float = validate_setting("p_min", p_min)
        self.default_drafters: Drafters = chosen
        #: Threads of each model: `threads` in all; with `draft_threads` > 0 the draft
        #: model drafts ahead on that many while the target verifies on the rest.
        self.threads = target.n_threads
        self.draft_threads = 0
        # What draft-length policies keep across calls (auto: the measured costs).
        self.policy_state: dict[str, object] = {}
        # What lookups copy from beyond the context: earlier calls' outputs, a corpus.
        self.draft_cache = DraftCache()
        self._eog: np.ndarray | None = None  # the target's end-of-generation ids (_masks)

    @classmethod
    def load(
        cls,
        target: str | Path,
        draft: str | Path | None = None,
        *,
        n_ctx: int = default("n_ctx"),
        n_threads: int | None = default("threads"),
        p_min: float = DEFAULT_P_MIN,
        drafters: DraftersArg | None = None,
        target_rpc: Sequence[str] = (),
        cross_vocab: bool = False,
        n_seq: int = 1,
    ) -> SpeculativeDecoder:
        """draft: a GGUF path, or None / "lookup" for no draft model. drafters: who
        drafts when generate()/stream() are not told; None: Drafters.default (lookup,
        then the draft model or the target's MTP layers); () for nobody. target_rpc:
        HOST:PORT of llama.cpp RPC servers that hold the target (the draft stays local).
        n_seq: sequences each model's context holds (server/slots.py)."""
        if drafters is not None:  # refused before a minute of loading
            drafters = Drafters.parse(drafters)
        kinds.check_target_file(Path(target))
        target_model = Model(target, n_ctx=n_ctx, n_threads=n_threads, rpc=target_rpc,
                             n_seq=n_seq)
        draft_model = None
        is_lookup = draft is not None and str(draft) == "lookup"
        try:
            if draft is not None and not is_lookup:
                draft_model = kinds.load_draft(Path(draft), kinds.Beside(
                    target_model, n_ctx, n_threads, n_seq))
        except BaseException:
            target_model.close()
            raise
        return cls(
            target_model,
            draft_model,
            p_min=p_min,
            drafters=drafters,
            cross_vocab=cross_vocab,
        )

    def close(self) -> None:
        self.draft_cache.save(force=True)
        if self.draft is not None:  # first: an MTP draft runs on the target's weights
            self.draft.close()
        self.target.close()

    @property
    def may_draft_ahead(self) -> bool:
        """Whether the draft model can draft while the target verifies (its kind says:
        an assistant, which reads the target's cache, cannot)."""
        return self.draft_model is not None and self.draft_model.traits.ahead

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx if self.draft is None else min(self.target.n_ctx, self.draft.n_ctx)

    def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        """A str gets BOS if the model wants one and its special tokens parsed."""
        if isinstance(prompt, str):
            return self.target.tokenize(prompt, add_bos=self.target.adds_bos, special=True)
        return [int(t) for t in prompt]

    def reset(self) -> None:
        """Forget everything in both KV caches."""
        self.target.clear()
        if self.draft_model is not None:
            self.draft_model.clear()

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        draft_max: DraftMax = DEFAULT_DRAFT_MAX,
        stop: Sequence[Stop] = (),
        keep_cache: bool = False,
        drafters: DraftersArg | None = None,
        constraint: ConstraintSpec | None = None,
        logprobs: int | None = None,
        draft_cache: bool = True,
        draft_prompt: Sequence[int] | None = None,
        ignore_eos: bool = False,
        reasoning_budget: ReasoningBudget | None = None,
        prediction: str | Sequence[int] | None = None,
    ) -> GenerationResult:
        """Generate to the end; the arguments are those of `stream`."""
        stream = self.stream(prompt, max_tokens=max_tokens, sampling=sampling,
                             draft_max=draft_max, stop=stop, keep_cache=keep_cache,
                             drafters=drafters, constraint=constraint,
                             logprobs=logprobs, draft_cache=draft_cache,
                             draft_prompt=draft_prompt, ignore_eos=ignore_eos,
                             reasoning_budget=reasoning_budget, prediction=prediction)
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
        stop: Sequence[Stop] = (),
        keep_cache: bool = False,
        drafters: DraftersArg | None = None,
        constraint: ConstraintSpec | None = None,
        logprobs: int | None = None,
        draft_cache: bool = True,
        draft_prompt: Sequence[int] | None = None,
        ignore_eos: bool = False,
        reasoning_budget: ReasoningBudget | None = None,
        prediction: str | Sequence[int] | None = None,
    ) -> GenerationStream:
        """Generate, yielding events as tokens are decided; the result is
        `stream.result` once it ends (also after close() or an interrupt).

        sampling: SamplingParams() when None. draft_max: a draft length (0 = the target
        alone), "auto" (cost-aware), "heuristic", or a policy object. stop: strings that end
        the text where they begin, and `Repeat` rules (a block written twice ends it:
        loop/textstream.py). keep_cache=True reuses whatever prefix of `prompt` the caches
        hold (the chat REPL); else every call starts clean. drafters: who drafts (a Drafters
        value, or text such as "lookup,model"; () for nobody); None means
        `self.default_drafters`. constraint: a JSON schema, grammar or regex the output
        follows (the target's distribution masked to what it allows; see
        engine/constraint.py); unless draft_max is 0, the tokens it forces are drafted for
        free. logprobs: n keeps each token's log-probability under the target and its n
        likeliest alternatives in `result.logprobs` (0-20). draft_cache: lookup drafts copy
        from `self.draft_cache` too (a corpus, a persisted cache, earlier calls' outputs;
        not those where a seed is to repeat sampled output: a fixed draft length, a seed and
        temperature > 0); False: from this call's context alone. Either way the output joins
        the cache. draft_prompt: for a cross-vocabulary pair, the draft's own tokens for the
        prompt (its chat template's rendering of the same conversation, see
        `draft_prompt_for`); None: it reads the target's text. ignore_eos: the target's
        end-of-generation tokens cannot end the answer (`_masks`). reasoning_budget: the
        reasoning's close marker forced once it has run its tokens (loop/budget.py).
        prediction: text (or target tokens) the output is expected to resemble (OpenAI's
        Predicted Outputs), drafted first wherever the output follows it
        (drafting/prediction.py). Bad arguments raise here, before generating.
        """
        params = sampling or SamplingParams()
        _check_arguments(max_tokens, logprobs, reasoning_budget)
        committed = self._prompt(prompt)
        matcher, banned = self._masks(constraint, ignore_eos)
        chain = self._chain(drafters, params, draft_max, draft_cache, matcher, prediction)
        policy = make_policy(draft_max, self)  # last: "auto" may measure costs first
        generation = Generation(
            self.target, chain, committed, n_ctx=self.n_ctx, max_tokens=max_tokens,
            params=params, policy=policy, stop=stop, keep_cache=keep_cache,
            constraint=matcher, logprobs=logprobs, draft_model=self.draft, banned=banned,
            budget=reasoning_budget,
        )
        stream = GenerationStream()
        aliased = None if draft_prompt is None else [int(t) for t in draft_prompt]
        stream._events = self._remembered(generation, stream, aliased)
        return stream

    def _prompt(self, prompt: str | Sequence[int]) -> list[int]:
        committed = self.tokenize(prompt)
        if not committed:
            raise InvalidParameterError("the prompt is empty")
        if len(committed) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(committed)} tokens but the context window holds "
                f"{self.n_ctx}; raise n_ctx or shorten the prompt"
            )
        return committed

    def _masks(self, constraint: ConstraintSpec | None,
               ignore_eos: bool) -> tuple[Constraint | None, np.ndarray | None]:
        """The constraint's matcher, and the ids ignore_eos bans: the target's
        end-of-generation tokens, at -inf on every row of the target (llama-server's logit
        bias), so its law is p without them; a draft of one meets p = 0 and is rejected.
        Not both: a constraint's end is such a token, and it might allow nothing else."""
        if ignore_eos and constraint is not None:
            raise InvalidParameterError(
                f"ignore_eos cannot be combined with a constraint (the {constraint.describe()} "
                "ends the output with an end-of-generation token)")
        matcher = None if constraint is None else \
            Constraint(constraint, self.target.grammar_tokenizer(), self.target.n_vocab)
        if not ignore_eos:
            return matcher, None
        if self._eog is None:  # once per decoder: a ctypes call per id of the vocabulary
            self._eog = np.array([t for t in range(self.target.n_vocab)
                                  if self.target.is_eog(t)], dtype=np.int64)
        return matcher, self._eog

    def _prediction(self, prediction: str | Sequence[int] | None) -> Prediction | None:
        """The prediction in target tokens: text as the output would spell it (no BOS,
        special tokens as plain text), and whether the tokenizer added a space to it."""
        if isinstance(prediction, str):
            tokens = self.target.tokenize(prediction, add_bos=False, special=False)
            spelled = b"".join(self.target.piece(t) for t in tokens)
            return Prediction(tuple(tokens), spelled == b" " + prediction.encode())
        tokens = [] if prediction is None else [int(t) for t in prediction]
        if any(not 0 <= t < self.target.n_vocab for t in tokens):
            raise InvalidParameterError(f"prediction holds a token id outside the target's "
                                        f"vocabulary (0 to {self.target.n_vocab - 1})")
        return Prediction(tuple(tokens))

    def _chain(self, drafters: DraftersArg | None, params: SamplingParams,
               draft_max: DraftMax, draft_cache: bool, constraint: Constraint | None,
               prediction: str | Sequence[int] | None) -> DraftChain:
        """Who drafts this call (draft_max 0: nobody, not even a constraint's forced
        tokens or the prediction). A seed repeats sampled output for a fixed draft length
        (README), and only if the drafts repeat too: then lookups copy from the context
        and the corpus, which earlier calls do not change (auto's lengths follow timings:
        no such promise)."""
        names = self.default_drafters if drafters is None else \
            who_drafts(drafters, self.draft_model, self.target.path.name)
        if draft_max == 0:  # (a lookup asked every round for a length of 0 still searched)
            names = NOBODY
        predicted = self._prediction(prediction) if draft_max != 0 else None
        history = params.greedy or params.seed is None or not isinstance(draft_max, int)
        archives = self.draft_cache.archives(history) if draft_cache and names else []
        # Shadow acceptance reads its rows at earlier positions as predictions there:
        # not for a kind whose rows are not (another tokenizer's, an assistant's).
        shadow = self.draft_model is not None and self.draft_model.traits.shadow
        return build_chain(names, model=self.draft_model, p_min=self.p_min,
                           ends=self.target.is_eog, shadow=shadow,
                           archives=archives,
                           constraint=constraint if draft_max != 0 else None,
                           ahead=AHEAD_MAX if self.draft_threads else 0,
                           ahead_threads=self.draft_threads, prediction=predicted,
                           piece=self.target.piece)

    def set_threads(self, threads: int, draft_threads: int = 0) -> None:
        """Decode on `threads` threads in all. draft_threads > 0: the draft model drafts
        ahead on that many while the target verifies on the others (both at once), and in
        turn on all of them; 0: the models take turns, each on all of them."""
        if not (threads >= 1 and 0 <= draft_threads < threads) or \
                (draft_threads and self.draft is None):
            raise InvalidParameterError(
                f"draft threads must be fewer than the {threads} threads in all, and need "
                f"a draft model; got {draft_threads}")
        if draft_threads and not self.may_draft_ahead:
            assert self.draft is not None and self.draft_model is not None
            raise kinds.refusal(self.draft.path, self.draft_model.traits, kinds.NOT_AHEAD)
        self.threads, self.draft_threads = threads, draft_threads
        self.target.set_threads(threads - draft_threads)
        if self.draft is not None:
            self.draft.set_threads(threads)

    def draft_prompt_for(self, messages: list[dict[str, str]]) -> list[int] | None:
        """The draft's own chat-template rendering of a conversation (role/content
        dicts), for `stream(draft_prompt=...)`: only for a cross-vocabulary pair where
        both models have a chat template and the draft's renders it (else None: the
        draft reads the target's rendering)."""
        if not self.cross_vocab or self.draft is None or self.target.chat_template() is None \
                or self.draft.chat_template() is None:
            return None
        try:
            rendered = self.draft.format_chat(messages)
        except Exception:  # noqa: BLE001 - a template may refuse anything (a system role)
            return None
        return self.draft.tokenize_chat(rendered)

    def _remembered(self, generation: Generation, stream: GenerationStream,
                    draft_prompt: list[int] | None) -> Generator[Event, None, None]:
        """The generation's events; however it ends, its output joins the suffix cache."""
        if self.draft_model is not None:
            self.draft_model.set_prompt(generation.committed, draft_prompt)
        try:
            yield from generation.run(stream)
        finally:
            self.draft_cache.remember(generation.committed, generation.n_prompt)
            self.draft_cache.save()


def _check_arguments(max_tokens: int, logprobs: int | None,
                     reasoning_budget: ReasoningBudget | None) -> None:
    """stream's arguments that no other layer checks: InvalidParameterError naming one."""
    if type(max_tokens) is not int or max_tokens != 0:  # 0: the prompt only, nothing drawn
        validate_setting("max_tokens", max_tokens)
    if logprobs is not None and not (isinstance(logprobs, int) and 0 <= logprobs <= 20):
        raise InvalidParameterError(f"logprobs must be a whole number from 0 to 20, "
                                    f"not {logprobs!r}")
    if reasoning_budget is not None and not isinstance(reasoning_budget, ReasoningBudget):
        raise InvalidParameterError(
            f"reasoning_budget must be a ReasoningBudget or None, not {reasoning_budget!r}")
