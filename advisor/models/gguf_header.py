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

import re
import struct
from dataclasses import dataclass, field
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
    block_count: int | None = None  # {architecture}.block_count: the decoder layers transformers builds
    embedding_length: int | None = None  # {architecture}.embedding_length: the hidden size
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> dims (GGUF order: fastest first)


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
    needed = max((data_start + offset + nbytes for _, _, offset, nbytes in tensors), default=data_start)

    def number(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}") if arch else None
        return int(value) if isinstance(value, int | float) else None

    return GgufHeader(arch, number("context_length") or None, tensor_count, needed, size, number("block_count"),
                      number("embedding_length"), {name: dims for name, dims, _, _ in tensors})


def _tensor_info(r: _Reader) -> tuple[str, tuple[int, ...], int, int]:
    """(name, dims, data offset, bytes) of one tensor; bytes 0 for a ggml type this reader does not know."""
    name = r.string()
    dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
    ggml_type, offset = r.unpack("<I"), r.unpack("<Q")
    return name, tuple(dims), offset, _tensor_bytes(ggml_type, dims)


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
    check_gguf_layers(header, path)
    return header


#: per-block tensors a family needs and transformers would otherwise initialise at random
GGUF_BLOCK_TENSORS = {"qwen2": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
                      "qwen2moe": ("attn_q.bias", "attn_k.bias", "attn_v.bias")}


def check_gguf_layers(header: GgufHeader, path: Path | str) -> None:
    """The metadata transformers builds the model from (block count, embedding length) against the tensors the
    file holds: a layer the file lacks would be initialised at random, one it holds beyond the count dropped."""
    arch, n = header.architecture, header.block_count
    at = f"model.source: {path}: its metadata and tensors disagree"
    fix = "convert or download the model again"
    blocks = sorted({int(m[1]) for name in header.tensors if (m := re.match(r"blk\.(\d+)\.", name))})
    if arch is None or (n is None and not blocks):
        return
    if n is None or n < 1:
        raise InputError(f"{at}: {arch}.block_count is {n}, but the file holds {len(blocks)} blocks; {fix}")
    if extra := [b for b in blocks if b >= n]:
        raise InputError(f"{at}: {arch}.block_count says {n} layers, but the file holds blk.{extra[0]}.* tensors "
                         f"(they would be dropped); {fix}")
    if missing := [b for b in range(n) if b not in blocks]:
        raise InputError(f"{at}: {arch}.block_count says {n} layers, but blk.{missing[0]}.* tensors are missing "
                         f"(that layer would be initialised at random); {fix}")
    embed = header.tensors.get("token_embd.weight")
    if embed and header.embedding_length and embed[0] != header.embedding_length:
        raise InputError(f"{at}: token_embd.weight is {embed[0]} wide, {arch}.embedding_length says "
                         f"{header.embedding_length}; {fix}")
    for b in range(n):
        for name in GGUF_BLOCK_TENSORS.get(arch, ()):
            if f"blk.{b}.{name}" not in header.tensors:
                raise InputError(f"{at}: blk.{b}.{name} is missing, and a {arch} model has it (it would be "
                                 f"initialised at random); {fix}")
