"""Measure a MoE model's real routing on token sets: each layer's per-expert load.

A forward hook on every router (``mlp.gate`` of Qwen-MoE and transformers-5 Mixtral,
``block_sparse_moe.gate`` of transformers-4 Mixtral) reads its logits and counts the
``top_k`` experts each token chooses (the top-k of the logits is the top-k of the
softmax). A layer's load is the count per expert over the tokens seen: each expert's
probability of being chosen by one token, summing to ``top_k``. The energy models turn it
into the expected number of distinct experts a batch touches (:mod:`advisor.energy.prediction._routing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from advisor.models.shape import ModelShape

if TYPE_CHECKING:
    import torch



def _router_logits(output: Any) -> torch.Tensor:
    """The logits of a router's output: a tensor (an nn.Linear gate) or the first item of a tuple."""
    return output[0] if isinstance(output, tuple) else output


def _decoder_layers(model: Any) -> tuple[Any, tuple[str, ...]]:
    """The model's decoder layers and where its family keeps a layer's router."""
    from advisor.models.adapters import adapter_for

    adapter = adapter_for(model.config)
    stack = adapter.stack_for(getattr(model.config, "model_type", "")).layers
    return model.get_submodule(stack), adapter.router_paths


def expert_load(model: Any, shape: ModelShape, tokens: torch.Tensor,
                batch_size: int = 8) -> dict[int, tuple[float, ...]]:
    """Per MoE layer index, each expert's share of ``tokens`` [N, L] choosing it (sums to top_k)."""
    import torch

    layers, router_paths = _decoder_layers(model)
    counts: dict[int, torch.Tensor] = {}
    seen: dict[int, int] = {}
    handles = []
    for geo in shape.layers:
        if not geo.is_moe:
            continue
        layer = layers[geo.index]
        router = next((layer.get_submodule(p) for p in router_paths if _has(layer, p)), None)
        if router is None:
            raise ValueError(f"layer {geo.index} is a MoE layer without a router at {' or '.join(router_paths)}")
        counts[geo.index] = torch.zeros(geo.num_experts, dtype=torch.float64)
        seen[geo.index] = 0

        def hook(_mod, _inp, out, i=geo.index, k=geo.top_k):
            logits = _router_logits(out).reshape(-1, counts[i].numel())
            chosen = logits.float().topk(k, dim=-1).indices.reshape(-1).cpu()
            counts[i] += torch.bincount(chosen, minlength=counts[i].numel()).double()
            seen[i] += logits.shape[0]

        handles.append(router.register_forward_hook(hook))
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for s in range(0, tokens.shape[0], batch_size):
                model(input_ids=tokens[s:s + batch_size].to(device))
    finally:
        for h in handles:
            h.remove()
    return {i: tuple((c / max(seen[i], 1)).tolist()) for i, c in counts.items()}


def with_measured_routing(model: Any, shape: ModelShape, tokens: torch.Tensor) -> ModelShape:
    """``shape`` with the routing of ``tokens`` on its MoE layers (unchanged for a dense model)."""
    if not shape.is_moe:
        return shape
    return shape.with_expert_load(expert_load(model, shape, tokens))


def _has(module: Any, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
