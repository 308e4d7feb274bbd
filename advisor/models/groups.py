"""A model's quantizable linears grouped as engines fuse them, and its shape for the energy side."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from advisor.errors import InputError
from advisor.models.shape import ModelShape
from advisor.plan import DENSE_GROUP_KINDS, LayerGroup

if TYPE_CHECKING:
    import torch

# Llama-family projection names; engines fuse q/k/v and gate/up into one GEMM each.
_LLAMA_ROLES = {
    "self_attn.q_proj": "qkv", "self_attn.k_proj": "qkv", "self_attn.v_proj": "qkv",
    "self_attn.o_proj": "o",
    "mlp.gate_proj": "gate_up", "mlp.up_proj": "gate_up",
    "mlp.down_proj": "down",
}
_LAYER_RE = re.compile(r"^(?P<prefix>.*\.layers)\.(?P<idx>\d+)\.(?P<role>.+)$")


def _linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    import torch

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            out[name] = module
    return out


def layer_groups(model: torch.nn.Module) -> tuple[LayerGroup, ...]:
    """Groups of quantizable linears: Llama-style fusion where names allow, else one per layer."""
    linears = _linear_modules(model)
    fused: dict[tuple[int, str], list[str]] = {}
    loose: list[str] = []
    for name in linears:
        m = _LAYER_RE.match(name)
        role = _LLAMA_ROLES.get(m["role"]) if m else None
        if m and role:
            fused.setdefault((int(m["idx"]), role), []).append(name)
        else:
            loose.append(name)
    groups = []
    for (idx, role), members in sorted(fused.items(), key=lambda kv: (kv[0][0], DENSE_GROUP_KINDS.index(kv[0][1]))):
        shapes = tuple((linears[n].in_features, linears[n].out_features) for n in members)
        groups.append(LayerGroup(f"layers.{idx}.{role}", tuple(members), shapes))
    for name in loose:
        lin = linears[name]
        groups.append(LayerGroup(name, (name,), ((lin.in_features, lin.out_features),)))
    if not groups:
        raise InputError("the model has no nn.Linear layers to quantize (lm_head excluded)")
    return tuple(groups)


def model_shape(model: torch.nn.Module) -> ModelShape:
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", 1)
    hidden = getattr(cfg, "hidden_size", 0)
    head_dim = getattr(cfg, "head_dim", None) or (hidden // heads if heads else 0)
    vocab = getattr(cfg, "vocab_size", 0)
    return ModelShape(
        groups=layer_groups(model),
        num_layers=getattr(cfg, "num_hidden_layers", 0),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=vocab,
        lm_head_weights=vocab * hidden,
    )
