"""Cost calibration: the curve, measuring without disturbing the model, the on-disk
cache (reused; invalidated by another file, thread count or machine) and the
online refinement."""

import json
import os
from pathlib import Path

import pytest

from specllama.engine.llama import Model
from specllama.policy import calibration as cal
from specllama.policy.calibration import (
    DRAFT_MAX_N,
    CostCurve,
    cache_path,
    calibrate,
    isotonic,
    measure_curve,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- the curve


def test_curve_interpolates_and_extrapolates():
    c = CostCurve.from_points({1: 1.0, 2: 2.0, 4: 3.0, 8: 5.0}, 10)
    assert c.seconds[:8] == (1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert c.t(10) == pytest.approx(6.0)  # slope of the last measured segment
    assert c.t(12) == pytest.approx(c.t(10) + 2 * (c.t(10) - c.t(9)))
    assert c.ratio(4) == 3.0
    assert c.t(0) == 0.0
    assert CostCurve.from_dict(c.to_dict()) == c


def test_curve_rejects_nonsense():
    with pytest.raises(ValueError):
        CostCurve(())
    with pytest.raises(ValueError):
        CostCurve((1.0, float("nan")))
    with pytest.raises(ValueError):
        CostCurve((0.0, 1.0))


def test_isotonic():
    assert isotonic([1, 2, 3], [1, 1, 1]) == [1, 2, 3]
    assert isotonic([1, 3, 2, 4], [1, 1, 1, 1]) == [1, 2.5, 2.5, 4]
    assert isotonic([5, 1], [3, 1]) == [4, 4]


# ----------------------------------------------------------------------------- measuring


@pytest.fixture(scope="module")
def model(tiny_target):
    m = Model(tiny_target, n_ctx=256, n_threads=1)
    yield m
    m.close()


def test_measure_leaves_the_model_as_it_was(model):
    model.clear()
    tokens = model.tokenize("the cat sat on the mat", add_bos=True)
    model.decode(tokens, "last")
    before = (list(model.cached), model.pos_max(), model.decode_s, model.decode_calls,
              model.tokens_evaluated)
    curve = measure_curve(model, 16, budget_s=0.05)
    after = (list(model.cached), model.pos_max(), model.decode_s, model.decode_calls,
             model.tokens_evaluated)
    assert after == before
    assert curve.max_n == 16 and all(s > 0 for s in curve.seconds)
    assert list(curve.seconds) == sorted(curve.seconds)  # monotone after smoothing
    assert 1 in curve.measured and 16 in curve.measured
    # the cache still works: decoding the next token continues the same sequence
    model.decode(model.tokenize(" and", add_bos=False), "last")
    assert model.pos_max() == len(model.cached) - 1
    assert model.cached[: len(tokens)] == tokens
    model.clear()


def test_a_draft_models_curve_times_batches_that_keep_the_last_row(model):
    """The draft model's curve reaches a catch-up's batch of 64 (last row only: what a
    catch-up computes), timed there, not extrapolated, and leaves the cache empty."""
    model.clear()
    curve = measure_curve(model, DRAFT_MAX_N, rows="last", budget_s=0.05)
    assert curve.max_n == 64 and {1, 2, 16, 64} <= set(curve.measured)
    assert list(curve.seconds) == sorted(curve.seconds)
    assert model.cached == []


def test_measure_on_an_empty_cache_leaves_it_empty(model):
    model.clear()
    measure_curve(model, 4, budget_s=0.02)
    assert model.cached == [] and model.pos_max() == -1


def test_measure_with_a_nearly_full_cache(tiny_target):
    m = Model(tiny_target, n_ctx=32, n_threads=1)
    m.decode([5] * 31, "none")
    curve = measure_curve(m, 16, budget_s=0.02)
    assert curve.max_n >= 1
    assert m.pos_max() + 1 == len(m.cached)  # consistent, whatever it had to give up
    m.close()


# ----------------------------------------------------------------------------- the cache


class FakeModel:
    """What calibrate() reads of a model; measuring is replaced by a counter."""

    def __init__(self, path: Path, n_threads: int = 2) -> None:
        self.path, self.n_threads, self.n_batch = path, n_threads, 512
        self.placement = "local CPU"


@pytest.fixture
def measured(monkeypatch):
    calls = []

    def fake(model, max_n, **kw):
        calls.append((model.path, model.n_threads, max_n))
        return CostCurve(tuple(0.01 * (1 + 0.5 * i) for i in range(max_n)), (1, max_n))

    monkeypatch.setattr(cal, "measure_curve", fake)
    return calls


@pytest.fixture
def gguf(tmp_path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 60)
    return p


def test_cache_is_reused(gguf, measured, tmp_path):
    first = calibrate(FakeModel(gguf), 16)
    assert not first.from_cache and first.path is not None
    assert first.path.parent == tmp_path / "cache" / "calibration"
    second = calibrate(FakeModel(gguf), 16)
    assert second.from_cache and second.curve == first.curve
    assert len(measured) == 1
    assert calibrate(FakeModel(gguf), 8).from_cache  # a shorter curve is in the longer one


def test_cache_invalidated_by_a_changed_file(gguf, measured):
    calibrate(FakeModel(gguf), 16)
    gguf.write_bytes(b"GGUF" + b"\1" * 80)  # new size
    assert not calibrate(FakeModel(gguf), 16).from_cache
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # same size, new mtime
    assert not calibrate(FakeModel(gguf), 16).from_cache
    assert calibrate(FakeModel(gguf), 16).from_cache
    assert len(measured) == 3


def test_cache_invalidated_by_thread_count(gguf, measured):
    calibrate(FakeModel(gguf, 2), 16)
    assert not calibrate(FakeModel(gguf, 1), 16).from_cache
    assert calibrate(FakeModel(gguf, 2), 16).from_cache
    assert calibrate(FakeModel(gguf, 1), 16).from_cache
    assert cache_path(gguf, 1) != cache_path(gguf, 2)
    assert len(measured) == 2


def test_a_draft_models_curve_is_kept_apart_from_a_targets(gguf, measured):
    """One file as target and draft (self-speculation): its two curves time different
    rows and lengths, so neither overwrites the other."""
    target = calibrate(FakeModel(gguf), 16)
    draft = calibrate(FakeModel(gguf), DRAFT_MAX_N, rows="last")
    assert not draft.from_cache and draft.path != target.path
    assert calibrate(FakeModel(gguf), 16).from_cache
    assert calibrate(FakeModel(gguf), DRAFT_MAX_N, rows="last").from_cache
    assert len(measured) == 2


def test_cache_invalidated_by_machine_and_longer_need(gguf, measured, monkeypatch):
    calibrate(FakeModel(gguf), 2)
    assert not calibrate(FakeModel(gguf), 16).from_cache  # needs more points than cached
    monkeypatch.setattr(cal, "machine_id", lambda: "another|machine|64|arm64")
    assert not calibrate(FakeModel(gguf), 16).from_cache
    assert len(measured) == 3


def test_cache_ignores_corrupt_files_and_unwritable_dirs(gguf, measured, tmp_path, monkeypatch):
    first = calibrate(FakeModel(gguf), 16)
    first.path.write_text("{not json")
    again = calibrate(FakeModel(gguf), 16)
    assert not again.from_cache
    data = json.loads(again.path.read_text())
    assert data["key"]["n_threads"] == 2 and data["key"]["size"] == gguf.stat().st_size
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache dir should be")
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(blocker / "cache"))
    res = calibrate(FakeModel(gguf), 16)
    assert res.path is None and res.curve.max_n == 16  # measured, just not kept


def test_a_disturbed_measurement_is_kept_until_a_better_one(gguf, monkeypatch):
    """A busy start measures (boundedly) again only while the cached curve was itself
    disturbed, and keeps the less disturbed of the two."""
    noises = iter([0.5, 0.3, 0.9, 0.01])
    calls = []

    def fake(model, max_n, **kw):
        calls.append(max_n)
        return CostCurve((0.01,) * max_n, (1,), noise=next(noises))

    monkeypatch.setattr(cal, "measure_curve", fake)
    first = calibrate(FakeModel(gguf), 4)
    assert not first.quiet and first.path is not None  # kept, marked as disturbed
    assert cal.cached(FakeModel(gguf), 4).curve.noise == 0.5
    second = calibrate(FakeModel(gguf), 4)  # measured again: better, so kept
    assert not second.from_cache and second.curve.noise == 0.3
    third = calibrate(FakeModel(gguf), 4)  # measured again: worse, so the cached one
    assert third.from_cache and third.curve.noise == 0.3 and third.measure_s >= 0
    quiet = calibrate(FakeModel(gguf), 4)  # quiet at last
    assert quiet.quiet and cal.cached(FakeModel(gguf), 4).quiet
    assert calibrate(FakeModel(gguf), 4).from_cache
    assert len(calls) == 4  # no measurement once a quiet curve is cached


def test_a_busy_machine_counts_as_disturbed(gguf, measured, monkeypatch):
    monkeypatch.setattr(cal.CpuMeter, "stop", lambda self: 0.6)  # what the meter reports
    res = calibrate(FakeModel(gguf), 16)
    assert res.busy == 0.6 and not res.quiet
    assert not calibrate(FakeModel(gguf), 16).from_cache and len(measured) == 2  # again


def test_measuring_stops_at_its_time_limit(tiny_target):
    m = Model(tiny_target, n_ctx=256, n_threads=1)
    curve = measure_curve(m, 16, limit_s=0.0)  # past the limit after the first decode
    # but not before T(2): from T(1) alone the curve would be flat, verifying 16 tokens
    # as cheap as one; the rest extrapolated along T(2) - T(1)
    assert curve.measured == (1, 2) and curve.max_n == 16
    slope = curve.t(2) - curve.t(1)
    assert curve.t(16) == pytest.approx(curve.t(2) + 14 * slope)
    full = measure_curve(m, 16, limit_s=60.0)
    assert full.measured == (1, 2, 3, 4, 5, 6, 8, 12, 16)
    m.close()


def test_real_model_calibration_roundtrip(tiny_target, monkeypatch):
    monkeypatch.setattr(cal, "NOISY", float("inf"))  # tiny models are all jitter
    monkeypatch.setattr(cal, "BUSY", 1.0)  # and CI machines are busy
    m = Model(tiny_target, n_ctx=128, n_threads=1)
    first = calibrate(m, 16, budget_s=0.05)
    second = calibrate(m, 16)
    assert second.from_cache and second.curve == first.curve
    m.close()


# ----------------------------------------------------------------------------- online
