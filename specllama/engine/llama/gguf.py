"""Is this file a GGUF model? Checked before llama.cpp sees it, for one-line errors."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

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


# Bytes of each fixed-size GGUF value type (gguf.GGUFValueType 0-12; 8 string, 9 array)
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def architecture(path: Path) -> str | None:
    """The file's `general.architecture` (None where the header does not say), read
    from the header alone: which kind of model to build comes before llama.cpp loads it."""
    found = _header_value(path, "general.architecture")
    return found if isinstance(found, str) else None


def has_key(path: Path, key: str) -> bool | None:
    """Whether the GGUF header holds `key` (None: no header this could read through),
    read from the header alone (bench.llamaserver: has the model a chat template?)."""
    found = _header_value(path, key)
    return None if found is _UNREADABLE else found is not _ABSENT


_ABSENT, _UNREADABLE = object(), object()


def _header_value(path: Path, key: str) -> object:
    """`key`'s value where it is a string, True where it is another type; _ABSENT or
    _UNREADABLE otherwise."""
    try:
        with path.open("rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                return _UNREADABLE
            _version, _n_tensors, n_kv = struct.unpack("<IQQ", fh.read(20))
            for _ in range(min(n_kv, 4096)):
                name = _string(fh)
                kind = struct.unpack("<I", fh.read(4))[0]
                if name == key:
                    return _string(fh) if kind == 8 else True
                _skip(fh, kind)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return _UNREADABLE
    return _ABSENT


def _string(fh: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", fh.read(8))
    return fh.read(n).decode("utf-8")


def _skip(fh: BinaryIO, kind: int) -> None:
    if kind == 8:
        fh.seek(struct.unpack("<Q", fh.read(8))[0], os.SEEK_CUR)
    elif kind == 9:
        item, n = struct.unpack("<IQ", fh.read(12))
        if item in _SIZES:
            fh.seek(n * _SIZES[item], os.SEEK_CUR)
        else:
            for _ in range(n):
                _skip(fh, item)
    elif kind in _SIZES:
        fh.seek(_SIZES[kind], os.SEEK_CUR)
    else:
        raise ValueError(f"GGUF value type {kind}")


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False
