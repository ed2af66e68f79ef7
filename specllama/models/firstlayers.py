"""A draft made of a target's first layers: a copy of its GGUF file keeping the
embeddings, the output head and blocks 0..N-1, every tensor's data as it is (quantized
blocks copied raw), the metadata the same but for the block count.

Such a draft computes exactly what the target computes up to layer N, then reads out
with the target's own head: it agrees with the target as far as the later layers
change little (what a synthetic model's small later layers are for: .synthetic).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import DraftDerivationError

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return field.contents() if field is not None else None


def _parts(target: Path, reader: Any) -> list[Path]:
    """The files of ``target``: itself, or every part of a split GGUF (its first part)."""
    count = int(_field(reader, "split.count") or 1)
    if count <= 1:
        return [target]
    match = _SPLIT_RE.search(target.name)
    if match is None or int(match[1]) != 1:
        raise DraftDerivationError(
            f"{target}: a split GGUF file of {count} parts is read from its first part, "
            "named like NAME-00001-of-0000N.gguf"
        )
    stem = target.name[: match.start()]
    return [target.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _copy_metadata(reader: Any, writer: Any, arch: str, blocks: int, layers: int) -> None:
    """Every key but the writer's own and a split file's, with the block count (and any
    per-layer array of the architecture) cut to ``layers``."""
    import gguf

    for field in reader.fields.values():
        name = field.name
        if name == gguf.Keys.General.ARCHITECTURE or name.startswith(("GGUF.", "split.")):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if name == f"{arch}.block_count":
            value = layers
        elif name == gguf.Keys.General.NAME:
            value = f"{value} (first {layers} layers)"
        elif (name.startswith(f"{arch}.") and vtype == gguf.GGUFValueType.ARRAY
              and len(value) == blocks):
            value = value[:layers]  # one value per layer (head counts of some families)
        writer.add_key_value(name, value, vtype, sub_type=sub_type)


def write_first_layers(target: Path, dst: Path, layers: int) -> None:
    """Write at ``dst`` the draft made of ``target``'s first ``layers`` layers.

    Raises :class:`DraftDerivationError` when ``target`` has no more than ``layers``
    layers or is not a GGUF file the ``gguf`` package reads.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(target, "r")
    except (ValueError, OSError) as exc:
        raise DraftDerivationError(f"{target}: cannot read it as a GGUF file: {exc}") from exc
    arch = str(_field(reader, gguf.Keys.General.ARCHITECTURE))
    blocks = _field(reader, f"{arch}.block_count")
    if blocks is None:
        raise DraftDerivationError(f"{target}: no {arch}.block_count: not a model of layers")
    if layers >= int(blocks):
        raise DraftDerivationError(
            f"{target} has {int(blocks)} layers: a draft of its first layers takes fewer "
            f"than that, not {layers}"
        )
    readers = [reader] + [gguf.GGUFReader(p, "r") for p in _parts(target, reader)[1:]]
    kept = [t for r in readers for t in r.tensors
            if (m := _BLOCK_RE.match(t.name)) is None or int(m[1]) < layers]
    writer = gguf.GGUFWriter(dst, arch)
    _copy_metadata(reader, writer, arch, int(blocks), layers)
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
