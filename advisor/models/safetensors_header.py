"""A .safetensors file judged from its header before any weight is read: an empty, cut or garbled
file is refused in milliseconds, not after the model load has started.

The format (huggingface/safetensors): 8 bytes little-endian N, then N bytes of JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that
follows the header), and an optional ``__metadata__`` entry.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from advisor.errors import InputError

MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers too
FIX = "download or copy the model again"


def check_safetensors_complete(path: Path, source: str) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor in ``path`` (name -> shape), from its header; InputError naming what is wrong
    with the file when its header and size disagree."""
    size = path.stat().st_size
    where = f"model.source: {source}: {path.name}"
    if size < 8:
        raise InputError(f"{where} is {size} bytes, too short for a safetensors header (an empty or cut file); {FIX}")
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise InputError(f"{where} is not a complete safetensors file (its header claims {header_len} bytes, "
                             f"the file has {size}); {FIX}")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
        tensors = {name: t for name, t in header.items() if name != "__metadata__"}
        ends = [int(t["data_offsets"][1]) for t in tensors.values()]
        shapes = {name: tuple(int(d) for d in t["shape"]) for name, t in tensors.items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise InputError(f"{where} has no readable safetensors header (not a safetensors file, or damaged); "
                         f"{FIX}") from None
    need = 8 + header_len + max(ends, default=0)
    if need > size:
        raise InputError(f"{where} is truncated: its tensors need {need} bytes, the file has {size}; {FIX}")
    return shapes


def tensor_dtypes(path: Path) -> set[str]:
    """The dtypes (``BF16``, ``F32``...) a .safetensors file's header gives its tensors, its weights unread; OSError or
    ValueError where it has no readable header."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name}: a header of {header_len} bytes")
        header = json.loads(f.read(header_len))
    return {str(t["dtype"]) for name, t in header.items() if name != "__metadata__"}


def check_weight_files(folder: Path, source: str) -> None:
    """Every .safetensors file in ``folder`` (one file or the shards of an index)."""
    for path in sorted(folder.glob("*.safetensors")):
        if path.is_file():
            check_safetensors_complete(path, source)


def loaded_tensor_shapes(folder: Path, source: str) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor transformers loads from ``folder`` (``model.safetensors``, or the shards
    ``model.safetensors.index.json`` names), from the headers alone; None where it loads no safetensors (``.bin``
    weights: their shapes are inside the pickles)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted({str(f) for f in weight_map.values()})
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
            raise InputError(f"model.source: {source}: {index.name} is not a safetensors index (no weight_map of "
                             f"tensor -> shard file); {FIX}") from None
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        if not (folder / shard).is_file():
            raise InputError(f"model.source: {source}: {shard}, a shard {index.name} names, is missing; {FIX}")
        shapes.update(check_safetensors_complete(folder / shard, source))
    return shapes
