"""``hf`` sources: a file (or the first match of a glob) of a Hugging Face repository.

Taken from the standard Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
else ``~/.cache/huggingface/hub``), else downloaded into it with
``huggingface_hub.hf_hub_download`` (its own progress bar on stderr). A split GGUF
resolves to its first part, all parts fetched into one snapshot directory. Offline, a
model not cached is a :class:`ModelLoadError` naming the command that fetches it
(``specllama pull NAME``, else ``hf download ...``).

The cache is read directly (``models--OWNER--REPO/refs/<rev>`` holding a commit hash,
``snapshots/<commit>/<file>``: huggingface_hub's documented layout), so a cached model
needs neither the network nor ``huggingface_hub``, imported only to download.
"""
from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..engine.llama.gguf import check_gguf_file
from ..errors import ModelLoadError
from .schema import HF_DEFAULT_REVISION, ModelSource

HUB_INSTALL_HINT = "pip install 'huggingface-hub>=0.20'"
Progress = Callable[[str], None]

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
class HfCached:
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


def hf_lookup(source: ModelSource, cache: Path) -> HfCached:
    """Look ``source`` up in the Hugging Face cache ``cache`` (no network, no import)."""
    assert source.kind == "hf" and source.repo and source.file and source.revision
    snapshot = _hf_snapshot(cache, source.repo, source.revision)
    if source.is_glob:
        cached = _snapshot_files(snapshot) if snapshot is not None else []
        matches = [name for name in cached if fnmatch.fnmatchcase(name, source.file)]
        if not matches:
            return HfCached(snapshot, None, [])
        needed = _pick(matches)
    else:
        needed = _parts(source.file)
    missing = [n for n in needed if snapshot is None or not (snapshot / n).is_file()]
    return HfCached(snapshot, needed, missing)


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


def _not_cached(source: ModelSource, cached: HfCached, cache: Path) -> str:
    """'<what is missing> is not in the Hugging Face cache (<dir>)' (no leading 'what: ')."""
    where = f"the Hugging Face cache ({_home_short(cache)})"
    if cached.needed is None:
        return f'no file matching "{source.file}" from {source.repo} is in {where}'
    if len(cached.missing) == 1:
        return f"{source.repo}/{cached.missing[0]} is not in {where}"
    return (f"{len(cached.missing)} files of {source.repo} ({', '.join(cached.missing)}) "
            f"are not in {where}")


def _fetch_advice(source: ModelSource, cached: HfCached, fetch: str | None) -> str:
    """'run: FETCH', else 'run: hf download ...' (and the repo's files, for a glob)."""
    if fetch is not None:
        return f"run: {fetch}"
    if cached.needed is None:
        return f"run: {_download_command(source, None)} (list the repo's files at " \
            f"{_tree_url(source)})"
    return f"run: {_download_command(source, cached.missing)}"


def hub_installed() -> bool:
    """Whether huggingface_hub can be imported (without importing it)."""
    if "huggingface_hub" in sys.modules:
        return sys.modules["huggingface_hub"] is not None
    try:
        return importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        return False


def _import_hub(what: str, source: ModelSource, cached: HfCached, cache: Path) -> ModuleType:
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError:
        raise ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloading it needs the "
            f"huggingface_hub package; install it with: {HUB_INSTALL_HINT}"
        ) from None


def _hub_error(
    exc: BaseException,
    *,
    what: str,
    hint: str,
    source: ModelSource,
    cached: HfCached,
    cache: Path,
    file: str | None,
    fetch: str | None = None,
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
            f"{_fetch_advice(source, cached, fetch)}"
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
            f"({_hf_endpoint()}) could not be reached; {_fetch_advice(source, cached, fetch)}"
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


def _reach(hub: ModuleType, source: ModelSource, name: str) -> None:
    """One HEAD request for ``name``, without retries (huggingface_hub retries an
    unreachable Hub for ~25 s, a warning each time); for a glob any answer will do."""
    url = hub.hf_hub_url(source.repo, name, revision=source.revision)
    try:
        hub.get_hf_file_metadata(url)
    except Exception as exc:
        if source.is_glob and not {cls.__name__ for cls in type(exc).__mro__} & _UNREACHABLE:
            return
        raise


def resolve_hf(source: ModelSource, *, what: str, hint: str, progress: Progress | None,
               fetch: str | None = None) -> Path:
    """The local file of ``source``: from the cache, else downloaded. ``fetch`` is the
    command an offline error tells to run (None: ``hf download ...``)."""
    assert source.repo is not None and source.file is not None
    cache = hf_cache_dir()
    cached = hf_lookup(source, cache)
    if cached.complete:
        return check_gguf_file(cached.path, what=what, hint=hint)
    hub = _import_hub(what, source, cached, cache)
    offline = hf_offline()
    if offline is not None:
        raise ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloads are off "
            f"({offline}); {_fetch_advice(source, cached, fetch)}"
        )

    file: str | None = cached.missing[0] if cached.missing else None
    try:
        _reach(hub, source, file or source.file)
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
            exc, what=what, hint=hint, source=source, cached=cached, cache=cache, file=file,
            fetch=fetch,
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

