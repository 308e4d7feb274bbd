"""RoPE tables of a decoder, computed by its family's own transformers rotary embedding (named by its adapter)."""

from __future__ import annotations

import importlib

import torch

from advisor.energy.runtime._dims import DEFAULT_ROPE, DecoderDims
from advisor.errors import UnsupportedError
from advisor.models.adapters import ADAPTERS

RopeTables = dict[str, tuple[torch.Tensor, torch.Tensor]]


def rope_tables(dims: DecoderDims, max_pos: int, device: torch.device | str) -> RopeTables:
    """cos and sin [max_pos, head_dim // 2] (float32) per RoPE kind the layers use.

    The family's rotary embedding computes them (its RoPE type and scaling, attention
    scaling included), in float32 on the CPU as transformers does, then moved.
    """
    config = dims.hf_config()
    model_type = getattr(config, "model_type", "llama")
    if model_type not in ADAPTERS:
        raise UnsupportedError(f"no RoPE for model_type {model_type!r} in the measurement runtime")
    module, name = ADAPTERS[model_type].rotary_embedding
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    rotary = cls(config)
    pos = torch.arange(max_pos)[None]
    x = torch.zeros(1, dtype=torch.float32)
    half = dims.head_dim // 2
    tables: RopeTables = {}
    for key in sorted({layer.attention.rope for layer in dims.layers}):
        with torch.no_grad():
            cos, sin = rotary(x, pos) if key == DEFAULT_ROPE else rotary(x, pos, key)
        if cos.shape[-1] != dims.head_dim:
            raise UnsupportedError(
                f"{dims.family}: RoPE covers {cos.shape[-1]} of {dims.head_dim} head dims (partial rotary)"
            )
        tables[key] = (
            cos[0, :, :half].float().contiguous().to(device),
            sin[0, :, :half].float().contiguous().to(device),
        )
    return tables
