"""A GGUF file's header, read in milliseconds: its architecture, context length, and whether the
file holds all the tensor data the header promises (a truncated download fails here with one
line, not deep inside a loader).

Format (GGUF v2/v3, little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64
key-value count; the key-value pairs; per tensor its name, dims, ggml type and data offset;
then the data, aligned to ``general.alignment`` (default 32). ``gguf``'s own reader parses
every vocabulary string into numpy objects and takes seconds on a 49k-token vocabulary;
here only the few values needed are kept and the rest is skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from advisor.errors import InputError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufHeader:
    architecture: str | None  # general.architecture, e.g. "llama"
    context_length: int | None  # {architecture}.context_length
    tensor_count: int
    data_bytes_needed: int  # where the last tensor's data ends
    file_bytes: int


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.size = size

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise _Truncated
        return self.f.read(n)

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALARS:  # skip numeric arrays without reading them
                self.take_skip(count * struct.calcsize(_SCALARS[etype]))
            else:
                for _ in range(count):
                    self.value(etype)
            return None
        raise ValueError(f"unknown GGUF value type {vtype}")

    def take_skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise _Truncated
        self.f.seek(n, 1)


def read_gguf_header(path: Path | str) -> GgufHeader:
    """Parse ``path``'s header; InputError for a file that is not GGUF, corrupt or truncated."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            head = f.read(len(MAGIC))
            if not head or head != MAGIC[: len(head)]:
                raise ValueError("no GGUF magic bytes at the start")
            f.seek(0)
            return _parse(_Reader(f, size), size)
    except _Truncated:
        raise InputError(f"model.source: {path} is a truncated GGUF file (its header ends early, after "
                         f"{size} bytes); download it again") from None
    except (ValueError, struct.error) as exc:
        raise InputError(f"model.source: {path} is not a readable GGUF file ({exc}); download it again") from None


def _parse(r: _Reader, size: int) -> GgufHeader:
    if r.take(4) != MAGIC:
        raise ValueError("no GGUF magic bytes at the start")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; transformers reads versions 2 and 3")
    tensor_count, kv_count = r.unpack("<Q"), r.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(kv_count):
        key = r.string()
        meta[key] = r.value(r.unpack("<I"))
    arch = meta.get("general.architecture")
    tensors = [_tensor_info(r) for _ in range(tensor_count)]
    alignment = int(meta.get("general.alignment") or DEFAULT_ALIGNMENT)
    data_start = -(-r.f.tell() // alignment) * alignment
    needed = max((data_start + offset + nbytes for offset, nbytes in tensors), default=data_start)
    context = meta.get(f"{arch}.context_length") if arch else None
    return GgufHeader(arch, int(context) if context else None, tensor_count, needed, size)


def _tensor_info(r: _Reader) -> tuple[int, int]:
    """(data offset, bytes) of one tensor; bytes 0 for a ggml type this reader does not know."""
    r.string()
    dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
    ggml_type, offset = r.unpack("<I"), r.unpack("<Q")
    return offset, _tensor_bytes(ggml_type, dims)


def _tensor_bytes(ggml_type: int, dims: list[int]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return 0
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * type_size


def check_gguf_complete(path: Path | str) -> GgufHeader:
    """The header of a GGUF file that holds all its tensor data; InputError otherwise."""
    header = read_gguf_header(path)
    if header.file_bytes < header.data_bytes_needed:
        raise InputError(f"model.source: {path} is truncated: its {header.tensor_count} tensors need "
                         f"{header.data_bytes_needed} bytes, the file has {header.file_bytes}; download it again")
    return header
