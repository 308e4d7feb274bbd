"""Each measured plan exported once for an engine to serve (``RUN_DIR/engine_checkpoints/<plan id>``); the all-BF16
plan of a model whose own folder is already a BF16 checkpoint is served from that folder (:func:`bf16_source`)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.formats import Format
from advisor.models.safetensors_header import tensor_dtypes
from advisor.plan import Plan

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def bf16_source(folder: str | Path) -> Path | None:
    """``folder`` where an engine can serve it as the all-BF16 plan as it is: a model folder whose config.json says
    bfloat16 and names no quantization, whose .safetensors files hold BF16 tensors only, and which carries its
    tokenizer. Exporting all-BF16 would write the same weights again (16 GB for an 8B, 28 s on an H200; 140 GB for
    a 70B). None otherwise."""
    path = Path(folder)
    try:
        config = json.loads((path / "config.json").read_text())
        shards = sorted(path.glob("*.safetensors"))
        dtypes = set().union(*(tensor_dtypes(s) for s in shards)) if shards else set()
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    quantized = "quantization_config" in config or (path / "hf_quant_config.json").exists()
    tokenizer = any((path / name).is_file() for name in TOKENIZER_FILES)
    if dtype == "bfloat16" and not quantized and tokenizer and dtypes == {"BF16"}:
        return path
    return None


def bf16_served_as_is(recipe: Any) -> Path | None:
    """The recipe's model folder where its all-BF16 plan is served from it as it is (:func:`bf16_source`; a local
    folder, not a hub id or a GGUF file); None where all-BF16 is exported like any plan."""
    source = str(getattr(getattr(recipe, "model", None), "source", "") or "")
    if not source or source.endswith(".gguf") or getattr(recipe.model, "gguf_file", None):
        return None
    path = Path(source).expanduser()
    return bf16_source(path) if path.is_dir() else None


def folder_serving(plan: Plan, as_is: Path | None) -> Path | None:
    """``as_is`` (:func:`bf16_served_as_is`) where it serves ``plan``: all-BF16 weights and a BF16 KV cache."""
    return as_is if as_is is not None and plan.uniform_format() is Format.BF16 else None


def checkpoint_exporter(recipe: Any, loaded: Any, tokens: Any, smoke: bool = False,
                        on_reloaded: Callable[[Plan, Any], None] | None = None) -> Callable[[Plan], Path]:
    """``plan -> folder``: the plan exported once (``advisor export``'s code) into
    ``RUN_DIR/engine_checkpoints/<plan id>``, reused when its export finished before; all-BF16 (BF16 KV cache too)
    is the model's own folder where :func:`bf16_source` takes it. ``on_reloaded`` sees each plan exported here and
    the model its round trip reloaded."""
    from advisor.deploy.checkpoint._export import export_plan

    folder = Path(recipe.run_dir) / "engine_checkpoints"
    workloads = [w.model_dump() for w in recipe.workloads]
    as_is = bf16_served_as_is(recipe)

    def checkpoint_for(plan: Plan) -> Path:
        served = folder_serving(plan, as_is)
        if served is not None:
            return served
        out = folder / plan.id
        if not (out / "export.json").is_file():
            if out.exists():  # what an interrupted export of this run left
                shutil.rmtree(out)
            export_plan(loaded, plan, tokens, out, workloads, target=recipe.target.value, smoke=smoke,
                        on_reloaded=None if on_reloaded is None else lambda model: on_reloaded(plan, model))
        return out

    return checkpoint_for
