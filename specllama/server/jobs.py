"""One request's generation on a decoder: what the worker asks (an Order), what it
gets back (events, then an Outcome), and how a failure answers (a Failure).

A `Slot` runs orders on a decoder in the calling thread. `specllama serve` runs its
slots in an engine process (isolation.py), so these types are plain data that pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from .. import (
    ConstraintError,
    ContextOverflowError,
    Event,
    Finished,
    GenerationResult,
    GenerationStream,
    InvalidParameterError,
    PromptEvaluated,
    SpecLlamaError,
    SpeculativeDecoder,
    Stats,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from ..engine.drafting.chain import Drafters
from ..engine.llama.kvreport import cache_report
from ..policy.compare import Comparison, compare_with_target
from .calls import evaluated
from .promptcache import CacheFigures, PromptCache
from .prompts import Work

#: The events that carry text: what a stream sends on.
TEXT_EVENTS = (TokensAccepted, TargetToken, TextFlushed)

# The errors a request itself can cause during its generation (400); any other failure
# (a KV cache llama.cpp refused to cut, a failed decode, ...) is the server's (500).
_CLIENT_ERRORS = (InvalidParameterError, ContextOverflowError, ConstraintError)


@dataclass(frozen=True)
class Failure:
    """How a request that could not be served answers (an OpenAI-shaped error)."""

    status: int
    message: str
    code: str | None = None
    retry_after: int | None = None  # seconds, for a 503

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        if isinstance(error, _CLIENT_ERRORS):
            return cls(400, str(error))
        what = str(error) if isinstance(error, SpecLlamaError) else \
            f"{type(error).__name__}: {error}"
        return cls(500, f"generation failed: {what}")


SHUTTING_DOWN = Failure(503, "the server is shutting down", "shutting_down", 5)


#: How much of a generation's events a request reads: its end (Finished or a Failure),
#: its text as it comes too, or every event (the round-event stream).
Wanted = Literal["end", "text", "all"]


@dataclass(frozen=True)
class Order:
    """One request as a slot sees it; `id`s grow, so 'cancel up to id' is one number."""

    id: int
    work: Work
    events: Wanted  # what to hand over before the Outcome
    draft_max: int | str
    drafters: Drafters
    # The run against the target alone (a Comparison) just before Finished: the
    # round-event stream's last figures (server/apis/roundstream.py).
    compare: bool = False
    choice: int = 0  # which of the request's choices (Work.choices) this is


def choice_work(work: Work, choice: int) -> Work:
    """Choice `choice`'s own draw from the target's law: the request's seed + `choice`
    where it gave one (as llama-server seeds n_cmpl's), else fresh entropy each time.
    Greedy choices are all the one answer."""
    seed = work.sampling.seed
    if not choice or seed is None:
        return work
    return replace(work, sampling=replace(work.sampling, seed=seed + choice))


@dataclass(frozen=True)
class Evaluated:
    """Tokens each model has decoded so far (chat's per-turn figures), sent before a
    PromptEvaluated when an order wants every event."""

    counts: dict[str, int]


#: What a running order hands over, besides its Outcome.
Item = Event | Evaluated | Comparison


@dataclass(frozen=True)
class Outcome:
    """How an order ended. `result` None: it never began."""

    result: GenerationResult | None
    failure: Failure | None = None
    cache: dict[str, int | bool] = field(default_factory=dict)  # /health's "cache"
    evaluated: dict[str, int] = field(default_factory=dict)
    prompt_cache: CacheFigures = CacheFigures()


class Decoding(Protocol):
    """What the worker drives: an engine process (isolation.EngineProcess) or one in
    this process (Slot, slots.Slots: never lost, nothing to cancel or kill)."""

    @property
    def starts(self) -> int:
        """Times started: a job begun at another count had an engine since lost."""

    @property
    def parallel(self) -> int: ...  # requests served at once: the models' sequences
    @property
    def pid(self) -> int | None:
        """The engine process's (/health's engine_pid); None in this process."""

    def prepare(self) -> str | None: ...
    def run(self, order: Order, put: Callable[[Item], None],
            cancelled: Callable[[], bool]) -> Outcome: ...
    def cancel(self, order_id: int) -> None:
        """From any thread: stop order `order_id` at its next round, past `cancelled`."""

    def start(self) -> object:
        """Start it again after an EngineLost."""

    def kill(self) -> None:
        """End it at once, a thread stuck in `run` or not (after close's threads)."""

    def close(self) -> None: ...


class InProcess:
    """What the worker asks of an engine process (Decoding), answered in this
    process instead: started once, when made, and never lost."""

    starts = 1
    parallel = 1  # requests served at once (slots.Slots: more)
    pid: int | None = None  # (/health's engine_pid)

    def cancel(self, order_id: int) -> None:
        """Nothing to tell: `run` reads `cancelled` at every event."""

    def start(self) -> None:
        """Nothing to start again: it is never lost."""

    def kill(self) -> None:
        """Nothing to end at once: `close` closes the decoder."""


class Slot(InProcess):
    """A decoder serving orders one at a time, on the calling thread (slots.py holds N)."""

    def __init__(self, decoder: SpeculativeDecoder,
                 prepare: Callable[[], None] | None = None, cache_bytes: int = 0,
                 prompt_cache: PromptCache | None = None) -> None:
        """prompt_cache: one shared with other slots (slots.py); else one of
        cache_bytes."""
        self.decoder = decoder
        self._prepare = prepare
        self.prompt_cache = prompt_cache or PromptCache(cache_bytes)
        self._history: list[int] = []  # the last prompt + what was generated for it

    def prepare(self) -> str | None:
        """Measure auto's costs (on the thread that decodes); the reason if that failed."""
        try:
            if self._prepare is not None:
                self._prepare()
        except Exception as exc:  # measured again at the first request; never fatal here
            return f"measuring decode costs failed: {type(exc).__name__}: {exc}"
        return None

    def run(self, order: Order, put: Callable[[Item], None],
            cancelled: Callable[[], bool],
            active: Callable[[], AbstractContextManager[object]] = nullcontext) -> Outcome:
        """Generate, handing over the events the request reads; a job cancelled stops
        at the next event: between rounds, or between a long prompt's steps (the engine
        then puts both KV caches back to a prefix of what was committed, so the next
        request is served correctly). One cancelled before it began does not begin.
        active(): held from the prompt to the Finished event (a slot's Batcher.active,
        slots.py): the slow work around it (prompt-cache copies, a grammar's compile,
        llguidance's tokenizer, the suffix cache's save) holds no other slot back."""
        wanted: tuple[type, ...] = {"end": (Finished,), "text": (Finished, *TEXT_EVENTS),
                                     "all": (object,)}[order.events]
        work, failure, finished, stream = order.work, None, False, None
        d = self.decoder
        if cancelled():  # it waited for a slot (child.py) while its client left
            return self._outcome(None, None)
        try:
            self.prompt_cache.prepare(list(work.tokens), d.target,
                                      d.draft if d.draft_model is d.draft else None,
                                      sibling=order.choice > 0)
            # Inside the try: arguments refused here must fail this order, not the engine.
            stream = self._stream(order)
            with active():
                for event in stream:
                    if cancelled():
                        break
                    if isinstance(event, PromptEvaluated) and order.events == "all":
                        put(Evaluated(evaluated(self.decoder)))
                    if isinstance(event, Finished) and order.compare:
                        put(self._compare(event.result.stats))
                    if isinstance(event, wanted):
                        put(event)
                    if isinstance(event, Finished):
                        finished = True
                        break
            if finished:  # nothing decodes after Finished: the suffix cache remembers
                for _ in stream:
                    pass
        except Exception as exc:
            failure = Failure.of(exc)
        finally:
            if stream is not None:  # GeneratorExit in the engine: caches back to a prefix
                stream.close()
        result = stream.result if stream is not None else None
        if result is not None and not finished and failure is None:
            put(Finished(result))  # cut short: what there is, for a stream to end on
        if result is not None:
            self._history = list(work.tokens) + list(result.tokens)
        elif stream is not None:  # stopped in its prompt: the caches hold a prefix of it
            self._history = list(work.tokens)
        return self._outcome(result, failure)

    def _stream(self, order: Order) -> GenerationStream:
        """The order's generation on this slot's decoder, not begun yet."""
        work = order.work
        return self.decoder.stream(
            work.tokens,
            max_tokens=work.max_tokens,
            sampling=work.sampling,
            draft_max=order.draft_max,
            drafters=order.drafters,
            stop=work.stop,
            keep_cache=True,  # a resent conversation is evaluated from where it differs
            constraint=work.constraint,
            logprobs=work.logprobs,
            ignore_eos=work.ignore_eos,
            reasoning_budget=work.reasoning_budget,
            prediction=work.prediction or None,
            draft_prompt=self.decoder.draft_prompt_for(
                [{"role": r, "content": c} for r, c in work.turns]) if work.turns else None,
        )

    def _compare(self, stats: Stats) -> Comparison:
        """A figure for the turn's last event: never the turn's failure."""
        try:
            return compare_with_target(self.decoder, stats)
        except Exception:
            return Comparison("off")

    def _outcome(self, result: GenerationResult | None, failure: Failure | None) -> Outcome:
        cache = cache_report(self._history, self.decoder.target, self.decoder.draft_model).as_dict()
        return Outcome(result, failure, cache, evaluated(self.decoder),
                       self.prompt_cache.figures())

    def close(self) -> None:
        self.decoder.close()
