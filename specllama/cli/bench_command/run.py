"""Running the bench: every mode on every prompt, interleaved, into one report."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...engine.constraint import ConstraintSpec
from ...engine.decoder import SpeculativeDecoder
from ...engine.drafting.chain import Drafters, draft_kind
from ...engine.llama import LLAMA_CPP_VERSION
from ...engine.loop.events import GenerationResult
from ...engine.sampling import SamplingParams
from ...errors import InvalidParameterError
from ...models.synthetic import SYNTHETIC_KEY
from ...policy import AutoState
from ...policy.calibration import cpu_model
from ...policy.cpumeter import CpuMeter, loadavg
from .prompts import BenchPrompt, Mode
from .summary import DEFAULT_MAX_FOREIGN, summarize

BENCH_VERSION = 1
DEFAULT_REPS = 3
DEFAULT_MAX_TOKENS = 128
DEFAULT_SEED = 0
WARMUP_TOKENS = 16


def machine_info() -> dict[str, Any]:
    return {"node": platform.node(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "llama_cpp": LLAMA_CPP_VERSION}


@dataclass
class _Bench:
    """One bench in progress: what every run shares, and the runs so far."""

    decoder: SpeculativeDecoder
    prompts: Sequence[BenchPrompt]
    modes: list[Mode]
    reps: int
    max_tokens: int
    sampling: SamplingParams
    drafters: Drafters | None
    raw: bool
    carry: bool
    constraint: ConstraintSpec | None
    say: Callable[[str], None]
    runs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seed0 = self.sampling.seed if self.sampling.seed is not None else DEFAULT_SEED
        self.encoded = {p.id: self.decoder.target.prompt(p.prompt, chat=p.chat and not self.raw)
                        for p in self.prompts}
        # a prompt's own schema, else the run's constraint
        self.constraints = {p.id: self.constraint if p.schema is None
                            else ConstraintSpec.json_schema(p.schema) for p in self.prompts}
        self.meter = CpuMeter()

    def generate(self, p: BenchPrompt, mode: Mode, seed: int, n: int) -> GenerationResult:
        s = self.sampling
        params = replace(s, seed=seed)  # the penalties too
        if not self.carry:
            self.decoder.draft_cache.forget_session()
        return self.decoder.generate(self.encoded[p.id], max_tokens=n, sampling=params,
                                     draft_max=mode.draft_max,
                                     drafters=mode.drafters or self.drafters,
                                     constraint=self.constraints[p.id],
                                     draft_cache=mode.draft_cache)

    def warm(self, p: BenchPrompt, mode: Mode) -> None:
        """An untimed short run."""
        self.generate(p, mode, self.seed0, min(WARMUP_TOKENS, self.max_tokens))

    def timed(self, p: BenchPrompt, mode: Mode, rep: int, slot: int) -> None:
        self.meter.start()
        result = self.generate(p, mode, self.seed0 + rep, self.max_tokens)
        foreign = self.meter.stop()
        s = result.stats
        self.runs.append({
            "prompt": p.id, "mode": mode.name, "draft_max": mode.draft_max,
            "rep": rep, "slot": slot, "seed": self.seed0 + rep,
            "finish_reason": result.finish_reason,
            "constrained": self.constraints[p.id] is not None,
            "foreign_cpu": foreign,
            **s.to_dict(),
        })
        busy = f"; other processes used {foreign:.0%} of the CPU" \
            if foreign is not None and foreign > 0.05 else ""
        total = len(self.prompts) * self.reps * len(self.modes)
        self.say(f"[{len(self.runs)}/{total}] {p.id} rep {rep + 1}/{self.reps} {mode.name}: "
                 f"{s.tokens_per_s:.1f} tok/s, {s.tokens} tokens{busy}")

    def settings(self, warmup: bool) -> dict[str, Any]:
        d, s = self.decoder, self.sampling
        settings: dict[str, Any] = {
            "target": str(d.target.path),
            "draft": str(d.draft.path) if d.draft is not None else None,
            "threads": d.target.n_threads,
            "n_ctx": d.n_ctx,
            "p_min": d.p_min,
            "drafters": str(self.drafters or d.default_drafters),
            "reps": self.reps,
            "max_tokens": self.max_tokens,
            "seed": self.seed0,
            "sampling": {"temperature": s.temperature, "top_k": s.top_k,
                         "top_p": s.top_p, "min_p": s.min_p,
                         # only where set: earlier reports read the same
                         **({"penalties": asdict(s.penalties)} if s.penalties else {})},
            "warmup": warmup,
            "carry": self.carry,
            "chat_template": not self.raw and bool(d.target.chat_template()),
        }
        synthetic = d.target.meta(SYNTHETIC_KEY)
        if synthetic:  # the target's own sentence: its costs are real, its text meaningless
            settings["synthetic"] = synthetic
        return settings


def run_bench(
    decoder: SpeculativeDecoder,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[Mode],
    *,
    reps: int = DEFAULT_REPS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sampling: SamplingParams | None = None,
    drafters: Drafters | None = None,
    warmup: bool = True,
    raw: bool = False,
    progress: Callable[[str], None] | None = None,
    max_foreign: float | None = DEFAULT_MAX_FOREIGN,
    constraint: ConstraintSpec | None = None,
    carry: bool = False,
) -> dict[str, Any]:
    """Run every mode on every prompt `reps` times, interleaved; the full report.
    `constraint` applies to the prompts without a schema of their own. Each run starts
    with the suffix cache as loaded (this process's earlier outputs forgotten), unless
    `carry`: then each repetition runs the prompts in order as one sequence of requests
    per mode, each drafting from the outputs before it."""
    if not isinstance(reps, int) or reps < 1:
        raise InvalidParameterError(f"reps must be an integer >= 1, got {reps!r}")
    if not prompts:
        raise InvalidParameterError("no prompts to run")
    for mode in modes:  # before the long run: a mode whose drafters this pair lacks
        if mode.drafters:
            mode.drafters.check(draft_kind(decoder.draft), decoder.target.path.name)
    bench = _Bench(decoder, prompts, list(modes), reps, max_tokens,
                   sampling or SamplingParams(seed=DEFAULT_SEED), drafters, raw, carry,
                   constraint, progress or (lambda _msg: None))
    load_start, t_begin = loadavg(), time.perf_counter()
    calibration: dict[str, Any] = {}
    if any(m.draft_max == "auto" for m in bench.modes):
        bench.say("calibrating decode costs")
        calibration = AutoState.for_decoder(decoder).calibration
    whole = _run_all(bench, warmup)
    report = {
        "version": BENCH_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": time.perf_counter() - t_begin,
        "machine": machine_info(),
        "loadavg": {"start": load_start, "end": loadavg()},
        # share of all cores busy with other processes while the timed runs ran
        "foreign_cpu": whole,
        "settings": bench.settings(warmup),
        "calibration": calibration,
        "modes": [asdict(m) for m in bench.modes],
        "prompts": [{**asdict(p), "prompt_tokens": len(bench.encoded[p.id])} for p in prompts],
        "runs": bench.runs,
    }
    report["summary"] = summarize(bench.runs, [m.name for m in bench.modes],
                                  [p.id for p in prompts], bench.modes, max_foreign)
    return report


def _run_all(bench: _Bench, warmup: bool) -> float | None:
    """The warm-up and every timed run; the share of the CPU other processes used."""
    if warmup:
        bench.say("warming up")
        for mode in bench.modes:
            bench.warm(bench.prompts[0], mode)
    whole = CpuMeter()
    whole.start()
    for p, mode, rep, slot, first in schedule(bench.prompts, bench.modes, bench.reps,
                                              bench.carry):
        if first and bench.carry:
            bench.decoder.draft_cache.forget_session()  # each sequence starts afresh
        elif first and warmup:  # untimed: the first run after a prompt change is slower
            bench.warm(p, bench.modes[0])
        bench.timed(p, mode, rep, slot)
    return whole.stop()


def schedule(prompts: Sequence[BenchPrompt], modes: Sequence[Mode], reps: int,
             carry: bool) -> Iterator[tuple[BenchPrompt, Mode, int, int, bool]]:
    """(prompt, mode, repetition, slot, first) in the order runs are made, the modes
    rotated per repetition. Each prompt's repetitions in turn, `first` at a new prompt;
    with `carry` each repetition runs every prompt in order per mode, `first` at the
    start of such a sequence."""
    for rep in range(reps) if carry else ():
        shift = rep % len(modes)
        for slot, mode in enumerate([*modes[shift:], *modes[:shift]]):
            for i, p in enumerate(prompts):
                yield p, mode, rep, slot, i == 0
    for p in prompts if not carry else ():
        for rep in range(reps):
            shift = rep % len(modes)
            for slot, mode in enumerate([*modes[shift:], *modes[:shift]]):
                yield p, mode, rep, slot, rep == 0 and slot == 0
