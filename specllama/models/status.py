"""What a pair's sources amount to on this machine, as text, for ``specllama pairs``:
whether they are ready, still to download or missing, and where each one resolves.

Nothing here loads, derives, makes, assembles or downloads anything, nor touches the
network: a Hugging Face model is looked up in the cache only, a package's file is found
but not assembled, and a requantized, first-layers or synthetic file is only looked for
where :mod:`.derive` or :mod:`.synthetic` would make it.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.llama.gguf import check_gguf_file, is_gguf
from ..errors import DraftDerivationError, ModelLoadError
from .derive import derived_path
from .hf import hf_cache_dir, hf_lookup, hf_offline, hub_installed
from .packages import PACKAGE_INSTALL_HINTS, package_file
from .schema import ModelSource, Pair, SyntheticSpec
from .sources import resolve_source
from .synthetic import SHAPES, approx_size

__all__ = ["locations", "pending_downloads", "pending_synthetic", "source_status"]


def _quant_of(pair: Pair, role: str) -> str | None:
    """The ``quant`` a pair's file source of ``role`` is requantized to (None: as is)."""
    return pair.target_quant if role == "target" else pair.draft_quant


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
        found, assemble = package_file(source.package, source.file, what=what)
        if assemble is not None:
            steps.append("assembled from its Python package")
            return None
        return check_gguf_file(found, what=what)
    if source.synthetic is not None:
        made = _synthetic_file(source.synthetic)
        if made is None:
            steps.append("written with random weights")
        return made
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


def _synthetic_file(spec: SyntheticSpec) -> Path | None:
    """A synthetic model's file, or None while it is not made."""
    return spec.path if spec.path.is_file() and is_gguf(spec.path) else None


def pending_downloads(pair: Pair) -> list[str]:
    """The Hugging Face models of ``pair`` that are not in the cache yet, as
    ``"target: hf://OWNER/REPO/FILE"`` strings (empty: nothing to download). No network."""
    pending = []
    for role, source in (("target", pair.target), ("draft", pair.draft)):
        if source.kind == "hf" and not hf_lookup(source, hf_cache_dir()).complete:
            pending.append(f"{role}: {source.describe()}")
    return pending


def pending_synthetic(pair: Pair) -> str | None:
    """What a synthetic target still to be made amounts to, e.g. "synthetic Llama 3.1 8B
    shape, ~4.9 GB" (None: not synthetic, or made already)."""
    spec = pair.target.synthetic
    if spec is None or _synthetic_file(spec) is not None:
        return None
    return f"synthetic {spec.title} shape, {approx_size(SHAPES[spec.shape], spec.quant)}"


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
                made = derived_path(target, source.derive_tag)
                return str(made) if made.exists() else f"{made} (made on first use)"
            elif source.synthetic is not None:
                found_made = _synthetic_file(source.synthetic)
                if found_made is None:
                    return f"{source.synthetic.path} (made on first use)"
                found = found_made
            elif source.kind == "package":
                assert source.package is not None and source.file is not None
                found, assemble = package_file(source.package, source.file, what=what)
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
                target is None or not derived_path(target, pair.draft.derive_tag).exists()
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
