"""What the Hugging Face hub cache already holds for an ``hf`` source: read from disk only.

The cache is read directly: its layout (``models--OWNER--REPO/refs/<rev>`` holding a
commit hash, and ``snapshots/<commit>/<file>``) is huggingface_hub's documented format.
So a cached model needs neither the network nor even ``huggingface_hub``, and the
status of a pair (:mod:`.status`) never touches the network. Nothing here imports
``huggingface_hub``; downloading is :mod:`.hfdownload`.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .schema import ModelSource

__all__ = ["HfCached", "gguf_parts", "hf_cache_dir", "hf_lookup", "pick_parts"]

# A ref named by its commit needs no refs/ file: the commit names the snapshot directory.
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# llama.cpp's split naming: "<prefix>-%05d-of-%05d.gguf"
_SHARD_RE = re.compile(
    r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.gguf)$", re.I
)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment *now* (huggingface_hub reads it at
    import): ``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``."""
    # The same order huggingface_hub resolves them in, so that we look where it writes.
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(var, "")
        if value:
            return Path(os.path.expandvars(os.path.expanduser(value)))
    home = os.environ.get("HF_HOME", "")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME", "") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


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
    # A refs file is only text on disk: one that would lead out of snapshots/ names nothing.
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    snapshot = repo_dir / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _snapshot_files(snapshot: Path) -> list[str]:
    """Repo-relative POSIX names of the complete files of a snapshot (dangling links skipped).

    A snapshot's files are links to blobs, made only once a blob is whole: a download cut
    short leaves a ``blobs/*.incomplete`` and no link, so it is never taken for cached. A
    link whose blob is gone is no file either, and ``is_file`` (following links) skips it."""
    names = []
    for path in snapshot.rglob("*"):
        if path.is_file():
            names.append(path.relative_to(snapshot).as_posix())
    return sorted(names)


def gguf_parts(name: str) -> list[str]:
    """Every file a GGUF needs: ``[name]``, or all parts of a split GGUF, first first.

    llama.cpp opens the first part and loads the others from beside it, so a split model
    is ready only when every part is in the same directory."""
    match = _SHARD_RE.match(name)
    if not match or int(match["count"]) < 1:
        return [name]
    width, count = len(match["count"]), int(match["count"])
    return [
        f"{match['prefix']}-{i:0{width}d}-of-{match['count']}{match['ext']}"
        for i in range(1, count + 1)
    ]


def pick_parts(matches: list[str]) -> list[str]:
    """The files to load for a glob's matches: the sorted first match, made its first part.

    Sorted so that the same cache or repository always gives the same model; made its
    first part so that a glob matching any part of a split GGUF loads all of it."""
    return gguf_parts(sorted(matches)[0])


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
        # A glob is matched against what this snapshot holds; the Hub's file list is
        # asked only when nothing here matches (and only when downloading).
        cached = _snapshot_files(snapshot) if snapshot is not None else []
        matches = [name for name in cached if fnmatch.fnmatchcase(name, source.file)]
        if not matches:
            return HfCached(snapshot, None, [])
        needed = pick_parts(matches)
    else:
        needed = gguf_parts(source.file)
    missing = [n for n in needed if snapshot is None or not (snapshot / n).is_file()]
    return HfCached(snapshot, needed, missing)
