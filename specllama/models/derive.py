"""Derived drafts: the target requantized, or its first layers, made once into the user
cache and reused.

The file is ``<cache>/derived/<stem>.<TAG>.<hash>.gguf`` (TAG: the quant, or ``first2``
for the first two layers); the hash covers the target's path, size and mtime, so a
changed target gets a new draft. Making it once, atomically and under a lock, is
:mod:`.makeonce`'s job.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import DraftDerivationError
from ..paths import CACHE_ENV_VAR, cache_dir
from .makeonce import UNWRITABLE, make_once

Progress = Callable[[str], None]


def derived_path(target: str | os.PathLike[str], tag: str) -> Path:
    """Where the draft ``tag`` (a quant such as ``Q4_0``, or ``first2``) of ``target``
    lives, whether or not it exists yet.

    The name carries a short hash of the target's absolute path, size and mtime, so
    editing or replacing the target produces a different file.
    """
    target = Path(os.path.abspath(target))
    st = target.stat()
    key = f"{target}\0{st.st_size}\0{st.st_mtime_ns}\0{tag}".encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return cache_dir() / "derived" / f"{target.stem}.{tag}.{digest}.gguf"


def first_layers_tag(layers: int) -> str:
    """The tag of a draft made of a target's first ``layers`` layers."""
    return f"first{layers}"


def _quantize(src: Path, dst: Path, quant: str, n_threads: int | None) -> None:
    # Imported here so that only deriving loads llama.cpp.
    from ..engine.llama import quantize

    quantize(src, dst, quant, n_threads)


def _quantize_checked(
    target: Path, tmp: Path, quant: str, n_threads: int | None, *, role: str
) -> None:
    """Quantize ``target`` into ``tmp``: a failure there for lack of room says so."""
    directory = tmp.parent
    try:
        _quantize(target, tmp, quant, n_threads)
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            raise  # make_once names the directory
        raise DraftDerivationError(
            f"deriving {quant} {role} from {target} failed: {exc}"
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


def derive(
    target: Path, quant: str, *, n_threads: int | None, progress: Progress | None,
    role: str = "draft",
) -> Path:
    """The ``quant`` requantization of ``target`` (the ``role`` it plays, in messages):
    made once into :func:`derived_path`, then reused (``progress`` hears of it)."""
    dst = derived_path(target, quant)
    return make_once(
        dst,
        lambda tmp: _quantize_checked(target, tmp, quant, n_threads, role=role),
        announce=f"deriving {quant} {role} from {target.name} (once; cached in {dst.parent})",
        invalid=f"quantizing {target} to {quant} produced no valid GGUF file",
        progress=progress,
    )


def derive_first_layers(target: Path, layers: int, *, progress: Progress | None) -> Path:
    """A draft made of ``target``'s first ``layers`` layers with its embeddings and
    output head, their data copied as they are: made once, then reused."""
    from .firstlayers import write_first_layers  # the gguf package, only when needed

    dst = derived_path(target, first_layers_tag(layers))
    return make_once(
        dst,
        lambda tmp: write_first_layers(target, tmp, layers),
        announce=f"deriving the draft from the first {layers} layers of {target.name} "
                 f"(once; cached in {dst.parent})",
        invalid=f"copying the first {layers} layers of {target} produced no valid GGUF file",
        progress=progress,
    )
