"""What a decode costs on this machine: measured once, cached.

The cost-aware draft-length policy (`auto`, docs/architecture.md) needs T(n),
the wall time of ONE llama_decode of n tokens, for the target with the logits of
every row (n = 1..16: verifying k drafts is a decode of k+1 tokens), and for the
draft model with the last row's alone (T(1): one draft step; T(n+1) - T(1): its
catch-up on n tokens it missed, up to a whole prompt). `calibrate(model)` measures
that in about a second for a small model and caches it on disk, keyed by the model
file (path, size, mtime), the thread count, the rows, the machine and the llama.cpp
version, so a changed file, another `--threads` or another machine measures
anew; `--recalibrate` measures again on request. A measurement taken while other
processes loaded the CPU is cached marked as disturbed: the next run measures again
and keeps the less disturbed of the two.

Measuring never disturbs the caller: the timed tokens go after whatever the KV
cache holds and are cut off again, and the model's counters are restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..engine.llama import LLAMA_CPP_VERSION, Model
from ..paths import cache_dir
from .costcurve import CostCurve, isotonic
from .cpumeter import CpuMeter

#: Bump when what is measured (or how) changes: old cache files are then ignored.
CALIBRATION_VERSION = 4  # 4: a slow model's curve has T(2), not T(1) alone
Rows = Literal["all", "last"]  # the rows whose logits a timed decode computes
TARGET_MAX_N = 16  # verify passes of up to 16 tokens (15 drafts)
#: A draft step is 1 token (2 after a fully accepted round), a catch-up one batch of all the tokens
#: missed: a batch of 64 costs a token far less than a batch's second token (the F32 pair's draft:
#: docs/lab/2026-12-suffix-cache.md, "The catch-up priced by timed batches"); beyond, extrapolated.
DRAFT_MAX_N = 64
#: Batch sizes timed; the others are interpolated.
MEASURE_POINTS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 64)
DEFAULT_BUDGET_S = 0.8  # stop repeating passes after this much measuring (>= 1 pass)
#: Hard limit of one model's measurement, warm-up included: on a busy machine a batch
#: of 16 can take a second, and the user is waiting for the first token.
LIMIT_S = 2.0
MIN_PASSES, MAX_PASSES = 3, 9
NOISY = 0.15  # T(1) samples this scattered (relative MAD): measured on a busy machine
BUSY = 0.10  # other processes used this share of the CPU while measuring: not kept
WARMUP_TEXT = (
    "The committee reviewed the proposal in detail, asked for two changes to the budget, "
    "and agreed to meet again next week. def add(a, b):\n    return a + b\n"
)


def _filler_tokens(model: Model, n: int) -> list[int]:
    toks = model.tokenize(WARMUP_TEXT, add_bos=False, special=False) or [model.eos, model.bos]
    toks = [t for t in toks if t >= 0] or [0]
    return [toks[i % len(toks)] for i in range(n)]


@contextlib.contextmanager
def _preserved(model: Model):
    """Restore the model's KV cache length and its counters afterwards."""
    base = len(model.cached)
    saved = (model.decode_s, model.decode_calls, model.tokens_evaluated)
    try:
        yield base
    finally:
        model.truncate(base)
        model.decode_s, model.decode_calls, model.tokens_evaluated = saved


def measure_curve(
    model: Model,
    max_n: int = TARGET_MAX_N,
    *,
    rows: Rows = "all",
    budget_s: float = DEFAULT_BUDGET_S,
    min_passes: int = MIN_PASSES,
    max_passes: int = MAX_PASSES,
    limit_s: float = LIMIT_S,
) -> CostCurve:
    """Time one decode of n tokens (logits of every row, or of the last: `rows`) for
    the points in MEASURE_POINTS up to max_n, in interleaved passes; medians per point.

    Passes repeat up to `min_passes` and then while the next one fits in `budget_s`
    (a slow model gets fewer passes); after `limit_s` (warm-up included) it stops
    where it is, but not before T(2): batch sizes not timed yet are interpolated from
    those that were, beyond the last along its slope."""
    max_n = max(1, min(max_n, model.n_batch))
    with _preserved(model) as base:
        context = 16 if base == 0 else 0  # time the decode at a realistic small position
        room = model.n_ctx - base - context
        if room < 2:  # a full cache: measure on an empty one (then the caller's is gone)
            model.clear()
            base, context, room = 0, 16, model.n_ctx - 16
        max_n = max(1, min(max_n, room - 1))
        points = sorted({n for n in MEASURE_POINTS if n <= max_n} | {max_n})
        tokens = _filler_tokens(model, context + max_n)
        if context:
            model.decode(tokens[:context], "none")
        model.checkpoint()  # cut back to here by copy, not re-decoding (rewind.py)
        start = base + context
        probe = tokens[context:]

        def timed(n: int) -> float:
            t0 = time.perf_counter()
            model.decode(probe[:n], rows if n > 1 else "last")
            dt = time.perf_counter() - t0
            model.truncate(start)
            return dt

        # A remote target's first decode of each batch size pays extra round trips
        # (Model.warm_batch_sizes): without this, a slow link made every T(k)/T(1) look the same
        # (docs/lab/2026-12-rpc.md), the points' few samples each holding one such first decode.
        model.warm_batch_sizes(points)
        t_begin = time.perf_counter()
        timed(max_n)  # warm up: first touch of the weights, compute buffers
        timed(1)
        samples = _passes(timed, points, t_begin, budget_s=budget_s, min_passes=min_passes,
                          max_passes=max_passes, limit_s=limit_s)
    return _curve(samples, max_n)


def _passes(
    timed: Callable[[int], float], points: list[int], t_begin: float, *, budget_s: float,
    min_passes: int, max_passes: int, limit_s: float,
) -> dict[int, list[float]]:
    """The samples of `timed(n)` per point, in interleaved passes until `max_passes`,
    the budget or the limit (both counted from `t_begin`) end them (see `measure_curve`)."""

    def over() -> bool:
        return time.perf_counter() - t_begin > limit_s

    samples: dict[int, list[float]] = {n: [] for n in points}
    passes = 0
    while passes < max_passes:
        order = points if passes % 2 == 0 else points[::-1]
        t_pass = time.perf_counter()
        for n in order:
            samples[n].append(timed(n))
            # A slow (or busy) machine: what we have beats making the user wait, once the
            # curve has a slope. From T(1) alone it is flat, verifying 8 tokens as cheap as
            # one: an 8B on 2 cores (T(16) alone past the limit) drafted at 0.67x its target.
            if over() and sum(1 for v in samples.values() if v) >= 2:
                break
        samples[1].append(timed(1))  # the normalizer gets twice the samples
        passes += 1
        now = time.perf_counter()
        if over():
            break
        if passes >= min_passes and (now - t_begin) + (now - t_pass) > budget_s:
            break
    return samples


def _curve(samples: dict[int, list[float]], max_n: int) -> CostCurve:
    """The curve of the medians per point, made non-decreasing; its noise is the
    relative MAD of the T(1) samples."""
    medians = {n: max(statistics.median(v), 1e-7) for n, v in samples.items() if v}
    ns = sorted(medians)
    smooth = dict(zip(ns, isotonic([medians[n] for n in ns], [len(samples[n]) for n in ns])))
    ones = samples[1]
    med1 = statistics.median(ones)
    spread = statistics.median(abs(x - med1) for x in ones) / med1 if med1 > 0 else 0.0
    return CostCurve.from_points(smooth, max_n, noise=spread)


# ----------------------------------------------------------------------------- the cache


def cache_root() -> Path:
    return cache_dir() / "calibration"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_id() -> str:
    """Host name, CPU model and core count: a new machine measures anew."""
    return f"{platform.node()}|{cpu_model()}|{os.cpu_count()}|{platform.machine()}"


def cache_key(
    model_path: str | os.PathLike[str], n_threads: int, placement: str = "local CPU",
    rows: Rows = "all",
) -> dict[str, Any]:
    """What a cached calibration is valid for (a remote target: on those servers; a
    draft model's: decodes that keep the last row)."""
    path = Path(model_path).resolve()
    st = path.stat()
    return {
        "version": CALIBRATION_VERSION,
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "n_threads": int(n_threads),
        "machine": machine_id(),
        "llama_cpp": LLAMA_CPP_VERSION,
        **({"placement": placement} if placement != "local CPU" else {}),
        **({"rows": rows} if rows != "all" else {}),
    }


def cache_path(
    model_path: str | os.PathLike[str], n_threads: int, placement: str = "local CPU",
    rows: Rows = "all",
) -> Path:
    """One file per (model path, threads, machine, rows); its content says for which
    size/mtime it holds, so a changed model file overwrites it."""
    path = Path(model_path).resolve()
    ident = json.dumps([str(path), int(n_threads), machine_id()]
                       + ([placement] if placement != "local CPU" else [])
                       + ([rows] if rows != "all" else []))
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_root() / f"{path.stem}.t{int(n_threads)}.{digest}.json"


@dataclass(frozen=True)
class Calibration:
    curve: CostCurve
    key: dict[str, Any] = field(default_factory=dict)
    from_cache: bool = False  # the curve is the cached one (measured on an earlier load)
    measure_s: float = 0.0  # seconds spent measuring now (0 when not measured)
    path: Path | None = None  # the cache file holding the curve (None: not kept)
    busy: float | None = None  # share of the CPU other processes used while measuring
    quiet: bool = True  # measured on a quiet machine (a disturbed curve is re-measured)

    def to_dict(self) -> dict[str, Any]:
        return {"curve": self.curve.to_dict(), "key": self.key, "from_cache": self.from_cache,
                "measure_s": self.measure_s, "path": str(self.path) if self.path else None,
                "busy": self.busy, "quiet": self.quiet}

    @property
    def disturbance(self) -> float:
        """How far from quiet the measurement was: lower is better."""
        return (self.busy or 0.0) + self.curve.noise


def _read(path: Path, key: dict[str, Any], max_n: int) -> Calibration | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        curve = CostCurve.from_dict(data["curve"])
        busy = data.get("busy")
        calibration = Calibration(curve, key, True, 0.0, path,
                                  None if busy is None else float(busy), bool(data["quiet"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return calibration if curve.max_n >= max_n else None


def _write(path: Path, key: dict[str, Any], calibration: Calibration) -> bool:
    """Atomic write; False (silently) where the cache dir is not writable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = {"key": key, "curve": calibration.curve.to_dict(), "created": time.time(),
            "busy": calibration.busy, "quiet": calibration.quiet}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def cached(model: Model, max_n: int = TARGET_MAX_N, rows: Rows = "all") -> Calibration | None:
    """The cached calibration of `model`, if one is valid (quiet or not)."""
    max_n = max(1, min(max_n, model.n_batch))
    return _read(cache_path(model.path, model.n_threads, model.placement, rows),
                 cache_key(model.path, model.n_threads, model.placement, rows), max_n)


def calibrate(
    model: Model,
    max_n: int = TARGET_MAX_N,
    *,
    use_cache: bool = True,
    rows: Rows = "all",
    budget_s: float = DEFAULT_BUDGET_S,
) -> Calibration:
    """The cost curve of `model` up to max_n tokens: the cached one when it is valid
    and was measured on a quiet machine (and use_cache); else measured now (in at
    most LIMIT_S), and the less disturbed of the new and the cached curve is kept."""
    max_n = max(1, min(max_n, model.n_batch))
    key = cache_key(model.path, model.n_threads, model.placement, rows)
    path = cache_path(model.path, model.n_threads, model.placement, rows)
    before = _read(path, key, max_n) if use_cache else None
    if before is not None and before.quiet:
        return before
    meter = CpuMeter()
    meter.start()
    t0 = time.perf_counter()
    curve = measure_curve(model, max_n, rows=rows, budget_s=budget_s)
    spent = time.perf_counter() - t0
    busy = meter.stop()
    quiet = curve.noise <= NOISY and (busy is None or busy <= BUSY)
    now = Calibration(curve, key, False, spent, None, busy, quiet)
    if before is not None and before.disturbance < now.disturbance:
        return dataclasses.replace(before, measure_s=spent)
    written = curve.max_n >= max_n and _write(path, key, now)
    return dataclasses.replace(now, path=path if written else None)
