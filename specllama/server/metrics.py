"""/metrics: what the server did, in Prometheus' text format (version 0.0.4).

Counters since the server started (requests by how they ended, tokens generated, drafted
and accepted by where the draft came from, engine restarts), gauges of now (requests
waiting and in progress, what the KV caches hold) and two histograms: the time to the
first token of a streamed request (from its arrival) and the seconds per output token of
each finished request. Written by hand: a dozen lines of a plain text format are less
than a dependency.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engine.loop.stats import Stats
from .promptcache import CacheFigures

if TYPE_CHECKING:
    from .worker import Worker

#: Seconds: the time to a first token spans a cached prompt (milliseconds) to a long one
#: on a busy CPU (tens of seconds); a token's, a 135M model's few ms to an 8B's 200 ms+.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bound

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            running += count
            le = "+Inf" if bound == float("inf") else _num(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return [*out, f"{name}_sum {_num(self.total)}", f"{name}_count {self.n}"]


class Metrics:
    """Thread-safe: the worker records, the event loop renders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.per_token = Histogram(TOKEN_BUCKETS)

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def finished(self, stats: Stats) -> None:
        """A request that generated: its seconds per output token."""
        if stats.tokens > 0 and stats.generate_s > 0:
            with self._lock:
                self.per_token.observe(stats.generate_s / stats.tokens)

    def render(self, *, requests: dict[str, int], restarts: int, stats: Stats,
               waiting: int, running: int, cache: dict[str, int | bool],
               prompt_cache: CacheFigures) -> str:
        """The whole exposition: `requests` by status, `stats` summed over requests."""
        with self._lock:
            histograms = [
                ("specllama_time_to_first_token_seconds", "seconds from a streamed "
                 "request's arrival to its first token", self.ttft),
                ("specllama_time_per_output_token_seconds", "a finished request's "
                 "generation time over its tokens", self.per_token),
            ]
            text = [*_family("specllama_requests_total", "counter",
                             "requests by how they ended (rejected: 503, queue full, "
                             "engine down or shutting down)",
                             [({"status": s}, n) for s, n in requests.items()]),
                    *_family("specllama_tokens_generated_total", "counter",
                             "tokens generated", [({}, stats.tokens)]),
                    *_family("specllama_tokens_drafted_total", "counter",
                             "draft tokens verified, by where they came from",
                             [({"source": s}, n) for s, n in drafted(stats)[0].items()]),
                    *_family("specllama_tokens_accepted_total", "counter",
                             "draft tokens accepted, by where they came from",
                             [({"source": s}, n) for s, n in drafted(stats)[1].items()]),
                    *_family("specllama_engine_restarts_total", "counter",
                             "times the engine process was started again after a fault",
                             [({}, restarts)]),
                    *_family("specllama_requests_waiting", "gauge",
                             "requests queued behind those in progress", [({}, waiting)]),
                    *_family("specllama_requests_running", "gauge",
                             "requests being generated", [({}, running)]),
                    *_family("specllama_kv_cache_tokens", "gauge",
                             "tokens each model's KV cache holds after the last request",
                             [({"model": m}, cache[m]) for m in ("target", "draft")
                              if isinstance(cache.get(m), int)]),
                    *_family("specllama_prompt_cache_bytes", "gauge",
                             "bytes of KV copies the prompt cache keeps",
                             [({}, prompt_cache.bytes)]),
                    *_family("specllama_prompt_cache_limit_bytes", "gauge",
                             "the prompt cache's limit (--cache-mib)",
                             [({}, prompt_cache.limit_bytes)]),
                    *_family("specllama_prompt_cache_hits_total", "counter",
                             "requests that got a KV copy back",
                             [({}, prompt_cache.hits)]),
                    *_family("specllama_prompt_cache_tokens_restored_total", "counter",
                             "prompt tokens a KV copy spared evaluating",
                             [({}, prompt_cache.tokens_restored)])]
            for name, help_text, h in histograms:
                text += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram",
                         *h.lines(name)]
        return "\n".join(text) + "\n"


def exposition(worker: Worker) -> str:
    """/metrics: the worker's counters as they stand."""
    now = worker.snapshot()
    t = now.totals
    requests = {"completed": t.completed, "cancelled": t.cancelled,
                "failed": t.failed, "rejected": t.rejected}
    return worker.metrics.render(requests=requests, restarts=t.engine_restarts,
                                 stats=t.stats, waiting=now.waiting, running=now.serving,
                                 cache=now.cache, prompt_cache=now.prompt_cache)


def drafted(stats: Stats) -> tuple[dict[str, int], dict[str, int]]:
    """(drafted, accepted) by source: the draft model, each lookup origin, forced tokens
    (lookup origins count tokens spliced into model drafts too, not the model)."""
    lookup_d, lookup_a = sum(stats.origin_drafted.values()), sum(stats.origin_accepted.values())
    d = {"model": stats.drafted - lookup_d, **stats.origin_drafted, "forced": stats.forced}
    a = {"model": stats.accepted - lookup_a, **stats.origin_accepted,
         "forced": stats.forced_accepted}
    return d, a


def _family(name: str, kind: str, help_text: str,
            samples: Iterable[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        lines.append(f"{name}{_labels(labels)} {_num(value)}")
    return lines


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    quoted = (f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + ",".join(quoted) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)

