"""The persisted draft cache: earlier outputs (token ids) that lookup drafts may copy.

One file holds documents, each a 1-D array of token ids with the Unix time it was last
used, behind a header naming the tokenizer it was written for (`fingerprint`), so a
model with another vocabulary never reads ids that mean other text to it. Anything
wrong with the file's content is a one-line warning and an empty cache, never an error:
it is a cache, rebuilt by the next save.

Several processes may save to the same file: `save` takes an exclusive lock on a
sidecar file, re-reads what is there, merges it with its own documents and replaces the
file atomically, so concurrent savers lose nothing and readers never see half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"SPLCACHE"
VERSION = 1
# magic, format version, length of the fingerprint that follows (ASCII)
_HEADER = struct.Struct("<8sIH")


@dataclass(frozen=True)
class Stored:
    """Documents (int32 token ids) and, for each, when it was last used (Unix time)."""

    docs: tuple[np.ndarray, ...] = ()
    used: tuple[float, ...] = ()


class _Unusable(Exception):
    """Why a cache file cannot be read, as the warning says it."""


def fingerprint(piece: Callable[[int], bytes], n_vocab: int) -> str:
    """A short hash of the vocabulary: every token's bytes, each length-prefixed so that
    two vocabularies whose concatenations agree still differ."""
    h = hashlib.sha256(struct.pack("<q", n_vocab))
    for token in range(n_vocab):
        b = piece(token)
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    return h.hexdigest()[:16]


def load(path: Path, fingerprint: str) -> tuple[Stored, str | None]:
    """The stored documents, and a one-line warning when the file exists but cannot be
    used (unreadable, corrupt, another format or tokenizer); no file is no warning."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Stored(), None
    except OSError as e:
        return Stored(), _ignoring(path, f"unreadable ({e.strerror or e})")
    try:
        return _parse(data, fingerprint), None
    except _Unusable as e:
        return Stored(), _ignoring(path, str(e))


def save(path: Path, fingerprint: str, docs: Sequence[np.ndarray], used: Sequence[float],
         max_tokens: int) -> str | None:
    """Merge `docs` with what the file holds now and write the result (at most
    `max_tokens` tokens, the least recently used documents dropped first); a one-line
    warning when it cannot be written, else None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                on_disk = _parse(path.read_bytes(), fingerprint)
            except (OSError, _Unusable):  # none yet, or not ours: it is replaced
                on_disk = Stored()
            merged = _evict(_merge(on_disk, docs, used), max_tokens)
            _write(path, _encode(merged, fingerprint))
        finally:
            os.close(lock)  # releases the lock
    except OSError as e:
        return f"could not save the draft cache {path}: {e.strerror or e}"
    return None


def _ignoring(path: Path, why: str) -> str:
    return f"ignoring the draft cache {path}: {why}; it will be rebuilt"


def _parse(data: bytes, fingerprint: str) -> Stored:
    if len(data) < _HEADER.size:
        raise _Unusable("unreadable (truncated or corrupt)")
    magic, version, n_fp = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _Unusable("not a specllama draft cache")
    if version != VERSION:
        raise _Unusable(f"written in another format (version {version})")
    start = _HEADER.size + n_fp
    if data[_HEADER.size:start] != fingerprint.encode():
        raise _Unusable("written for another tokenizer")
    try:
        with np.load(io.BytesIO(data[start:]), allow_pickle=False) as z:
            tokens, lengths, used = z["tokens"], z["lengths"], z["used"]
        ok = (tokens.ndim == lengths.ndim == used.ndim == 1 and len(lengths) == len(used)
              and tokens.dtype == np.int32 and lengths.dtype.kind == "i"
              and used.dtype.kind == "f" and bool(np.all(lengths >= 0))
              and int(lengths.sum()) == len(tokens) and bool(np.all(tokens >= 0)))
    except Exception as e:  # a damaged zip fails in many ways (BadZipFile, KeyError, ...)
        raise _Unusable("unreadable (truncated or corrupt)") from e
    if not ok:
        raise _Unusable("unreadable (truncated or corrupt)")
    docs = np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return Stored(tuple(docs), tuple(float(u) for u in used))


def _merge(stored: Stored, docs: Sequence[np.ndarray], used: Sequence[float]
           ) -> dict[bytes, tuple[np.ndarray, float]]:
    """Documents by content (sha1 of their int32 bytes); a duplicate keeps its latest use."""
    out: dict[bytes, tuple[np.ndarray, float]] = {}
    for doc, u in zip((*stored.docs, *docs), (*stored.used, *used)):
        arr = np.ascontiguousarray(doc, dtype=np.int32).ravel()
        if len(arr) == 0:
            continue
        key = hashlib.sha1(arr.tobytes()).digest()
        if key in out:
            u = max(u, out[key][1])
        out[key] = (arr, float(u))
    return out


def _evict(docs: dict[bytes, tuple[np.ndarray, float]], max_tokens: int) -> Stored:
    """Oldest first, dropping the least recently used until `max_tokens` fit; a lone
    document that is still too long keeps its end."""
    order = sorted(docs.items(), key=lambda kv: (kv[1][1], kv[0]))
    total = sum(len(d) for _, (d, _) in order)
    while order and total > max_tokens and len(order) > 1:
        total -= len(order.pop(0)[1][0])
    if order and total > max_tokens:
        doc, u = order[0][1]
        order = [(order[0][0], (doc[len(doc) - max_tokens:], u))] if max_tokens > 0 else []
    return Stored(tuple(d for _, (d, _) in order), tuple(u for _, (_, u) in order))


def _encode(stored: Stored, fingerprint: str) -> bytes:
    fp = fingerprint.encode()
    buf = io.BytesIO()
    buf.write(_HEADER.pack(MAGIC, VERSION, len(fp)) + fp)
    tokens = np.concatenate(stored.docs) if stored.docs else np.empty(0, np.int32)
    np.savez(buf, tokens=tokens.astype(np.int32, copy=False),
             lengths=np.array([len(d) for d in stored.docs], np.int64),
             used=np.array(stored.used, np.float64))
    return buf.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Write to a private temporary file beside `path`, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
