"""Architecture adapters: where each supported decoder family keeps its quantizable linears.

An :class:`Adapter` is plain data (no torch at import time), found by
``config.get_text_config().model_type`` (:func:`adapter_for`). Per family it declares:

* where the text decoder layers are (:class:`Stack`, chosen by the *outer*
  ``config.model_type``): ``model.layers`` for a causal LM, ``model.language_model.layers``
  for the Gemma-3 multimodal wrapper. Only that stack is searched, so groups are named
  ``layers.{i}.{kind}`` (``GroupInfo.stack`` keeps the prefix) and a vision tower's
  ``encoder.layers.N.self_attn.q_proj`` never joins a text group;
* the linear :class:`Role` s of a decoder layer and the group *kind* of each. A kind is
  what a serving engine runs as one GEMM: ``qkv`` (q/k/v, or Phi-3's pre-fused
  ``qkv_proj``), ``o``, ``gate_up`` (gate/up, or Phi-3's pre-fused ``gate_up_proj``),
  ``down``; for MoE ``experts`` (gate/up and down of all routed experts of a layer: fused-MoE
  kernels run them with one quantization mode, and ModelOpt 0.47 exports a fused-experts
  module with one format) and ``shared_gate_up`` / ``shared_down`` (Qwen2-MoE's shared expert);
* what is never quantized (fnmatch patterns on module names): norms, embeddings,
  ``lm_head``, routers (``mlp.gate``) and the shared-expert gate, vision tower, projector;
* how the checkpoint written by ``export_hf_checkpoint`` names each member
  (transformers 5 saves in the legacy layout: ``language_model.model.layers`` for
  Gemma-3, per-expert ``experts.{e}.gate_proj`` / Mixtral ``block_sparse_moe.experts.{e}.w1``);
* how to read each layer's attention/MLP geometry from the text config.

Member names. An ``nn.Linear`` member is its module name. A member of a transformers-5
fused-experts module (``MixtralExperts``/``Qwen2MoeExperts``/``Qwen3MoeExperts``: 3-D
``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]`` parameters) is the parameter's
name, ``model.layers.0.mlp.experts.gate_up_proj``; its entry in ``LayerGroup.shapes`` is
``(in, E * out)``, so ``num_weights`` is exact and ``in_features`` right. ModelOpt 0.47
wraps such a module as ``_QuantFusedExperts`` with quantizers
``gate_up_proj_input_quantizer`` (shared by all experts) and
``gate_up_proj_weight_quantizers.{e}``; its config matcher folds
``..._weight_quantizers.{e}`` to ``..._weight_quantizer``, hence :func:`member_quantizers`.
"""

from advisor.models.adapters.discovery import discover_groups, group_infos, member_quantizers, quant_cfg_entries
from advisor.models.adapters.geometry import expected_group_shapes, layer_geometry, model_shape, text_geometry
from advisor.models.adapters.registry import ADAPTERS, SUPPORTED_MODEL_TYPES, adapter_for, check_causal_lm
from advisor.models.adapters.types import (
    KIND_ORDER,
    NORM_MODULES,
    ROUTED_KINDS,
    SHARED_INPUT_KINDS,
    Adapter,
    GroupInfo,
    LayerGeometry,
    Role,
    Stack,
    TextGeometry,
    UnsupportedArchitectureError,
)

__all__ = [
    "ADAPTERS", "KIND_ORDER", "NORM_MODULES", "ROUTED_KINDS", "SHARED_INPUT_KINDS", "SUPPORTED_MODEL_TYPES", "Adapter",
    "GroupInfo", "LayerGeometry", "Role", "Stack", "TextGeometry", "UnsupportedArchitectureError", "adapter_for",
    "check_causal_lm", "discover_groups", "expected_group_shapes", "group_infos", "layer_geometry",
    "member_quantizers", "model_shape", "quant_cfg_entries", "text_geometry",
]
