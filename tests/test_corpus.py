"""Reading a user's corpus: the walk, what is skipped and why, the tokenization cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from specllama.engine.drafting import corpus
from specllama.engine.drafting.corpus import CorpusFile, read_corpus

FP = "0123456789abcdef"


class Tokenize:
    """A stand-in tokenizer that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str) -> list[int]:
        self.calls.append(text)
        return [ord(c) % 50 for c in text]


def ids(text: str) -> list[int]:
    return [ord(c) % 50 for c in text]


def names(files: list[CorpusFile], root: Path) -> list[str]:
    return [str(f.path.relative_to(root)) for f in files]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "b" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "c.md").write_text("gamma")
    (root / "b" / "z.py").write_text("zeta")
    (root / "b" / "deep" / "d.txt").write_text("delta")
    (root / ".hidden.txt").write_text("hidden")
    (root / ".git" / "config").write_text("secret")
    (root / "b" / "empty.txt").write_text("")
    return root


def test_folders_are_walked_in_sorted_order_without_hidden_entries(
        tree: Path, tmp_path: Path) -> None:
    files, warnings = read_corpus([tree], Tokenize(), FP, tmp_path / "cache")
    assert warnings == []
    assert names(files, tree) == ["a.txt", "b/deep/d.txt", "b/z.py", "c.md"]
    assert [f.tokens.tolist() for f in files] == [
        ids("alpha"), ids("delta"), ids("zeta"), ids("gamma")]
    assert all(f.tokens.dtype == np.int32 for f in files)


def test_files_and_folders_may_be_mixed_and_repeated(tree: Path, tmp_path: Path) -> None:
    files, warnings = read_corpus(
        [tree / "c.md", tree / "b", tree / "c.md", tree / ".hidden.txt"], Tokenize(), FP,
        tmp_path / "cache")
    assert warnings == []
    # a hidden file named explicitly is read; a file named twice is read once
    assert names(files, tree) == ["c.md", "b/deep/d.txt", "b/z.py", ".hidden.txt"]


def test_symlink_loops_are_not_followed(tree: Path, tmp_path: Path) -> None:
    os.symlink(tree, tree / "b" / "loop")
    os.symlink(tree / "a.txt", tree / "b" / "link.txt")
    os.symlink(tree / "missing", tree / "b" / "dangling.txt")
    files, warnings = read_corpus([tree], Tokenize(), FP, tmp_path / "cache")
    assert warnings == []
    # b/link.txt is a.txt again (read once, as first reached)
    assert names(files, tree) == ["a.txt", "b/deep/d.txt", "b/z.py", "c.md"]


def test_binary_and_invalid_utf8_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "bin.dat").write_bytes(b"text\0more text")
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "ok.txt").write_text("café ok", encoding="utf-8")
    files, warnings = read_corpus([root], Tokenize(), FP, tmp_path / "cache")
    assert names(files, root) == ["ok.txt"]
    assert warnings == [f"skipping {root / 'bin.dat'}: not UTF-8 text",
                        f"skipping {root / 'latin1.txt'}: not UTF-8 text"]


def test_missing_path_is_a_warning(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    files, warnings = read_corpus([missing], Tokenize(), FP, tmp_path / "cache")
    assert files == []
    assert warnings == [f"skipping {missing}: no such file or directory"]


def test_large_files_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "MAX_FILE_BYTES", 10)
    (tmp_path / "big.txt").write_text("x" * 11)
    (tmp_path / "fits.txt").write_text("x" * 10)
    files, warnings = read_corpus(
        [tmp_path / "big.txt", tmp_path / "fits.txt"], Tokenize(), FP, tmp_path / "cache")
    assert names(files, tmp_path) == ["fits.txt"]
    assert len(warnings) == 1 and warnings[0].startswith(f"skipping {tmp_path / 'big.txt'}: ")


def test_tokenization_is_cached(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = Tokenize()
    files, _ = read_corpus([tree], first, FP, cache)
    assert len(first.calls) == 4
    assert len(list((cache / "corpus" / FP).glob("*.npy"))) == 4

    again = Tokenize()
    cached, _ = read_corpus([tree], again, FP, cache)
    assert again.calls == []
    assert [f.tokens.tolist() for f in cached] == [f.tokens.tolist() for f in files]

    # another tokenizer does not read this one's cache
    other = Tokenize()
    read_corpus([tree], other, "fedcba9876543210", cache)
    assert len(other.calls) == 4


def test_a_changed_file_is_tokenized_again(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    read_corpus([tree], Tokenize(), FP, cache)
    (tree / "c.md").write_text("gamma, revised")
    tokenize = Tokenize()
    files, _ = read_corpus([tree], tokenize, FP, cache)
    assert tokenize.calls == ["gamma, revised"]
    assert files[-1].tokens.tolist() == ids("gamma, revised")


@pytest.mark.parametrize("damage", [b"", b"garbage", b"\x93NUMPY"])
def test_a_corrupt_cache_entry_is_rewritten(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    cache = tmp_path / "cache"
    read_corpus([tmp_path / "a.txt"], Tokenize(), FP, cache)
    (entry,) = (cache / "corpus" / FP).glob("*.npy")
    entry.write_bytes(damage)
    tokenize = Tokenize()
    files, warnings = read_corpus([tmp_path / "a.txt"], tokenize, FP, cache)
    assert warnings == [] and tokenize.calls == ["alpha"]
    assert files[0].tokens.tolist() == ids("alpha")
    assert np.load(entry).tolist() == ids("alpha")  # rewritten


def test_an_unwritable_cache_only_costs_the_tokenization(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder would be")
    for _ in range(2):
        tokenize = Tokenize()
        files, warnings = read_corpus([tmp_path / "a.txt"], tokenize, FP, blocker)
        assert warnings == [] and tokenize.calls == ["alpha"]
        assert files[0].tokens.tolist() == ids("alpha")


def test_permission_errors_are_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an unreadable file gives, also when tests run as root."""
    f = tmp_path / "secret.txt"
    f.write_text("x")

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(corpus, "open", denied, raising=False)
    files, warnings = read_corpus([f], Tokenize(), FP, tmp_path / "cache")
    assert files == [] and warnings == [f"skipping {f}: unreadable (Permission denied)"]


def test_the_cache_is_bounded_least_recently_used_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over CACHE_BYTES (every tokenizer's entries together) the entries used longest
    ago go first, never one the current read uses; an entry read again is used now."""
    cache = tmp_path / "cache"
    docs = {name: tmp_path / f"{name}.txt" for name in ("old", "kept", "new")}
    for name, path in docs.items():
        path.write_text(f"{name} " * 20)
    read_corpus([docs["old"]], Tokenize(), FP, cache)
    read_corpus([docs["kept"]], Tokenize(), FP, cache)
    old, kept = sorted(cache.glob("corpus/*/*.npy"), key=lambda p: p.stat().st_mtime)
    monkeypatch.setattr(corpus, "CACHE_BYTES", old.stat().st_size + kept.stat().st_size)
    long_ago = time.time() - 100
    os.utime(old, (long_ago, long_ago))
    os.utime(kept, (long_ago + 1, long_ago + 1))
    read_corpus([docs["old"]], Tokenize(), FP, cache)  # a hit: "old" is the newest now
    read_corpus([docs["new"]], Tokenize(), "fedcba9876543210", cache)  # over the bound
    assert old.exists() and not kept.exists()
    tokenize = Tokenize()
    read_corpus([docs["old"], docs["kept"]], tokenize, FP, cache)
    assert tokenize.calls == [docs["kept"].read_text()]
