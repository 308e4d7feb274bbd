"""A loaded model's layer groups and shape, through its family's adapter (:mod:`advisor.models.adapters`).

Groups are ``layers.{i}.{kind}`` for the text decoder stack of every supported family
(docs/architecture.md, "Layer groups"). A model whose family has no adapter raises
:class:`advisor.errors.UnsupportedArchitectureError` (exit code 2).
"""

from __future__ import annotations

from typing import Any

from advisor.models.adapters import GroupInfo, adapter_for, group_infos, model_shape
from advisor.plan import LayerGroup

__all__ = ["decoder_layers_path", "group_table", "layer_groups", "model_shape", "use_eager_experts"]


def group_table(model: Any) -> list[GroupInfo]:
    """Every searched group with its members, ModelOpt quantizer names and exported names."""
    return group_infos(model)


def layer_groups(model: Any) -> tuple[LayerGroup, ...]:
    return tuple(gi.group for gi in group_infos(model))


def decoder_layers_path(model: Any) -> str:
    """Dotted path of the searched decoder-layer list (``model.layers``; the text stack of a wrapper)."""
    return adapter_for(model.config).stack_for(model.config.model_type).layers


def use_eager_experts(model: Any) -> None:
    """Run transformers-5 fused MoE experts with the eager per-expert loop.

    ModelOpt's ``_QuantFusedExperts`` quantizes through ``F.linear`` and switches the model
    it quantizes to ``eager``; the BF16 reference and every copy must run the same kernel,
    or the proxy KL would include grouped_mm-vs-eager rounding differences.
    """
    if adapter_for(model.config).moe and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
