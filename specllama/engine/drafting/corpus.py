"""A user's corpus (`--corpus`): text files whose token ids lookup drafts may copy.

Folders are walked recursively in sorted order (hidden entries skipped), and each
file's tokens are cached under the cache root, keyed by the tokenizer's fingerprint and
the sha256 of the file's bytes: a corpus that did not change is never tokenized again,
and a file that did is. The cache of every corpus and tokenizer together stays under
CACHE_BYTES, the entries least recently used deleted first. Files that cannot be used
(binary, not UTF-8, too large, unreadable, missing) are skipped with a one-line warning
for the caller to show.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Larger files are skipped: a corpus is text a user wrote or collected, not a dump.
MAX_FILE_BYTES = 8 * 1024 * 1024
#: A NUL byte this early means a binary file.
_SNIFF = 8192
#: The token cache's bound (64 M tokens); a run never deletes an entry it used.
CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    tokens: np.ndarray  # int32 token ids


def read_corpus(paths: Sequence[Path], tokenize: Callable[[str], list[int]],
                fingerprint: str, cache_root: Path) -> tuple[list[CorpusFile], list[str]]:
    """The tokenized text files under `paths` (files or folders), and a warning for
    each one skipped."""
    files: list[CorpusFile] = []
    warnings: list[str] = []
    cache = cache_root / "corpus" / _safe_name(fingerprint)
    seen: set[Path] = set()
    used: set[Path] = set()
    for path in _walk(paths, warnings):
        real = path.resolve()
        if real in seen:  # named twice, or reached again through a link
            continue
        seen.add(real)
        data, warning = _read(path)
        if warning:
            warnings.append(warning)
        if not data:
            continue
        entry = cache / f"{hashlib.sha256(data).hexdigest()}.npy"
        used.add(entry)
        tokens = _tokens(data, tokenize, entry)
        if len(tokens):
            files.append(CorpusFile(path, tokens))
    _prune(cache_root / "corpus", used, CACHE_BYTES)
    return files, warnings


def _walk(paths: Sequence[Path], warnings: list[str]) -> Iterator[Path]:
    """Regular files: each path given, and those under each folder given."""
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            warnings.append(f"skipping {path}: no such file or directory")
            continue
        except OSError as e:
            warnings.append(f"skipping {path}: unreadable ({e.strerror or e})")
            continue
        if stat.S_ISDIR(st.st_mode):
            yield from _walk_dir(path, {(st.st_dev, st.st_ino)}, warnings)
        elif stat.S_ISREG(st.st_mode):
            yield path
        else:
            warnings.append(f"skipping {path}: not a regular file")


def _walk_dir(folder: Path, above: set[tuple[int, int]], warnings: list[str]
              ) -> Iterator[Path]:
    """Sorted, depth first; `above` holds the folders on the way here (a link back to
    one of them would loop)."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        warnings.append(f"skipping {folder}: unreadable ({e.strerror or e})")
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            st = entry.stat()  # follows links; a dangling one fails
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key not in above:
                yield from _walk_dir(Path(entry.path), above | {key}, warnings)
        elif stat.S_ISREG(st.st_mode):
            yield Path(entry.path)


def _read(path: Path) -> tuple[bytes, str | None]:
    """The file's bytes if they are UTF-8 text (b"" if not, with the reason why)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        return b"", f"skipping {path}: unreadable ({e.strerror or e})"
    if len(data) > MAX_FILE_BYTES:
        return b"", f"skipping {path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB"
    try:
        if b"\0" in data[:_SNIFF]:
            raise UnicodeError
        data.decode("utf-8")
    except UnicodeError:
        return b"", f"skipping {path}: not UTF-8 text"
    return data, None


def _tokens(data: bytes, tokenize: Callable[[str], list[int]], entry: Path) -> np.ndarray:
    """The file's token ids: from the cache entry if tokenized before, else tokenized
    and cached (a cache that cannot be read or written only costs the tokenization)."""
    cache = entry.parent
    try:
        cached = np.load(entry, allow_pickle=False)
        if (isinstance(cached, np.ndarray) and cached.ndim == 1
                and cached.dtype == np.int32 and bool(np.all(cached >= 0))):
            os.utime(entry)  # used now: the last to be pruned
            return cached
    except Exception:  # missing, or damaged in any of many ways: tokenize again
        pass
    tokens = np.asarray(tokenize(data.decode("utf-8")), dtype=np.int32).ravel()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=".", suffix=".npy.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, tokens, allow_pickle=False)
            os.replace(tmp, entry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
    return tokens


def _prune(root: Path, keep: set[Path], limit: int) -> None:
    """Delete the least recently used entries of every tokenizer's cache until they
    hold at most `limit` bytes, never one in `keep`."""
    entries = []
    for entry in root.glob("*/*.npy"):
        try:
            info = entry.stat()
        except OSError:
            continue
        entries.append((info.st_mtime, info.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= limit:
            return
        if entry not in keep:
            entry.unlink(missing_ok=True)
            total -= size


def _safe_name(fingerprint: str) -> str:
    """The fingerprint as a folder name (a hash of it if it is not a plain word)."""
    if re.fullmatch(r"[0-9A-Za-z_-]{1,64}", fingerprint):
        return fingerprint
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
