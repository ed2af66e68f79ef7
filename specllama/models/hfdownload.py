"""Getting an ``hf`` source's files: from the cache when they are there, else downloaded
into it with ``huggingface_hub.hf_hub_download`` (which draws its own progress bar on
stderr).

Only downloading imports ``huggingface_hub``, lazily: a cached model needs neither the
network nor the package (:mod:`.hfcache`). Before any download, one HEAD request without
retries tells whether the Hub answers at all, and every failure becomes one line that
names the fix (:mod:`.hferrors`). A download cut short (Ctrl-C) leaves nothing that the
cache lookup takes for a file, so running the command again fetches it again.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from ..engine.llama.gguf import check_gguf_file
from ..errors import ModelLoadError
from .hfcache import HfCached, hf_cache_dir, hf_lookup, pick_parts
from .hferrors import home_short, hub_error, is_unreachable, no_hub_error, offline_error
from .schema import HF_DEFAULT_REVISION, ModelSource

__all__ = ["HF_OFFLINE_ENV_VARS", "Progress", "hf_offline", "hub_installed", "resolve_hf"]

Progress = Callable[[str], None]

#: Environment variables that switch huggingface_hub to offline mode (as it reads them).
HF_OFFLINE_ENV_VARS: tuple[str, ...] = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def hf_offline() -> str | None:
    """``"HF_HUB_OFFLINE=1"`` (the variable as set) when downloads are switched off, else None.

    Read here, at call time: huggingface_hub reads it once, at import, and asking it would
    import it even for a cached model."""
    for var in HF_OFFLINE_ENV_VARS:
        value = os.environ.get(var, "")
        if value.strip().upper() in _TRUE:
            return f"{var}={value}"
    return None


def hub_installed() -> bool:
    """Whether huggingface_hub can be imported (without importing it)."""
    # Imported already, or blocked with None: sys.modules answers (and find_spec would
    # raise on a stand-in module that has no __spec__).
    if "huggingface_hub" in sys.modules:
        return sys.modules["huggingface_hub"] is not None
    try:
        return importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        return False


def _import_hub(what: str, source: ModelSource, cached: HfCached, cache: Path) -> ModuleType:
    """huggingface_hub, imported now that a download needs it; missing, an error that says
    how to install it."""
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError:
        raise no_hub_error(what, source, cached, cache) from None


def _remote_match(hub: ModuleType, source: ModelSource, *, what: str, hint: str) -> list[str]:
    """The files to fetch for a glob, from the repo's file list on the Hub."""
    files = hub.HfApi().list_repo_files(source.repo, revision=source.revision)
    matches = [name for name in files if fnmatch.fnmatchcase(name, source.file or "")]
    if not matches:
        # The repo's GGUF files (a dozen at most) show what the glob could have said.
        ggufs = sorted(name for name in files if name.lower().endswith(".gguf"))
        shown = ", ".join(ggufs[:12]) + (f" and {len(ggufs) - 12} more" if len(ggufs) > 12 else "")
        has = f"; its .gguf files: {shown}" if ggufs else "; it has no .gguf files"
        at = f" (revision {source.revision})" if source.revision != HF_DEFAULT_REVISION else ""
        raise ModelLoadError(
            f'{what}: no file in {source.repo}{at} matches "{source.file}"{has}{hint}'
        )
    return pick_parts(matches)


def _reach(hub: ModuleType, source: ModelSource, name: str) -> None:
    """One HEAD request for ``name``, without retries. huggingface_hub retries an
    unreachable Hub for ~25 s, a warning on stderr each time, before it gives up on a file
    it has no copy of: this tells an offline machine (an unknown repo or file too) at once.
    A glob names no file: any answer to it says the Hub is reachable."""
    url = hub.hf_hub_url(source.repo, name, revision=source.revision)
    try:
        hub.get_hf_file_metadata(url)
    except Exception as exc:
        if source.is_glob and not is_unreachable(exc):
            return
        raise


def _to_fetch(
    hub: ModuleType, source: ModelSource, cached: HfCached, progress: Progress | None, *,
    what: str, hint: str,
) -> tuple[list[str], list[str]]:
    """(the files needed, first one to load; those of them still to download). A glob
    with no match in the cache is matched against the repo's file list on the Hub."""
    if cached.needed is not None:
        return cached.needed, cached.missing
    if progress is not None:
        progress(f'looking for "{source.file}" in {source.repo} on Hugging Face')
    needed = _remote_match(hub, source, what=what, hint=hint)
    return needed, needed


def resolve_hf(
    source: ModelSource, *, what: str, hint: str, progress: Progress | None,
    fetch: str | None = None,
) -> Path:
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
        raise offline_error(what, source, cached, cache, offline, fetch)

    # The file in hand when something fails, for the error to name.
    file: str | None = cached.missing[0] if cached.missing else None
    try:
        _reach(hub, source, file or source.file)
        needed, missing = _to_fetch(hub, source, cached, progress, what=what, hint=hint)
        # Every part goes through hf_hub_download (a cached one costs a HEAD request and
        # no download), so that all parts land in the same snapshot directory.
        paths = []
        for file in needed:
            if progress is not None and file in missing:
                progress(
                    f"downloading {source.repo}/{file} from Hugging Face "
                    f"(once; cached in {home_short(cache)})"
                )
            # The cache passed explicitly: huggingface_hub fixed its own at import, and
            # the file must land where hf_lookup will look for it next time.
            paths.append(
                Path(
                    hub.hf_hub_download(
                        source.repo, file, revision=source.revision, cache_dir=str(cache)
                    )
                )
            )
    except ModelLoadError:
        raise  # ours (an unmatched glob) already reads as one line
    except Exception as exc:
        problem = hub_error(
            exc, what=what, hint=hint, source=source, cached=cached, cache=cache, file=file,
            fetch=fetch,
        )
        if problem is None:
            raise
        raise problem from None
    # llama.cpp loads the other parts from beside the first: they must share a snapshot.
    if len({path.parent for path in paths}) > 1:
        raise ModelLoadError(
            f"{what}: the parts of {source.repo}/{needed[0]} were downloaded from different "
            f"revisions (the repository changed meanwhile); run the command again"
        )
    return check_gguf_file(paths[0], what=what, hint=hint)
