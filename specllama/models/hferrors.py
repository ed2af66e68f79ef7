"""What a failure to get an ``hf`` model says: a one-line :class:`ModelLoadError` that
names what is missing, where it was looked for, and the command that fixes it.

With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, a model that is not cached
is an error naming the command that fetches it: the caller's (``fetch``: ``specllama
pull NAME``), else the exact ``hf download`` command. huggingface_hub's own exceptions
are told apart by class name (:func:`hub_error`), so that nothing here imports it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
from pathlib import Path

from ..errors import ModelLoadError
from .hfcache import HfCached
from .schema import HF_DEFAULT_REVISION, ModelSource

__all__ = [
    "HUB_INSTALL_HINT",
    "hf_cli",
    "home_short",
    "hub_error",
    "is_unreachable",
    "no_hub_error",
    "offline_error",
]

HUB_INSTALL_HINT = "pip install 'huggingface-hub>=0.20'"

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


def _hub_version() -> tuple[int, int] | None:
    """huggingface_hub's (major, minor), from its metadata: asking does not import it."""
    try:
        version = importlib.metadata.version("huggingface-hub")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def hf_cli() -> str:
    """The Hugging Face command line tool: ``hf`` (huggingface_hub >= 0.34, or when it is not
    installed yet), else the older ``huggingface-cli``."""
    # An error's advice must run as printed: older releases ship no `hf` command.
    version = _hub_version()
    return "huggingface-cli" if version is not None and version < (0, 34) else "hf"


def _hf_login() -> str:
    # The login command follows the tool's name (before 0.34: `huggingface-cli login`).
    return "hf auth login" if hf_cli() == "hf" else "huggingface-cli login"


def home_short(path: Path) -> str:
    """``path`` with the home directory written ``~``."""
    # Keeps a one-line error short where the cache is the usual one under the home.
    home = os.path.expanduser("~")
    text = str(path)
    if home not in ("", "~", os.sep) and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home) :]
    return text


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
    # Quoted, so that a glob reaches the tool rather than the shell.
    return " ".join(shlex.quote(w) for w in words)


def _hf_endpoint() -> str:
    # HF_ENDPOINT points huggingface_hub at a mirror; the links we print follow it too.
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def _tree_url(source: ModelSource) -> str:
    return f"{_hf_endpoint()}/{source.repo}/tree/{source.revision}"


def _not_cached(source: ModelSource, cached: HfCached, cache: Path) -> str:
    """'<what is missing> is not in the Hugging Face cache (<dir>)' (no leading 'what: ')."""
    where = f"the Hugging Face cache ({home_short(cache)})"
    if cached.needed is None:
        return f'no file matching "{source.file}" from {source.repo} is in {where}'
    if len(cached.missing) == 1:
        return f"{source.repo}/{cached.missing[0]} is not in {where}"
    return (
        f"{len(cached.missing)} files of {source.repo} "
        f"({', '.join(cached.missing)}) are not in {where}"
    )


def _fetch_advice(source: ModelSource, cached: HfCached, fetch: str | None) -> str:
    """'run: FETCH', else 'run: hf download ...' (plus where to list a repo's files, for an
    unmatched glob)."""
    if fetch is not None:
        return f"run: {fetch}"
    if cached.needed is None:
        return (
            f"run: {_download_command(source, None)} (list the repo's files at {_tree_url(source)})"
        )
    return f"run: {_download_command(source, cached.missing)}"


def offline_error(
    what: str, source: ModelSource, cached: HfCached, cache: Path, offline: str,
    fetch: str | None,
) -> ModelLoadError:
    """Downloads are switched off (``offline``: the variable as set) and ``source`` is not
    cached: the error says so and names the command to run where downloads are on."""
    return ModelLoadError(
        f"{what}: {_not_cached(source, cached, cache)} and downloads are off "
        f"({offline}); {_fetch_advice(source, cached, fetch)}"
    )


def no_hub_error(what: str, source: ModelSource, cached: HfCached, cache: Path) -> ModelLoadError:
    """``source`` is not cached and huggingface_hub, needed only to download, is missing."""
    return ModelLoadError(
        f"{what}: {_not_cached(source, cached, cache)} and downloading it needs the "
        f"huggingface_hub package; install it with: {HUB_INSTALL_HINT}"
    )


def _class_names(exc: BaseException) -> tuple[set[str], set[str]]:
    """The class names in ``exc``'s MRO, and those of the exceptions it was raised from."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    causes: set[str] = set()  # e.g. LocalEntryNotFoundError raised from OfflineModeIsEnabled
    cause = exc.__cause__ or exc.__context__
    for _ in range(10):  # a few links are plenty (and a cycle ends)
        if cause is None:
            break
        causes.update(cls.__name__ for cls in type(cause).__mro__)
        cause = cause.__cause__ or cause.__context__
    return names, causes


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means that the Hub could not be reached."""
    return bool({cls.__name__ for cls in type(exc).__mro__} & _UNREACHABLE)


def _repo_error(
    names: set[str], *, what: str, hint: str, source: ModelSource
) -> ModelLoadError | None:
    """The error for a repository or revision that the Hub refuses, or None (another
    failure). A gated repository is also a RepositoryNotFoundError: it goes first."""
    repo, rev = source.repo, source.revision
    if "GatedRepoError" in names:
        return ModelLoadError(
            f"{what}: {repo} is a gated repository: accept its terms at "
            f"{_hf_endpoint()}/{repo} and log in with `{_hf_login()}`{hint}"
        )
    if "RepositoryNotFoundError" in names:
        # The Hub answers the same for a private repository without a login.
        return ModelLoadError(
            f"{what}: there is no Hugging Face repository {repo} "
            f"(or it is private: log in with `{_hf_login()}`){hint}"
        )
    if "RevisionNotFoundError" in names:
        return ModelLoadError(f"{what}: {repo} has no revision {rev!r}{hint}")
    return None


def hub_error(
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
    """A one-line ModelLoadError for a huggingface_hub failure, or None to let it propagate.

    The checks go from the most particular class to the most general: OfflineModeIsEnabled
    is also a ConnectionError, and LocalEntryNotFoundError an EntryNotFoundError."""
    names, causes = _class_names(exc)
    repo, rev = source.repo, source.revision
    at = f" at revision {rev!r}" if rev != HF_DEFAULT_REVISION else ""
    if "OfflineModeIsEnabled" in names | causes:
        # hf_offline() saw no HF_HUB_OFFLINE now, but huggingface_hub read it at import.
        return ModelLoadError(
            f"{what}: {_not_cached(source, cached, cache)} and downloads are off "
            f"(huggingface_hub was imported with HF_HUB_OFFLINE set); "
            f"{_fetch_advice(source, cached, fetch)}"
        )
    problem = _repo_error(names, what=what, hint=hint, source=source)
    if problem is not None:
        return problem
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
        # The first line only: what follows (the server's text, a request id) would
        # break the one-line error.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return ModelLoadError(f"{what}: downloading from {repo} failed: {first}")
    if isinstance(exc, OSError):
        # E.g. a full disk or an unwritable cache: the user's to fix, so no traceback.
        reason = exc.strerror or str(exc) or type(exc).__name__
        return ModelLoadError(
            f"{what}: downloading {repo}/{file or source.file} into "
            f"{home_short(cache)} failed: {reason}"
        )
    return None
