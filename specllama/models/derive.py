"""Derived drafts: the target requantized once into the user cache and reused.

The file is ``<cache>/derived/<stem>.<QUANT>.<hash>.gguf``; the hash covers the
target's path, size and mtime, so a changed target gets a new draft. Creation is
atomic (temp file + ``os.replace``) and serialized across processes with
``fcntl.flock`` on a ``.lock`` file beside it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..engine.llama.gguf import is_gguf
from ..errors import DraftDerivationError, SpecLlamaError
from ..paths import CACHE_ENV_VAR, cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: atomic replace still keeps the file whole
    fcntl = None  # type: ignore[assignment]

Progress = Callable[[str], None]

# errno values meaning "this directory cannot take the file"
_EDQUOT = getattr(errno, "EDQUOT", errno.ENOSPC)
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, _EDQUOT, errno.ENOTDIR}


def derived_path(target: str | os.PathLike[str], quant: str) -> Path:
    """Where the ``quant`` requantization of ``target`` lives (whether or not it exists yet).

    The name carries a short hash of the target's absolute path, size and mtime, so
    editing or replacing the target produces a different file.
    """
    target = Path(os.path.abspath(target))
    st = target.stat()
    key = f"{target}\0{st.st_size}\0{st.st_mtime_ns}\0{quant}".encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return cache_dir() / "derived" / f"{target.stem}.{quant}.{digest}.gguf"


def _unwritable(
    directory: Path, exc: OSError, *, cache: str = "draft cache",
    error: type[SpecLlamaError] = DraftDerivationError,
) -> SpecLlamaError:
    """The error for a cache directory that cannot take a file (``cache``: which one,
    in words; ``error``: the class to raise)."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, _EDQUOT):
        return error(
            f"no space left in the {cache} directory {directory}; free some space "
            f"or set {CACHE_ENV_VAR} to a directory on another disk"
        )
    return error(
        f"cannot write to the {cache} directory {directory} ({reason}); "
        f"set {CACHE_ENV_VAR} to a writable directory"
    )


@contextlib.contextmanager
def _locked(
    lock_path: Path, directory: Path, progress: Progress | None, *, doing: str = "deriving",
    cache: str = "draft cache", error: type[SpecLlamaError] = DraftDerivationError,
) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path`` (a no-op where fcntl is missing).

    ``doing`` names the work in the message heard while waiting for another process;
    ``cache`` and ``error`` shape the error when the lock file cannot be made."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _unwritable(directory, exc, cache=cache, error=error) from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress is not None:
                    progress(f"waiting for another specllama process {doing} {lock_path.stem}")
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _quantize(src: Path, dst: Path, quant: str, n_threads: int | None) -> None:
    # Imported here so that only deriving loads llama.cpp.
    from ..engine.llama import quantize

    quantize(src, dst, quant, n_threads)


def _remove_stale_parts(directory: Path, name: str) -> None:
    """Remove the temp files (``.NAME.*.part``) left in ``directory`` for ``name``. Call
    it under the file's lock: temp files are only written under it, so any left now
    belong to a process that was killed mid-way (SIGKILL, power loss)."""
    for stale in directory.glob(f".{glob.escape(name)}.*.part"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _quantize_checked(
    target: Path, tmp: Path, quant: str, n_threads: int | None, *, role: str
) -> None:
    """Quantize ``target`` into ``tmp`` (beside the derived file): a cache directory
    that cannot take the file, or a failure there for lack of room, says so."""
    directory = tmp.parent
    try:
        _quantize(target, tmp, quant, n_threads)
    except OSError as exc:
        if exc.errno in _UNWRITABLE:
            raise _unwritable(directory, exc) from None
        raise DraftDerivationError(
            f"deriving {quant} {role} from {target} failed: {exc}"
        ) from exc
    except DraftDerivationError as exc:
        free = shutil.disk_usage(directory).free
        if free < target.stat().st_size:
            raise DraftDerivationError(
                f"{exc}; the draft cache directory {directory} has only "
                f"{free // 2**20} MiB free: free some space or set {CACHE_ENV_VAR} "
                f"to a directory on another disk"
            ) from exc
        raise
    if not (tmp.is_file() and tmp.stat().st_size > 0 and is_gguf(tmp)):
        raise DraftDerivationError(
            f"quantizing {target} to {quant} produced no valid GGUF file"
        )


def derive(
    target: Path, quant: str, *, n_threads: int | None, progress: Progress | None,
    role: str = "draft",
) -> Path:
    """The ``quant`` requantization of ``target`` (the ``role`` it plays, in messages):
    made once into :func:`derived_path`, then reused (``progress`` hears of it)."""
    dst = derived_path(target, quant)
    if dst.is_file() and is_gguf(dst):
        return dst
    directory = dst.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(directory, exc) from None

    with _locked(dst.with_name(dst.name + ".lock"), directory, progress):
        if dst.is_file():
            if is_gguf(dst):
                return dst  # another process made it while we waited
            dst.unlink()  # not ours to keep: never a complete file (we write atomically)
        if fcntl is not None:
            _remove_stale_parts(directory, dst.name)
        if progress is not None:
            progress(f"deriving {quant} {role} from {target.name} (once; cached in {directory})")
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise _unwritable(directory, exc) from None
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            _quantize_checked(target, tmp, quant, n_threads, role=role)
            try:
                os.replace(tmp, dst)
            except OSError as exc:
                raise _unwritable(directory, exc) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return dst
