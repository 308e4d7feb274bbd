"""The model config.json describes is the model its weights hold: checked from the safetensors headers in
milliseconds, before any weight is read.

transformers loads a checkpoint into the model its config builds: a layer the weights lack is initialised at
random, a tensor the model lacks is dropped, and both only warn. So a config that names 4 layers over weights of 2,
or a Qwen2 config (q/k/v biases) over Llama weights, would be searched as if they agreed. Here every tensor of the
text model the family's adapter expects is named with the shape the config gives it (per layer: attention,
biases, norms, MLP or routed experts in either checkpoint layout; the embeddings, final norm and an untied
lm_head), and no layer may hold a weight or bias the config's model has no place for. Tensors outside the text
model (a vision tower) are not judged. Weights transformers reads from pickles (``.bin``) or from a hub repository
not downloaded yet are not judged either: their shapes are not known before the load; nor are a pre-quantized
checkpoint's (a ``quantization_config``: its packed weights and scales follow its quantizer, not the adapter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.models.adapters import Adapter, adapter_for, layer_geometry, text_geometry
from advisor.models.adapters.registry import text_config
from advisor.models.safetensors_header import loaded_tensor_shapes
from advisor.models.shape import LayerGeometry

FIX = "give the config.json that came with these weights (or the weights of this config)"
#: buffers old checkpoints carry that transformers ignores
IGNORED = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    fields: str  # the config fields the shape (or the tensor's presence) comes from


def _roles(adapter: Adapter, kind: str) -> list[str]:
    return [r.path for r in adapter.roles if r.kind == kind and r.layout == "linear" and "*" not in r.path]


def _bias_field(adapter: Adapter) -> str:
    qb = adapter.qkv_bias
    return f"{qb} true" if isinstance(qb, str) else f"the {adapter.family} family biases q, k and v"


def _attention(g: LayerGeometry, adapter: Adapter) -> dict[str, Expected]:
    h, q, kv = g.hidden, g.heads * g.head_dim, g.kv_heads * g.head_dim
    qf, kvf = "num_attention_heads x head_dim, hidden_size", "num_key_value_heads x head_dim, hidden_size"
    qkv = _roles(adapter, "qkv")
    out: dict[str, Expected] = {}
    if len(qkv) == 1:  # pre-fused (Phi-3)
        out[f"{qkv[0]}.weight"] = Expected((q + 2 * kv, h), "(num_attention_heads + 2 num_key_value_heads) x "
                                           "head_dim, hidden_size")
    else:
        for path, rows, fields in zip(qkv, (q, kv, kv), (qf, kvf, kvf), strict=True):
            out[f"{path}.weight"] = Expected((rows, h), fields)
            if g.qkv_bias:
                out[f"{path}.bias"] = Expected((rows,), _bias_field(adapter))
    (o,) = _roles(adapter, "o")
    out[f"{o}.weight"] = Expected((h, q), "hidden_size, num_attention_heads x head_dim")
    if g.qkv_bias and adapter.o_bias_with_qkv:
        out[f"{o}.bias"] = Expected((h,), _bias_field(adapter))
    if g.qk_norm:
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            out[f"{norm}.weight"] = Expected((g.head_dim,), "head_dim")
    for norm in adapter.norm_modules.values():
        out[f"{norm}.weight"] = Expected((h,), "hidden_size")
    return out


def _dense_mlp(g: LayerGeometry, adapter: Adapter, mlp_bias: bool) -> dict[str, Expected]:
    h, i = g.hidden, g.intermediate
    gate_up, (down,) = _roles(adapter, "gate_up"), _roles(adapter, "down")
    out: dict[str, Expected] = {}
    for path in gate_up:
        rows = 2 * i if len(gate_up) == 1 else i  # pre-fused (Phi-3): gate and up stacked
        out[f"{path}.weight"] = Expected((rows, h), "intermediate_size, hidden_size")
        if mlp_bias:
            out[f"{path}.bias"] = Expected((rows,), "mlp_bias true")
    out[f"{down}.weight"] = Expected((h, i), "hidden_size, intermediate_size")
    if mlp_bias:
        out[f"{down}.bias"] = Expected((h,), "mlp_bias true")
    return out


def _moe_mlp(g: LayerGeometry, adapter: Adapter, fused: bool) -> dict[str, Expected]:
    h, e, m = g.hidden, g.num_experts, g.moe_intermediate
    ef, mf = adapter.experts_attr, adapter.moe_intermediate_attr or "intermediate_size"
    router = adapter.router_paths[0] if fused else adapter.router_paths[-1]
    out = {f"{router}.weight": Expected((e, h), f"{ef}, hidden_size")}
    fused_roles = [r for r in adapter.roles if r.layout == "fused_experts"]
    gate_up = next(r for r in fused_roles if r.path.endswith("gate_up_proj"))
    down = next(r for r in fused_roles if r.path.endswith("down_proj"))
    if fused:  # transformers 5's layout: one 3-D parameter per projection
        out[gate_up.path] = Expected((e, 2 * m, h), f"{ef}, 2 x {mf}, hidden_size")
        out[down.path] = Expected((e, h, m), f"{ef}, hidden_size, {mf}")
    else:  # one linear per expert, as checkpoints are saved
        for x in range(e):
            for path in gate_up.export:
                out[f"{path.format(e=x)}.weight"] = Expected((m, h), f"{mf}, hidden_size ({ef} experts)")
            for path in down.export:
                out[f"{path.format(e=x)}.weight"] = Expected((h, m), f"hidden_size, {mf} ({ef} experts)")
    if s := g.shared_expert_intermediate:
        sf = adapter.shared_expert_attr
        for path in _roles(adapter, "shared_gate_up"):
            out[f"{path}.weight"] = Expected((s, h), f"{sf}, hidden_size")
        for path in _roles(adapter, "shared_down"):
            out[f"{path}.weight"] = Expected((h, s), f"hidden_size, {sf}")
        out[f"{adapter.shared_expert_gate}.weight"] = Expected((1, h), f"{sf} > 0, hidden_size")
    return out


def layer_tensors(g: LayerGeometry, adapter: Adapter, mlp_bias: bool, fused_experts: bool) -> dict[str, Expected]:
    """Name (relative to the layer) -> the expected tensor, for one decoder layer."""
    mlp = _moe_mlp(g, adapter, fused_experts) if g.is_moe else _dense_mlp(g, adapter, mlp_bias)
    return {**_attention(g, adapter), **mlp}


def _text_prefix(config: Any, adapter: Adapter, names: set[str]) -> str | None:
    """Where the text model's tensors sit in the checkpoint ("model.", or a wrapper's either layout)."""
    stack = adapter.stack_for(getattr(config, "model_type", adapter.model_type))
    prefix = stack.layers.removesuffix("layers")
    old, new = stack.export_prefix
    candidates = [prefix, new + prefix[len(old):]] if old and prefix.startswith(old) else [prefix]
    for p in candidates:
        if any(n.startswith((f"{p}layers.", f"{p}embed_tokens.")) for n in names):
            return p
    return None


def check_weights_match(config: Any, shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """InputError naming the first tensor where ``shapes`` (the checkpoint's headers) and ``config`` disagree."""
    adapter = adapter_for(config)
    geo = text_geometry(config)
    at = f"model.source: {source}: config.json and the weights disagree"
    prefix = _text_prefix(config, adapter, set(shapes))
    if prefix is None:
        stack = adapter.stack_for(geo.outer_model_type).layers
        raise InputError(f"{at}: the weights hold no {stack}.* or embed_tokens tensors, so they are not the "
                         f"{adapter.family} model config.json describes; {FIX}")
    fused = any(".experts.gate_up_proj" in n for n in shapes)
    text = text_config(config)
    layers = [layer_tensors(g, adapter, bool(getattr(text, "mlp_bias", False)), fused) for g in layer_geometry(config)]
    found = _layer_names(shapes, prefix)
    _check_depth(layers, found, prefix, at)
    _check_outside_layers(geo, shapes, prefix, at)
    bias_off = {"self_attn.": adapter.qkv_bias, "mlp.": "mlp_bias" if hasattr(text, "mlp_bias") else None}
    for i, expected in enumerate(layers):
        _check_layer(expected, found.get(i, {}), f"{prefix}layers.{i}.", bias_off, at)


def _layer_names(shapes: dict[str, tuple[int, ...]], prefix: str) -> dict[int, dict[str, tuple[int, ...]]]:
    pattern = re.compile(rf"^{re.escape(prefix)}layers\.(\d+)\.(.+)$")
    found: dict[int, dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        if m := pattern.match(name):
            found.setdefault(int(m[1]), {})[m[2]] = shape
    return found


def _check_depth(layers: list[dict[str, Expected]], found: dict[int, Any], prefix: str, at: str) -> None:
    n = len(layers)
    extra = sorted(i for i in found if i >= n)
    if extra:
        name = f"{prefix}layers.{extra[0]}.{next(iter(found[extra[0]]))}"
        raise InputError(f"{at}: config.json says num_hidden_layers {n}, but the weights hold {max(found) + 1} layers; "
                         f"{name} belongs to no layer of the config's model; {FIX}")
    absent = [i for i in range(n) if i not in found]
    if absent:
        name = f"{prefix}layers.{absent[0]}.{next(iter(layers[absent[0]]))}"
        raise InputError(f"{at}: config.json says num_hidden_layers {n}, but the weights hold {len(found)} layers; "
                         f"{name} is missing (it would be initialised at random); {FIX}")


def _check_outside_layers(geo: Any, shapes: dict[str, tuple[int, ...]], prefix: str, at: str) -> None:
    embed = f"{prefix}embed_tokens.weight"
    head = next((n for n in ("lm_head.weight", f"{prefix.removesuffix('model.')}lm_head.weight") if n in shapes),
                "lm_head.weight")
    table = Expected((geo.vocab, geo.hidden), "vocab_size, hidden_size")
    expected = {embed: table, head: table, f"{prefix}norm.weight": Expected((geo.hidden,), "hidden_size")}
    if geo.tied_embeddings:  # one table serves both: a checkpoint holds either name, or both
        present = [n for n in (embed, head) if n in shapes]
        for name in [embed, head]:
            if name not in present and present:
                del expected[name]
    for name, want in expected.items():
        _compare(name, shapes.get(name), want, at)


def _compare(name: str, shape: tuple[int, ...] | None, want: Expected, at: str) -> None:
    if shape is None:
        raise InputError(f"{at}: {name} is missing from the weights, but the config's model has it ({want.fields}); "
                         f"it would be initialised at random; {FIX}")
    if tuple(shape) != want.shape:
        raise InputError(f"{at}: {name} is {list(shape)} in the weights, but config.json makes it {list(want.shape)} "
                         f"({want.fields}); {FIX}")


def _check_layer(expected: dict[str, Expected], found: dict[str, tuple[int, ...]], prefix: str,
                 bias_off: dict[str, Any], at: str) -> None:
    """``bias_off``: the config field that switches off the biases of the modules under each path prefix."""
    for rel, want in expected.items():
        _compare(prefix + rel, found.get(rel), want, at)
    for rel in found:
        if rel in expected or rel.endswith(IGNORED) or rel.rpartition(".")[2] not in ("weight", "bias"):
            continue  # a quantized checkpoint's scales sit beside their weights
        field = next((f for p, f in bias_off.items() if rel.startswith(p)), None)
        bias = rel.endswith(".bias") and rel.removesuffix(".bias") + ".weight" in expected
        why = f" (config.json gives it no bias: {field} false)" if bias and isinstance(field, str) else ""
        raise InputError(f"{at}: {prefix}{rel} is in the weights, but the model config.json describes has no such "
                         f"tensor{why}; it would be dropped; {FIX}")


def check_weights_agree(folder: Path, config: Any, source: str) -> None:
    """The headers of the safetensors transformers loads from ``folder`` against the model ``config`` describes
    (nothing for a hub id, ``.bin`` weights or a pre-quantized checkpoint). Never reads a weight."""
    if getattr(config, "quantization_config", None):  # a pre-quantized checkpoint names and packs its own way
        return
    shapes = loaded_tensor_shapes(folder, source) if folder.is_dir() else None
    if shapes is not None:
        check_weights_match(config, shapes, source)
