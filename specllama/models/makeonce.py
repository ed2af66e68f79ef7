"""A file of the user cache made once and then reused: requantized and first-layer drafts,
models assembled from packages, synthetic models.

The file is written under a temporary name beside it and moved into place with
``os.replace``, so it is never seen half-written; an exclusive ``fcntl.flock`` on a
``.lock`` file beside it makes concurrent processes make it once (the others wait and
reuse it). Temporary files of a process killed mid-way are removed by the next maker.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..engine.llama.gguf import is_gguf
from ..errors import DraftDerivationError, SpecLlamaError
from ..paths import CACHE_ENV_VAR

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: atomic replace still keeps the file whole
    fcntl = None  # type: ignore[assignment]

Progress = Callable[[str], None]

# errno values meaning "this directory cannot take the file"
_EDQUOT = getattr(errno, "EDQUOT", errno.ENOSPC)
UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, _EDQUOT, errno.ENOTDIR}
NO_ROOM = {errno.ENOSPC, _EDQUOT}


@dataclass(frozen=True)
class CacheKind:
    """Which cache a file belongs to, for messages: its name in words, the error class
    raised for it, and what making a file of it is called ("deriving", "assembling")."""

    name: str = "draft cache"
    error: type[SpecLlamaError] = DraftDerivationError
    doing: str = "deriving"


DRAFT_CACHE = CacheKind()


def unwritable(directory: Path, exc: OSError, kind: CacheKind = DRAFT_CACHE) -> SpecLlamaError:
    """The error for a cache directory that cannot take a file."""
    reason = exc.strerror or str(exc)
    if exc.errno in NO_ROOM:
        return kind.error(
            f"no space left in the {kind.name} directory {directory}; free some space "
            f"or set {CACHE_ENV_VAR} to a directory on another disk"
        )
    return kind.error(
        f"cannot write to the {kind.name} directory {directory} ({reason}); "
        f"set {CACHE_ENV_VAR} to a writable directory"
    )


@contextlib.contextmanager
def _locked(lock_path: Path, kind: CacheKind, progress: Progress | None) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path`` (a no-op where fcntl is missing)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise unwritable(lock_path.parent, exc, kind) from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress is not None:
                    progress(f"waiting for another specllama process {kind.doing} "
                             f"{lock_path.stem}")
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _remove_stale_parts(directory: Path, name: str) -> None:
    """Remove the temp files (``.NAME.*.part``) left in ``directory`` for ``name``. Called
    under the file's lock: temp files are only written under it, so any left now belong
    to a process that was killed mid-way (SIGKILL, power loss)."""
    for stale in directory.glob(f".{glob.escape(name)}.*.part"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _fresh_name(directory: Path, dst: Path, kind: CacheKind) -> Path:
    """A temp name beside ``dst`` that no file has (a maker may refuse to overwrite one);
    taken under the lock, so no other process takes it meanwhile."""
    try:
        fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".part", dir=directory)
    except OSError as exc:
        raise unwritable(directory, exc, kind) from None
    os.close(fd)
    os.unlink(name)
    return Path(name)


def make_once(
    dst: Path, make: Callable[[Path], None], *, announce: str, invalid: str,
    progress: Progress | None, kind: CacheKind = DRAFT_CACHE,
) -> Path:
    """``dst``, made by ``make(tmp)`` unless a valid GGUF is already there.

    ``make`` writes a GGUF file at ``tmp``, a temp name beside ``dst`` (its own
    intermediate files go beside it as ``tmp.name + "..."``, so a killed run's are
    cleaned up too); ``progress`` hears ``announce`` when making starts; ``invalid`` is
    the error when ``make`` leaves no GGUF file. A directory that cannot take the file
    raises ``kind.error`` naming it and the variable that moves the cache.
    """
    if dst.is_file() and is_gguf(dst):
        return dst
    directory = dst.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(directory, exc, kind) from None
    with _locked(dst.with_name(dst.name + ".lock"), kind, progress):
        if dst.is_file():
            if is_gguf(dst):
                return dst  # another process made it while we waited
            dst.unlink()  # never a complete file of ours (we write atomically)
        if fcntl is not None:
            _remove_stale_parts(directory, dst.name)
        if progress is not None:
            progress(announce)
        tmp = _fresh_name(directory, dst, kind)
        try:
            try:
                make(tmp)
            except OSError as exc:
                if exc.errno in UNWRITABLE:
                    raise unwritable(directory, exc, kind) from None
                raise
            if not (tmp.is_file() and tmp.stat().st_size > 0 and is_gguf(tmp)):
                raise kind.error(invalid)
            try:
                os.replace(tmp, dst)
            except OSError as exc:
                raise unwritable(directory, exc, kind) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return dst
