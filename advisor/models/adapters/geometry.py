"""Per-layer attention/MLP geometry from a text config, and the model shape for the energy side."""

from __future__ import annotations

from typing import Any

from advisor.models.adapters.discovery import discover_groups, expert_routing
from advisor.models.adapters.registry import adapter_for, text_config
from advisor.models.adapters.types import Adapter, TextGeometry
from advisor.models.shape import LayerGeometry, ModelShape

# ----------------------------------------------------------------------------- geometry


def _layer_is_moe(text: Any, adapter: Adapter, idx: int) -> bool:
    if not adapter.moe or idx in (getattr(text, "mlp_only_layers", None) or []):
        return False
    step = getattr(text, "decoder_sparse_step", 1) or 1
    return int(getattr(text, adapter.experts_attr, 0) or 0) > 0 and (idx + 1) % step == 0


def _sliding(text: Any, adapter: Adapter, idx: int) -> int | None:
    window = getattr(text, "sliding_window", None) or None  # qwen2_moe stores 0 for "off"
    if window is None:
        return None
    types = getattr(text, "layer_types", None)
    if types is not None:
        return window if types[idx] == "sliding_attention" else None
    if adapter.sliding_pattern:  # Gemma configs written before layer_types existed
        pattern = int(getattr(text, "sliding_window_pattern", None) or adapter.sliding_pattern)
        return window if (idx + 1) % pattern else None
    if getattr(text, "use_sliding_window", True) is False:
        return None
    return window  # mistral / mixtral / phi3 / qwen3_moe: one window for every layer


def layer_geometry(config: Any) -> list[LayerGeometry]:
    """Per-layer geometry of the text model, from its config alone."""
    adapter = adapter_for(config)
    text = text_config(config)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    qb = adapter.qkv_bias
    bias = qb if isinstance(qb, bool) else bool(getattr(text, qb, False))
    act = str(getattr(text, adapter.activation_attr, None) or getattr(text, "hidden_act", ""))
    experts, top_k = expert_routing(config, adapter)
    moe_inter = int(getattr(text, adapter.moe_intermediate_attr or "intermediate_size"))
    shared = int(getattr(text, adapter.shared_expert_attr, 0) or 0) if adapter.shared_expert_attr else 0
    out = []
    for i in range(int(text.num_hidden_layers)):
        moe = _layer_is_moe(text, adapter, i)
        out.append(LayerGeometry(
            index=i, hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim,
            sliding_window=_sliding(text, adapter, i), qk_norm=adapter.qk_norm, qkv_bias=bias, activation=act,
            norms=adapter.norms_per_layer, intermediate=0 if moe else int(text.intermediate_size),
            num_experts=experts if moe else 0, top_k=top_k if moe else 0,
            moe_intermediate=moe_inter if moe else 0, shared_expert_intermediate=shared if moe else 0,
        ))
    return out


def text_geometry(config: Any) -> TextGeometry:
    adapter = adapter_for(config)
    text = text_config(config)
    tied = getattr(config, "tie_word_embeddings", None)
    if tied is None:
        tied = getattr(text, "tie_word_embeddings", False)
    return TextGeometry(
        model_type=adapter.model_type, outer_model_type=getattr(config, "model_type", adapter.model_type),
        family=adapter.family, layers=tuple(layer_geometry(config)), vocab=int(text.vocab_size),
        hidden=int(text.hidden_size), tied_embeddings=bool(tied),
    )


def expected_group_shapes(config: Any) -> dict[str, tuple[tuple[int, int], ...]]:
    """Group name -> member shapes the config implies (to check discovery against geometry)."""
    adapter = adapter_for(config)
    pre_fused = any(r.path == "self_attn.qkv_proj" for r in adapter.roles)
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    for g in layer_geometry(config):
        p = f"layers.{g.index}"
        q, kv = g.heads * g.head_dim, g.kv_heads * g.head_dim
        out[f"{p}.qkv"] = ((g.hidden, q + 2 * kv),) if pre_fused else ((g.hidden, q), (g.hidden, kv), (g.hidden, kv))
        out[f"{p}.o"] = ((q, g.hidden),)
        if not g.is_moe:
            i = g.intermediate
            out[f"{p}.gate_up"] = ((g.hidden, 2 * i),) if pre_fused else ((g.hidden, i), (g.hidden, i))
            out[f"{p}.down"] = ((i, g.hidden),)
            continue
        if g.shared_expert_intermediate:
            s = g.shared_expert_intermediate
            out[f"{p}.shared_gate_up"] = ((g.hidden, s), (g.hidden, s))
            out[f"{p}.shared_down"] = ((s, g.hidden),)
        e, m = g.num_experts, g.moe_intermediate
        out[f"{p}.experts"] = ((g.hidden, e * 2 * m), (m, e * g.hidden))
    return out


def model_shape(model: Any) -> ModelShape:
    """The model's :class:`ModelShape`: its groups and the per-layer geometry of its text config."""
    geo = text_geometry(model.config)
    first = geo.layers[0]
    return ModelShape(
        groups=tuple(discover_groups(model)),
        num_layers=geo.num_layers, hidden_size=geo.hidden, num_attention_heads=first.heads,
        num_kv_heads=first.kv_heads, head_dim=first.head_dim, vocab_size=geo.vocab,
        lm_head_weights=geo.vocab * geo.hidden, layers=geo.layers, model_type=geo.model_type,
        outer_model_type=geo.outer_model_type, family=geo.family, tied_embeddings=geo.tied_embeddings,
    )
