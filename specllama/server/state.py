"""What the worker knows and tells: its running totals, why the engine is down and when
it is tried again, and a snapshot of both that /health and /metrics read at one moment.

Kept apart from the worker's threads (worker.py): these are plain values, copied under
the worker's lock, so a reader on the event loop never sees a count half updated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .. import GenerationResult, Stats
from .jobs import Failure
from .promptcache import CacheFigures


@dataclass
class Totals:
    """What the server did, for /health and the summary at exit."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0  # 503: queue full, shutting down, engine down
    engine_restarts: int = 0
    busy_s: float = 0.0
    stats: Stats = field(default_factory=Stats)

    def as_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "rejected": self.rejected,
            "engine_restarts": self.engine_restarts,
            "tokens": self.stats.tokens,
        }

    def add(self, busy_s: float, results: list[GenerationResult], choices: int,
            failed: bool) -> None:
        """A request served: `results` are its choices' that ran (fewer than `choices`,
        or the last interrupted: it was cancelled)."""
        self.busy_s += busy_s
        if failed:
            self.failed += 1
        # (not job.cancelled: the HTTP side cancels each job it answered, maybe by now)
        elif len(results) < choices or results[-1].finish_reason == "interrupted":
            self.cancelled += 1
        else:
            self.completed += 1
        for result in results:
            self.stats.merge(result.stats)


@dataclass(frozen=True)
class Down:
    """Why the engine is not serving, and when the next start is due."""

    reason: str
    remote: bool
    retry_at: float  # time.monotonic(); a start may be under way past it

    def failure(self) -> Failure:
        wait = max(1, math.ceil(self.retry_at - time.monotonic()))
        what = "the target's RPC server is unreachable" if self.remote else \
            "the engine is restarting"
        return Failure(503, f"{what} ({self.reason}); retry later", "engine_unavailable", wait)


@dataclass(frozen=True)
class Snapshot:
    """What /health and /metrics read, taken at one moment (Worker.snapshot)."""

    totals: Totals  # a copy
    busy: bool
    serving: int  # requests being generated now
    waiting: int  # queued behind them
    parallel: int
    cache: dict[str, int | bool]  # a copy
    prompt_cache: CacheFigures
    engine_pid: int | None
    down: Down | None


def summary(label: str, queue_s: float, results: list[GenerationResult],
            failed: str | None) -> list[str]:
    """The log's lines for one request: why it failed, or each choice's figures."""
    if failed is not None:
        return [f"{label}: failed: {failed}"]
    if not results:
        return [f"{label}: cancelled before it began"]
    lines = []
    for i, result in enumerate(results):
        s = result.stats
        which = f"{label} choice {i}" if len(results) > 1 else label
        lines.append(
            f"{which}: {result.finish_reason}, {s.prompt_tokens} prompt tokens "
            f"({s.prompt_reused} cached), {s.tokens} generated, acceptance "
            f"{s.acceptance_rate:.0%}, {s.tokens_per_step:.2f} tokens/step, "
            f"{s.tokens_per_s:.1f} tok/s, queued {queue_s:.2f} s")
    return lines
