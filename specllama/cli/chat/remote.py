"""`specllama chat` with its target on an RPC server: the models in an engine process
(server/isolation.py), so that a lost server ends a turn, not the conversation.

`RemoteDecoder` stands in for the SpeculativeDecoder that ChatSession drives: the
vocabularies are loaded here (vocab_only), generation and the caches live in the engine
process. When that process dies, the turn ends with one line; the next call starts it
again (loading the pair, which fails with one line while the server is still away).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from ... import Event, GenerationResult, SpecLlamaError, Stats
from ...engine.drafting.chain import Drafters
from ...engine.llama import DraftTraits, Vocabulary
from ...engine.llama.kvreport import CacheReport
from ...loading import RunOptions, RunSettings, chat_engine
from ...policy.compare import Comparison
from ...server.isolation import EngineLost, EngineProcess
from ...server.jobs import Evaluated, Order, Outcome
from ...server.prompts import Work
from .signals import sigint_ignored, whole_messages

RETRY_HINT = "the conversation is kept; /retry sends your message again"


class RemoteModel(Vocabulary):
    """One model of the pair as chat sees it: its vocabulary here, its cache there."""

    def __init__(self, path: str, name: str, owner: RemoteDecoder,
                 drafts_as: Literal["model", "mtp"] = "model") -> None:
        super().__init__(path)
        self._name, self._owner = name, owner
        # as the engine's draft: "mtp" for the target's layers (who_drafts reads it)
        self.traits = DraftTraits("remote", "the engine process's draft", drafts_as=drafts_as)

    @property
    def tokens_evaluated(self) -> int:
        return self._owner.evaluated.get(self._name, 0)

    def sync_to(self, tokens: list[int]) -> int:
        if self._owner.lost is not None:  # a new engine starts with empty caches anyway
            return 0
        synced: int = self._owner.call("sync", self._name, tokens)
        return synced


class RemoteDecoder:
    """The parts of SpeculativeDecoder that chat uses, over an engine process."""

    def __init__(self, run: RunOptions) -> None:
        self._engine = EngineProcess(functools.partial(chat_engine, run))
        settings, draft, slot = self._engine.start()
        self.settings: RunSettings = settings
        self.n_ctx: int = settings.n_ctx
        self._p_min: float = settings.p_min
        self.evaluated: dict[str, int] = {}
        self.lost: EngineLost | None = None
        self._orders = 0
        self.target = RemoteModel(settings.target, "target", self)
        self.draft = RemoteModel(draft, "draft", self, "mtp" if slot == "mtp" else "model") \
            if draft else None
        self.draft_model = self.draft  # in the engine process the draft is synced in target ids

    @property
    def p_min(self) -> float:
        return self._p_min

    @p_min.setter
    def p_min(self, value: float) -> None:
        self._p_min = value
        if self.lost is None:
            self.call("set_p_min", value)

    def call(self, name: str, *args: Any) -> Any:
        self._ensure()
        try:
            return self._engine.call(name, *args)
        except EngineLost as exc:
            self.lost = exc
            raise SpecLlamaError(f"{exc}; {RETRY_HINT}") from None

    def _ensure(self) -> None:
        """Start the engine again after a loss (the pair loads anew: seconds)."""
        if self.lost is None:
            return
        try:
            self._engine.start()
        except SpecLlamaError as exc:
            raise SpecLlamaError(f"the target is still unreachable: {exc}; {RETRY_HINT}") \
                from None
        self.lost, self.evaluated = None, {}
        self._engine.call("set_p_min", self._p_min)

    def stream(self, tokens: Sequence[int], *, max_tokens: int, sampling: Any,
               draft_max: int | str, drafters: Drafters, stop: Sequence[str] = (),
               keep_cache: bool = True, constraint: Any = None,
               draft_prompt: Sequence[int] | None = None) -> RemoteStream:
        self._ensure()
        self._orders += 1
        work = Work("chat", list(tokens), max_tokens, sampling, tuple(stop), constraint)
        return RemoteStream(self, Order(self._orders, work, "all", draft_max, drafters))

    def cache_report(self, history: Sequence[int]) -> CacheReport:
        report: CacheReport = self.call("cache_report", list(history))
        return report

    def compare(self, stats: Stats) -> Comparison:
        comparison: Comparison = self.call("compare", stats)
        return comparison

    def close(self) -> None:
        self._engine.close()
        for model in (self.target, self.draft):
            if model is not None:
                model.close()


class RemoteStream:
    """A GenerationStream's face (iterate, `result`, `close`) over an engine process."""

    def __init__(self, owner: RemoteDecoder, order: Order) -> None:
        self._owner, self._order = owner, order
        self._messages = owner._engine.messages(order)
        self._done = False
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Event]:
        while not self._done:
            message = self._next()
            if isinstance(message, Evaluated):
                self._owner.evaluated = message.counts
            elif not isinstance(message, Outcome):
                yield message

    def close(self) -> None:
        """Stop the generation at its next round and read what is left of it."""
        if not self._done:
            self._owner._engine.cancel(self._order.id)
            with sigint_ignored():
                while not self._done:
                    self._next()

    def _next(self) -> Any:
        try:
            with whole_messages(lambda: self._owner._engine.cancel(self._order.id)):
                message = next(self._messages)
        except EngineLost as exc:
            self._done, self._owner.lost = True, exc
            raise SpecLlamaError(f"{exc}; {RETRY_HINT}") from None
        if isinstance(message, Outcome):
            self._done = True
            self._owner.evaluated = message.evaluated
            self.result = message.result
            if message.failure is not None:
                raise SpecLlamaError(message.failure.message)
        return message
