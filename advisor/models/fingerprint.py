"""The model fingerprint: a content hash of the weights and the config that keys every cache a change of
weights must not outlive (token sets, sensitivity, lm-eval scores) and tells resume, `recheck` and `export`
whether a model is the one a run used.

A model folder of safetensors files is fingerprinted from the files' bytes, tensor by tensor in name order
(name, dtype, shape, the stored bytes), read in chunks while transformers loads the same shards (page cache):
no tensor is copied, the model may sit on any device or stream from CPU memory, and the same files give the
same fingerprint wherever they are. Other sources (GGUF files, which transformers reads whole into CPU
memory) hash the loaded tensors. Either way the config is hashed without the fields that say where or with
what it was saved (:data:`NOT_IDENTITY`), so a copy of the model in another folder or venv is the same
model. These fingerprints start with ``v2-``.

Runs written before (a bare 16-hex fingerprint) hashed ``config.to_json_string()``, install path and
transformers version included: :func:`run_fingerprint` recomputes that old hash from the loaded model and,
when it matches, keeps the run's own fingerprint so its study and caches stay valid.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from advisor.errors import InputError

PREFIX = "v2-"
#: config fields that name where or with what a model was saved, not what it is
NOT_IDENTITY = frozenset({"_name_or_path", "name_or_path", "_commit_hash", "transformers_version"})
CHUNK = 16 * 2**20


def config_identity(config: Any) -> Any:
    """``config`` (a dict from config.json or ``config.to_dict()``) without :data:`NOT_IDENTITY` fields, at any
    depth (a multimodal model's text config carries its own)."""
    if isinstance(config, dict):
        return {k: config_identity(v) for k, v in config.items() if k not in NOT_IDENTITY}
    if isinstance(config, list):
        return [config_identity(v) for v in config]
    return config


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files transformers loads from ``folder`` (an index's shards, or model.safetensors)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def files_fingerprint(folder: Path) -> str | None:
    """The fingerprint of the model in ``folder`` from config.json and its safetensors bytes; None when the folder
    holds no such files (then :func:`tensor_fingerprint` of the loaded model)."""
    files = weight_files(folder)
    config = folder / "config.json"
    if not files or not config.is_file():
        return None
    h = hashlib.sha256(json.dumps(config_identity(json.loads(config.read_text())), sort_keys=True).encode())
    entries = []
    for path in files:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        entries += [(name, path, 8 + n, t) for name, t in header.items() if name != "__metadata__"]
    for name, path, data_start, t in sorted(entries, key=lambda e: e[0]):
        h.update(f"{name}|{tuple(t['shape'])}|{t['dtype']}|".encode())
        begin, end = t["data_offsets"]
        with path.open("rb") as f:
            f.seek(data_start + begin)
            left = end - begin
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise InputError(f"model.source: {path} ends inside tensor {name}; download or copy the "
                                     "model again")
                h.update(chunk)
                left -= len(chunk)
    return PREFIX + h.hexdigest()[:16]


def _hash_tensors(h: Any, model: Any) -> str:
    import torch

    for name, t in sorted(model.state_dict().items()):
        if not isinstance(t, torch.Tensor):
            continue
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        flat = t.detach().contiguous().cpu().reshape(-1)  # one tensor at a time
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()[:16]


def tensor_fingerprint(model: Any) -> str:
    """The fingerprint of a loaded model from its tensors (names, shapes, dtypes, bytes) and its config."""
    identity = config_identity(model.config.to_dict())
    return PREFIX + _hash_tensors(hashlib.sha256(json.dumps(identity, sort_keys=True).encode()), model)


def legacy_fingerprint(model: Any) -> str:
    """The fingerprint runs stored before ``v2-``: the full config JSON (install path and transformers version
    included) and the tensors."""
    return _hash_tensors(hashlib.sha256(model.config.to_json_string(use_diff=False).encode()), model)


def is_legacy(fingerprint: str) -> bool:
    return not fingerprint.startswith(PREFIX)


def run_fingerprint(current: str, stored: str | None, model: Any) -> str:
    """The fingerprint a run goes by: ``current``, or the run's ``stored`` one when it was written before ``v2-``
    and the old hash of this model gives it (the same weights, loaded from the same folder), so the study, its
    token sets and its caches stay valid. A model whose layers stream from CPU memory cannot be hashed the old
    way (its weights are not all in memory at once): one InputError."""
    if not stored or stored == current or not is_legacy(stored):
        return current
    if any(t.device.type == "meta" for t in model.state_dict().values()):
        raise InputError(f"this run's stored model fingerprint {stored} was made by an older advisor, which hashed "
                         "every weight in memory, and this model streams layers from CPU memory; continue it "
                         "without --gpu-memory on a GPU that holds the model, or start a new run with another --name")
    return stored if legacy_fingerprint(model) == stored else current
