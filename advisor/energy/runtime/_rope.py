"""RoPE tables of a decoder, computed by its family's own transformers rotary embedding."""

from __future__ import annotations

import importlib

import torch

from advisor.energy.runtime._dims import DEFAULT_ROPE, DecoderDims
from advisor.errors import UnsupportedError

#: text model_type -> (transformers module, rotary embedding class)
ROTARY_CLASSES = {
    "llama": ("llama", "LlamaRotaryEmbedding"),
    "mistral": ("mistral", "MistralRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": ("qwen3", "Qwen3RotaryEmbedding"),
    "gemma2": ("gemma2", "Gemma2RotaryEmbedding"),
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding"),
    "phi3": ("phi3", "Phi3RotaryEmbedding"),
    "mixtral": ("mixtral", "MixtralRotaryEmbedding"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeRotaryEmbedding"),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeRotaryEmbedding"),
}

RopeTables = dict[str, tuple[torch.Tensor, torch.Tensor]]


def rope_tables(dims: DecoderDims, max_pos: int, device: torch.device | str) -> RopeTables:
    """cos and sin [max_pos, head_dim // 2] (float32) per RoPE kind the layers use.

    The family's rotary embedding computes them (its RoPE type and scaling, attention
    scaling included), in float32 on the CPU as transformers does, then moved.
    """
    config = dims.hf_config()
    model_type = getattr(config, "model_type", "llama")
    if model_type not in ROTARY_CLASSES:
        raise UnsupportedError(f"no RoPE for model_type {model_type!r} in the measurement runtime")
    module, name = ROTARY_CLASSES[model_type]
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
