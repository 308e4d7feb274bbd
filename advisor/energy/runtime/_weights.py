"""A decoder's weights in the runtime's fused layout: random (energy) or copied from a HF model (checks).

Layout, per layer ``i``: ``{i}.qkv`` [(H + 2 KV) D, hidden] (q, k, v stacked, as Phi-3's
``qkv_proj``), ``{i}.gate_up`` [2 I, hidden] (gate then up, as Phi-3's ``gate_up_proj``),
``{i}.o``, ``{i}.down``, optional ``{i}.qkv_bias`` / ``{i}.o_bias``, ``{i}.q_norm`` /
``{i}.k_norm``; norms ``{i}.ln_attn`` (before attention), ``{i}.ln_mlp`` (before the
MLP), and for Gemma ``{i}.ln_attn_out`` / ``{i}.ln_mlp_out`` (after them). Gemma's norm
weights are stored as float32 ``1 + w`` (the kernels multiply by them in float32); its
embedding table is stored pre-multiplied by sqrt(hidden) in BF16, which is exactly
what its scaled embedding computes, while a tied lm_head keeps the unscaled table.
A MoE layer has ``{i}.router`` [E, hidden] and ``{i}.experts_gate_up`` [E, 2 I, hidden] /
``{i}.experts_down`` [E, hidden, I] (transformers 5's fused-experts layout) instead of
``{i}.gate_up`` / ``{i}.down``, and with a shared expert ``{i}.shared_gate_up`` /
``{i}.shared_down`` and its output gate ``{i}.shared_gate`` [1, hidden].
"""

from __future__ import annotations

from typing import Any

import torch

from advisor.energy.meter import require_gpu
from advisor.energy.runtime._dims import DecoderDims
from advisor.energy.runtime._rope import RopeTables, rope_tables
from advisor.errors import SetupError
from advisor.models.adapters import NORM_MODULES

#: the runtime's norms of a layer, per norm count (the family's module names: its adapter's ``norm_modules``)
_NORMS = {n: tuple(names) for n, names in NORM_MODULES.items()}


class DecoderWeights:
    """BF16 weights of a dense decoder in fused layout, plus RoPE tables for ``max_pos`` positions."""

    def __init__(self, dims: DecoderDims, tensors: dict[str, torch.Tensor], max_pos: int) -> None:
        self.dims, self.t = dims, tensors
        self.device = tensors["embed"].device
        self.max_pos = 0
        self.rope: RopeTables = {}
        self.ensure_positions(max_pos)

    def ensure_positions(self, n: int) -> None:
        """RoPE tables covering positions [0, n) (grown, never shrunk)."""
        if n > self.max_pos:
            self.rope = rope_tables(self.dims, n, self.device)
            self.max_pos = n

    @classmethod
    def random(
        cls, dims: DecoderDims, max_pos: int = 8192, seed: int = 0, std: float = 0.02, device: Any = None
    ) -> DecoderWeights:
        """Random weights of ``dims``'s shapes (normal, ``std``); no hub, no HF init. A decode step's energy
        hardly depends on their values, a prefill's somewhat (reports/benchmarks/layer_additivity.md)."""
        dev = torch.device(device) if device is not None else require_gpu()
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=dev, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)

        def ones(n: int) -> torch.Tensor:
            # Gemma stores w with the norm scaling by 1 + w: w = 0 is the identity, as ones are for Llama
            return torch.zeros(n, device=dev) if dims.gemma_norms else torch.ones(n, device=dev)

        d = dims
        embed = rnd(d.vocab, d.hidden)
        t: dict[str, torch.Tensor] = {"embed": embed, "norm": ones(d.hidden)}
        t["lm_head"] = embed if d.tied_embeddings else rnd(d.vocab, d.hidden)
        for i, layer in enumerate(d.layers):
            a = layer.attention
            t[f"{i}.qkv"] = rnd((a.heads + 2 * a.kv_heads) * a.head_dim, d.hidden)
            t[f"{i}.o"] = rnd(d.hidden, a.heads * a.head_dim)
            if layer.moe is not None:
                e, inter = layer.moe.num_experts, layer.moe.intermediate
                t[f"{i}.router"] = rnd(e, d.hidden)
                t[f"{i}.experts_gate_up"] = torch.cat([rnd(1, 2 * inter, d.hidden) for _ in range(e)])
                t[f"{i}.experts_down"] = torch.cat([rnd(1, d.hidden, inter) for _ in range(e)])
                if layer.shared_intermediate:
                    t[f"{i}.shared_gate_up"] = rnd(2 * layer.shared_intermediate, d.hidden)
                    t[f"{i}.shared_down"] = rnd(d.hidden, layer.shared_intermediate)
                    t[f"{i}.shared_gate"] = rnd(1, d.hidden)
            else:
                t[f"{i}.gate_up"] = rnd(2 * layer.intermediate, d.hidden)
                t[f"{i}.down"] = rnd(d.hidden, layer.intermediate)
            if a.qkv_bias:
                t[f"{i}.qkv_bias"] = rnd((a.heads + 2 * a.kv_heads) * a.head_dim)
            if a.o_bias:
                t[f"{i}.o_bias"] = rnd(d.hidden)
            if a.qk_norm:
                t[f"{i}.q_norm"] = ones(a.head_dim)
                t[f"{i}.k_norm"] = ones(a.head_dim)
            for name in _NORMS[layer.norms]:
                t[f"{i}.{name}"] = ones(d.hidden)
        return cls._finish(d, t, max_pos)

    @classmethod
    def from_hf(cls, model: Any, max_pos: int = 4096, device: Any = None, dims: DecoderDims | None = None):
        """Fused copies of a loaded HF model's weights (to check the runtime against that model), read where the
        family's adapter names them: each group kind's members concatenated in role order (q, k, v; gate, up),
        routed experts from their fused 3-D parameters."""
        from advisor.models.adapters import adapter_for

        config = model.config
        dims = dims or DecoderDims.from_config(config)
        dev = torch.device(device) if device is not None else require_gpu()
        adapter = adapter_for(config)
        stack = adapter.stack_for(getattr(config, "model_type", dims.model_type)).layers
        text = model.get_submodule(stack.rsplit(".", 1)[0])
        bf = lambda x: x.detach().to(dev, torch.bfloat16).contiguous()  # noqa: E731
        members = {kind: [r.path for r in adapter.roles
                          if r.kind == kind and r.layout == "linear" and "*" not in r.path]
                   for kind in ("qkv", "o", "gate_up", "down", "shared_gate_up", "shared_down")}
        fused = {r.path.rsplit(".", 1)[-1]: r.path for r in adapter.roles if r.layout == "fused_experts"}
        t = {"embed": bf(text.embed_tokens.weight), "norm": text.norm.weight}
        t["lm_head"] = bf(model.get_output_embeddings().weight)
        for i, layer in enumerate(text.layers):
            spec = dims.layers[i]
            linears = {kind: [layer.get_submodule(p) for p in paths if _has(layer, p)]
                       for kind, paths in members.items()}
            t[f"{i}.qkv"] = bf(torch.cat([m.weight for m in linears["qkv"]]))
            if spec.attention.qkv_bias:
                t[f"{i}.qkv_bias"] = bf(torch.cat([m.bias for m in linears["qkv"]]))
            if spec.moe is not None:  # transformers 5's fused experts: [E, 2I, hidden], [E, hidden, I]
                router = next(layer.get_submodule(p) for p in adapter.router_paths if _has(layer, p))
                t[f"{i}.router"] = bf(router.weight)
                t[f"{i}.experts_gate_up"] = bf(layer.get_parameter(fused["gate_up_proj"]))
                t[f"{i}.experts_down"] = bf(layer.get_parameter(fused["down_proj"]))
                if spec.shared_intermediate:  # Qwen2-MoE
                    t[f"{i}.shared_gate_up"] = bf(torch.cat([m.weight for m in linears["shared_gate_up"]]))
                    t[f"{i}.shared_down"] = bf(linears["shared_down"][0].weight)
                    t[f"{i}.shared_gate"] = bf(layer.get_submodule(adapter.shared_expert_gate).weight)
            else:
                t[f"{i}.gate_up"] = bf(torch.cat([m.weight for m in linears["gate_up"]]))
                t[f"{i}.down"] = bf(linears["down"][0].weight)
            t[f"{i}.o"] = bf(linears["o"][0].weight)
            if spec.attention.o_bias:
                t[f"{i}.o_bias"] = bf(linears["o"][0].bias)
            if spec.attention.qk_norm:
                t[f"{i}.q_norm"], t[f"{i}.k_norm"] = layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight
            for name, module in adapter.norm_modules.items():
                t[f"{i}.{name}"] = getattr(layer, module).weight
        return cls._finish(dims, t, max_pos)

    @classmethod
    def _finish(cls, dims: DecoderDims, t: dict[str, torch.Tensor], max_pos: int) -> DecoderWeights:
        """Norm weights in the kernels' form; the embedding pre-scaled where the family scales it."""
        dev = t["embed"].device
        for key in list(t):
            if key == "norm" or key.rsplit(".", 1)[-1] in ("q_norm", "k_norm", *_NORMS[4]):
                t[key] = _norm_weight(t[key], dims.gemma_norms, dev)
        if dims.embed_scale != 1.0:
            scale = torch.tensor(dims.embed_scale, dtype=torch.bfloat16, device=dev)
            t["embed"] = t["embed"] * scale  # BF16 * BF16, as Gemma's scaled embedding
        missing = [k for k in ("embed", "lm_head", "norm", "0.qkv") if k not in t]
        if missing:
            raise SetupError(f"weights lack {missing}")
        return cls(dims, t, max_pos)


def _norm_weight(w: torch.Tensor, gemma: bool, device: torch.device) -> torch.Tensor:
    """A norm weight as the kernels take it: BF16 w, or float32 1 + w for Gemma."""
    if gemma:
        return (1.0 + w.detach().float()).to(device).contiguous()
    return w.detach().to(device, torch.bfloat16).contiguous()


def _has(module: Any, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
