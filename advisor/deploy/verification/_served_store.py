"""Each plan's vLLM serving kept in ``RUN_DIR/verify_served/<plan id>.json`` the moment it finishes, and read
back by a later ``advisor verify`` of the same job: a verify cut off after its second engine (a lent GPU's time
ran out, the process was killed) starts again at its third. A serving is read back only where everything that
shapes it is the same: the job (checkpoint, workloads, tokens, meter), the engine's version, the GPU and
their count; the memory share an engine got (what the GPU had free), its KV pool's size, whether it started during
the exports and which unit of the node served it do not count."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from advisor.deploy.vllm import ServeJob

FOLDER = "verify_served"


def serving_key(job: ServeJob, vllm_version: str, gpu: str, searched: bool) -> str:
    """What makes two servings the same, hashed."""
    fields = {k: v for k, v in asdict(job).items()
              if k not in ("gpu_memory_utilization", "devices", "hold", "kv_cache_bytes")}
    whole = {"job": fields, "vllm": vllm_version, "gpu": gpu, "searched": searched}
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_serving(run_dir: Path, plan_id: str, key: str) -> dict[str, Any] | None:
    """The stored serving of ``plan_id`` with ``key``; None where there is none, it is another job's, or the
    file is torn (a write cut off)."""
    path = Path(run_dir) / FOLDER / f"{plan_id}.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("served"), dict):
        return None
    return stored["served"] | {"read_back_from": str(path), "served_at": stored.get("served_at")}


def write_serving(run_dir: Path, plan_id: str, key: str, served: dict[str, Any]) -> Path:
    """``served`` kept for ``plan_id`` (written whole, then renamed: a cut-off write leaves the old file)."""
    folder = Path(run_dir) / FOLDER
    folder.mkdir(exist_ok=True)
    path = folder / f"{plan_id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"key": key, "served_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "served": served}))
    tmp.replace(path)
    return path
