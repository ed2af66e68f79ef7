"""Is this file a GGUF model? Checked before llama.cpp sees it, for one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
_LFS_POINTER = b"version https://git-lfs"


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


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False
