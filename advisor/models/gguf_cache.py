"""Parse a GGUF file once per load instead of once per transformers call.

transformers' GGUF path opens ``gguf.GGUFReader`` separately for the config, the
tokenizer and the weights, and rebuilds ``gguf.get_tensor_name_map`` for every submodule
while mapping tensor names (hundreds of times): on SmolLM2-135M that was 27 of the 32 s
of the quickstart's load. Both results are read-only, so within :func:`gguf_parsed_once`
they are memoized; nothing outside that block sees the memo.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    try:
        import gguf
    except ImportError:  # transformers raises its own install hint when it needs gguf
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader = reader  # type: ignore[assignment]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
        readers.clear()
