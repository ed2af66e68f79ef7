"""ModelSource -> a local GGUF file.

- ``path``: checked to be a non-empty regular file starting with the GGUF magic.
- ``package``: a file inside an installed Python package's directory, assembled once
  into the user cache when the package ships it in chunks (:mod:`.packages`).
- ``derive``: the target requantized, or its first layers, made once into the user
  cache (:mod:`.derive`).
- ``synthetic``: a random-weight model of a real shape, made once into the user cache
  (:mod:`.synthetic`; with ``eagle3``, :mod:`.synthetic_eagle3`'s, made for an EAGLE3
  head); a ``derive`` source with ``eagle3``: that head, made once beside derived drafts.
- ``quant`` on the target's or the draft's file source (``Pair.target_quant``,
  ``Pair.draft_quant``): that file requantized once into the user cache, the same way.
- ``lookup``: has no file; :func:`resolve_source` refuses it.
- ``hf``: a file of a Hugging Face repository, cached or downloaded (:mod:`.hf`).

What a pair's sources amount to without fetching anything is :mod:`.status`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from ..engine.llama.gguf import GGUF_MAGIC, check_gguf_file
from ..errors import ConfigError, DraftDerivationError
from ..paths import CACHE_ENV_VAR, cache_dir
from .derive import derive, derive_first_layers, derived_path
from .hf import hf_cache_dir, hf_cli, hf_offline, resolve_hf
from .packages import find_package_file
from .schema import ModelSource, Pair
from .search import find_config, packaged_config_path
from .synthetic import make_synthetic
from .synthetic_eagle3 import make_draft as make_eagle3_draft
from .synthetic_eagle3 import make_target as make_eagle3_target

__all__ = [
    "CACHE_ENV_VAR",
    "GGUF_MAGIC",
    "cache_dir",
    "check_gguf_file",
    "derived_path",
    "hf_cache_dir",
    "hf_cli",
    "hf_offline",
    "pull_command",
    "resolve_draft",
    "resolve_pair",
    "resolve_target",
    "resolve_source",
]

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


def pull_command(pair: Pair) -> str | None:
    """``specllama pull NAME`` (with ``--config FILE`` where a plain ``specllama pull``
    would find another models.toml): what an offline error tells to run. None for a pair
    built in code, which no command can name."""
    path = pair.config_path
    if path is None:
        return None
    words = ["specllama", "pull", pair.name]
    if path.resolve() != packaged_config_path().resolve():
        try:
            found: Path | None = find_config().resolve()
        except ConfigError:
            found = None
        if found != path.resolve():
            words += ["--config", str(path)]
    return shlex.join(words)


# --------------------------------------------------------------------------- public


def resolve_source(
    source: ModelSource,
    *,
    pair: Pair,
    n_threads: int | None = None,
    progress: Progress | None = None,
    role: str | None = None,
    advise_pull: bool = True,
) -> Path:
    """A local, checked GGUF path for ``source`` (one of ``pair``'s sources), as written:
    a pair's ``target_quant`` / ``draft_quant`` is not applied here (see
    :func:`resolve_target`, :func:`resolve_draft`).

    ``n_threads``: for quantizing (a derived draft, a synthetic target); ``progress(message)``
    hears of deriving, making, assembling and downloading; ``role`` ("target" or "draft")
    names the source where target and draft are the same; ``advise_pull`` False has an
    offline error advise ``hf download`` rather than ``specllama pull`` (itself). Raises
    :class:`ModelLoadError` for missing or invalid files and packages and for Hugging Face
    models that cannot be had (offline, unknown repo or file...),
    :class:`DraftDerivationError` when deriving fails, and ``ValueError`` for a ``lookup``
    source (it has no file).
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
        fetch = pull_command(pair) if advise_pull else None
        return resolve_hf(source, what=what, hint=hint, progress=progress, fetch=fetch)

    if source.kind == "synthetic":
        spec = source.synthetic
        assert spec is not None
        make = make_eagle3_target if spec.eagle3 else make_synthetic
        return make(spec.shape, spec.quant, spec.early, spec.late, spec.seed,
                    n_threads=n_threads, progress=progress)

    if source.kind == "derive":
        return _derived(source, pair, n_threads, progress, hint)

    if source.kind == "lookup":
        raise ValueError(f"pair {pair.name!r}: a lookup draft has no model file; do not resolve it")
    raise ValueError(f"unknown source kind {source.kind!r}")  # pragma: no cover


def _derived(source: ModelSource, pair: Pair, n_threads: int | None,
             progress: Progress | None, hint: str) -> Path:
    """A draft made from the pair's target: requantized, its first layers, or an EAGLE3
    head made for a synthetic target (its weights follow from the target's shape and
    seed; its file goes with the target's)."""
    if pair.target.kind not in ("path", "package", "hf", "synthetic"):
        raise ValueError(
            f"pair {pair.name!r}: cannot derive a draft from a {pair.target.kind} target"
        )
    spec = pair.target.synthetic
    if source.eagle3 and (spec is None or not spec.eagle3):
        raise DraftDerivationError(
            f"pair {pair.name!r}: an EAGLE3 head drafts only for a synthetic target "
            f"made for one (eagle3 = true){hint}")
    target = resolve_target(pair, n_threads=n_threads, progress=progress)
    if source.eagle3:
        assert spec is not None
        return make_eagle3_draft(target, spec.shape, spec.seed, progress=progress)
    if source.layers is not None:
        return derive_first_layers(target, source.layers, progress=progress)
    assert source.quant is not None
    return derive(target, source.quant, n_threads=n_threads, progress=progress)


def resolve_target(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> Path:
    """The target's file: its source, requantized once when the pair sets ``quant``."""
    return _requantized(pair, "target", n_threads, progress)


def resolve_draft(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> Path | None:
    """The draft's file (None for a lookup draft): its source, requantized once when the
    pair sets ``quant`` on the draft's file source."""
    if pair.draft.kind == "lookup":
        return None
    return _requantized(pair, "draft", n_threads, progress)


def _requantized(pair: Pair, role: str, n_threads: int | None,
                 progress: Progress | None) -> Path:
    source, quant = (pair.target, pair.target_quant) if role == "target" else \
        (pair.draft, pair.draft_quant)
    path = resolve_source(source, pair=pair, n_threads=n_threads, progress=progress, role=role)
    return path if quant is None else derive(path, quant, n_threads=n_threads,
                                             progress=progress, role=role)


def resolve_pair(
    pair: Pair, *, n_threads: int | None = None, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    """``(target_path, draft_path)``; ``draft_path`` is None for a lookup draft."""
    target = resolve_target(pair, n_threads=n_threads, progress=progress)
    return target, resolve_draft(pair, n_threads=n_threads, progress=progress)
