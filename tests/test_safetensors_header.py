"""Weights judged from their safetensors header before any load: complete files pass, empty, cut
or garbled ones are refused with the file named."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from advisor.errors import InputError
from advisor.models.safetensors_header import check_safetensors_complete, check_weight_files


def _shard(path, n=16):
    save_file({"a": np.zeros(n, dtype=np.float32), "b": np.ones((2, n), dtype=np.float16)}, str(path))
    return path


def test_a_complete_file_passes_and_every_shard_is_checked(tmp_path):
    check_safetensors_complete(_shard(tmp_path / "model-00001-of-00002.safetensors"), "m")
    data = _shard(tmp_path / "model-00002-of-00002.safetensors").read_bytes()
    check_weight_files(tmp_path, "m")
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(data[:-1])
    with pytest.raises(InputError, match="model-00002-of-00002.safetensors is truncated: its tensors need"):
        check_weight_files(tmp_path, "m")


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is 0 bytes, too short"),
    (struct.pack("<Q", 10**12) + b"{}", "is not a complete safetensors file"),
    (struct.pack("<Q", 5) + b"{nope", "has no readable safetensors header"),
    (struct.pack("<Q", 2) + b"[]", "has no readable safetensors header"),
])
def test_broken_files_are_named(tmp_path, content, message):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        check_safetensors_complete(path, "m")
