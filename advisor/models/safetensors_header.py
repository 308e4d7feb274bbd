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


def check_safetensors_complete(path: Path, source: str) -> None:
    """InputError naming what is wrong with ``path``, or nothing when its header and size agree."""
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
        ends = [int(t["data_offsets"][1]) for name, t in header.items() if name != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise InputError(f"{where} has no readable safetensors header (not a safetensors file, or damaged); "
                         f"{FIX}") from None
    need = 8 + header_len + max(ends, default=0)
    if need > size:
        raise InputError(f"{where} is truncated: its tensors need {need} bytes, the file has {size}; {FIX}")


def check_weight_files(folder: Path, source: str) -> None:
    """Every .safetensors file in ``folder`` (one file or the shards of an index)."""
    for path in sorted(folder.glob("*.safetensors")):
        if path.is_file():
            check_safetensors_complete(path, source)
