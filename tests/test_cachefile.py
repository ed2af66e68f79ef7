"""The persisted draft cache file: round trips, damage, eviction, concurrent savers."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specllama.engine.drafting.cachefile import Stored, fingerprint, load, save

FP = "0123456789abcdef"


def doc(*ids: int) -> np.ndarray:
    return np.array(ids, np.int32)


def as_lists(stored: Stored) -> list[list[int]]:
    return [d.tolist() for d in stored.docs]


def test_fingerprint_depends_on_every_piece_and_their_boundaries() -> None:
    a = fingerprint(lambda t: [b"ab", b"c"][t], 2)
    assert len(a) == 16 and int(a, 16) >= 0
    assert a == fingerprint(lambda t: [b"ab", b"c"][t], 2)
    assert a != fingerprint(lambda t: [b"a", b"bc"][t], 2)  # same concatenation
    assert a != fingerprint(lambda t: [b"ab", b"d"][t], 2)
    assert a != fingerprint(lambda t: [b"ab", b"c", b""][t], 3)


def test_round_trip_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "cache.bin"  # parents are created
    assert save(path, FP, [doc(1, 2, 3), doc(4, 5)], [10.0, 20.0], 100) is None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.with_name("cache.bin.lock")).st_mode) == 0o600
    stored, warning = load(path, FP)
    assert warning is None
    assert as_lists(stored) == [[1, 2, 3], [4, 5]]
    assert stored.used == (10.0, 20.0)
    assert all(d.dtype == np.int32 for d in stored.docs)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_empty_cache_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    assert save(path, FP, [], [], 100) is None
    assert load(path, FP) == (Stored(), None)


def test_missing_file_is_empty_without_a_warning(tmp_path: Path) -> None:
    assert load(tmp_path / "nope.bin", FP) == (Stored(), None)


def test_another_tokenizer_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    save(path, FP, [doc(1, 2, 3)], [1.0], 100)
    stored, warning = load(path, "fedcba9876543210")
    assert stored == Stored()
    assert warning == (f"ignoring the draft cache {path}: written for another tokenizer; "
                       "it will be rebuilt")
    # saving for the other tokenizer replaces the foreign content
    assert save(path, "fedcba9876543210", [doc(7)], [2.0], 100) is None
    assert as_lists(load(path, "fedcba9876543210")[0]) == [[7]]


@pytest.mark.parametrize("damage", ["half", "garbage", "empty", "tail", "other"])
def test_damaged_file_is_ignored_with_one_line(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "cache.bin"
    save(path, FP, [doc(*range(500)), doc(4, 5)], [1.0, 2.0], 10_000)
    data = path.read_bytes()
    damaged = {
        "half": data[: len(data) // 2],
        "garbage": np.random.default_rng(0).bytes(len(data)),
        "empty": b"",
        "tail": data[:-7],
        "other": b"PK\x03\x04" + data,
    }[damage]
    path.write_bytes(damaged)
    stored, warning = load(path, FP)
    assert stored == Stored()
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"ignoring the draft cache {path}: ")
    # the next save rebuilds it
    assert save(path, FP, [doc(9)], [3.0], 100) is None
    stored, warning = load(path, FP)
    assert warning is None and as_lists(stored) == [[9]] and stored.used == (3.0,)


def test_wrong_version_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    save(path, FP, [doc(1)], [1.0], 100)
    data = bytearray(path.read_bytes())
    data[8] += 1  # the version field follows the magic
    path.write_bytes(bytes(data))
    stored, warning = load(path, FP)
    assert stored == Stored() and warning is not None and "format" in warning


def test_unreadable_path_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "cache.bin").mkdir()  # a folder where the file should be
    stored, warning = load(tmp_path / "cache.bin", FP)
    assert stored == Stored() and warning is not None and "unreadable" in warning


def test_eviction_drops_least_recently_used(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    docs = [doc(1, 1, 1), doc(2, 2, 2), doc(3, 3, 3), doc(4, 4, 4)]
    used = [40.0, 10.0, 30.0, 20.0]
    assert save(path, FP, docs, used, 7) is None
    stored, _ = load(path, FP)
    assert as_lists(stored) == [[3, 3, 3], [1, 1, 1]]  # oldest first
    assert stored.used == (30.0, 40.0)


def test_a_document_longer_than_the_cap_keeps_its_end(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    assert save(path, FP, [doc(*range(10)), doc(1, 2)], [5.0, 1.0], 4) is None
    assert as_lists(load(path, FP)[0]) == [[6, 7, 8, 9]]


def test_merge_dedupes_by_content_keeping_the_latest_use(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    save(path, FP, [doc(1, 2), doc(3, 4)], [50.0, 5.0], 100)
    save(path, FP, [doc(1, 2), doc(3, 4), doc(5), doc(5)], [7.0, 60.0, 1.0, 2.0], 100)
    stored, _ = load(path, FP)
    assert sorted(zip(map(tuple, as_lists(stored)), stored.used)) == [
        ((1, 2), 50.0), ((3, 4), 60.0), ((5,), 2.0)]


def test_saving_where_it_cannot_be_written_is_a_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    warning = save(blocker / "cache.bin", FP, [doc(1)], [1.0], 100)
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"could not save the draft cache {blocker / 'cache.bin'}: ")


def _saver(path: str, first: int, start: Any) -> None:
    start.wait()  # both save at once, not one after the other's startup
    for i in range(20):
        ids = [first + i] * (i + 1)
        warning = save(Path(path), FP, [np.array(ids, np.int32)], [float(first + i)], 10_000)
        assert warning is None


def test_concurrent_savers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_saver, args=(str(path), first, start))
             for first in (1000, 2000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    stored, warning = load(path, FP)
    assert warning is None
    expected = {(first + i,) * (i + 1) for first in (1000, 2000) for i in range(20)}
    assert set(map(tuple, as_lists(stored))) == expected
    assert len(stored.docs) == 40
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_permission_errors_are_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a read-only folder or a file of another user gives, also when tests run as root."""
    path = tmp_path / "cache.bin"
    save(path, FP, [doc(1)], [1.0], 100)

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert load(path, FP) == (
        Stored(), f"ignoring the draft cache {path}: unreadable (Permission denied); "
        "it will be rebuilt")
    monkeypatch.setattr(os, "open", denied)
    assert save(path, FP, [doc(2)], [2.0], 100) == (
        f"could not save the draft cache {path}: Permission denied")
