"""The supported families, and finding the adapter of a model from its config."""

from __future__ import annotations

from typing import Any

from advisor.models.adapters.types import Adapter, Role, Stack, UnsupportedArchitectureError

# ----------------------------------------------------------------------------- the registry

_ATTN = (
    Role("self_attn.q_proj", "qkv"),
    Role("self_attn.k_proj", "qkv"),
    Role("self_attn.v_proj", "qkv"),
    Role("self_attn.o_proj", "o"),
)
_MLP = (Role("mlp.gate_proj", "gate_up"), Role("mlp.up_proj", "gate_up"), Role("mlp.down_proj", "down"))
# One group per layer for all routed experts, gate/up and down together: fused-MoE kernels
# (TensorRT-LLM, vLLM) run a layer's experts with one quantization mode, and ModelOpt 0.47
# exports a fused-experts module with one format (a BF16 down_proj next to FP8 gate_up_proj
# is written BF16 but not excluded: tests/test_adapters.py keeps a canary).
_QWEN_FUSED_EXPERTS = (
    Role("mlp.experts.gate_up_proj", "experts", "fused_experts",
         ("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj")),
    Role("mlp.experts.down_proj", "experts", "fused_experts", ("mlp.experts.{e}.down_proj",)),
)
_MIXTRAL_FUSED_EXPERTS = (
    Role("mlp.experts.gate_up_proj", "experts", "fused_experts",
         ("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3")),
    Role("mlp.experts.down_proj", "experts", "fused_experts", ("block_sparse_moe.experts.{e}.w2",)),
)
# transformers 4.x per-expert ModuleLists (declared, not testable next to transformers 5 here)
_QWEN_EXPERTS_V4 = (
    Role("mlp.experts.*.gate_proj", "experts"),
    Role("mlp.experts.*.up_proj", "experts"),
    Role("mlp.experts.*.down_proj", "experts"),
)
_MIXTRAL_EXPERTS_V4 = (
    Role("block_sparse_moe.experts.*.w1", "experts"),
    Role("block_sparse_moe.experts.*.w3", "experts"),
    Role("block_sparse_moe.experts.*.w2", "experts"),
)
_SHARED_EXPERT = (
    Role("mlp.shared_expert.gate_proj", "shared_gate_up"),
    Role("mlp.shared_expert.up_proj", "shared_gate_up"),
    Role("mlp.shared_expert.down_proj", "shared_down"),
)
_NEVER = ("lm_head", "*embed_tokens", "*norm", "*rotary_emb")
_ROUTERS = ("*.mlp.gate", "*.block_sparse_moe.gate", "*.mlp.shared_expert_gate")


def _lm(model_type: str) -> dict[str, Stack]:
    return {model_type: Stack("model.layers")}


def _rotary(module: str, cls: str) -> tuple[str, str]:
    return module, f"{cls}RotaryEmbedding"


def _dense(model_type: str, family: str, rotary: str, **kw: Any) -> Adapter:
    return Adapter(model_type, family, _ATTN + _MLP, _lm(model_type), _NEVER,
                   rotary_embedding=_rotary(model_type, rotary), **kw)


def _moe(model_type: str, family: str, roles: tuple[Role, ...], rotary: str, **kw: Any) -> Adapter:
    return Adapter(model_type, family, roles, _lm(model_type), _NEVER + _ROUTERS, routers=_ROUTERS, moe=True,
                   rotary_embedding=_rotary(model_type, rotary), **kw)


ADAPTERS: dict[str, Adapter] = {
    a.model_type: a
    for a in (
        _dense("llama", "Llama 3.x", "Llama", qkv_bias="attention_bias", llama_like=True),
        _dense("mistral", "Mistral", "Mistral", llama_like=True),
        _dense("qwen2", "Qwen2 / Qwen2.5", "Qwen2", qkv_bias=True, o_bias_with_qkv=False, llama_like=True),
        _dense("qwen3", "Qwen3", "Qwen3", qk_norm=True, qkv_bias="attention_bias"),
        _dense("gemma2", "Gemma 2", "Gemma2", activation_attr="hidden_activation", norms_per_layer=4,
               qkv_bias="attention_bias", sliding_pattern=2, gemma_norms=True),
        Adapter(
            "gemma3_text", "Gemma 3", _ATTN + _MLP,
            {
                "gemma3_text": Stack("model.layers"),
                "gemma3": Stack("model.language_model.layers", ("model.vision_tower*", "model.multi_modal_projector*"),
                                ("model.language_model.", "language_model.model.")),
            },
            _NEVER, activation_attr="hidden_activation", norms_per_layer=4, qk_norm=True,
            qkv_bias="attention_bias", sliding_pattern=6,
            causal_lm_classes=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
            rotary_embedding=_rotary("gemma3", "Gemma3"), gemma_norms=True,
        ),
        Adapter(
            "phi3", "Phi-3 / Phi-4",
            (Role("self_attn.qkv_proj", "qkv"), Role("self_attn.o_proj", "o"),
             Role("mlp.gate_up_proj", "gate_up"), Role("mlp.down_proj", "down")),
            _lm("phi3"), _NEVER, rotary_embedding=_rotary("phi3", "Phi3"),
        ),
        _moe("mixtral", "Mixtral", _ATTN + _MIXTRAL_FUSED_EXPERTS + _MIXTRAL_EXPERTS_V4, "Mixtral",
             experts_attr="num_local_experts", router_paths=("mlp.gate", "block_sparse_moe.gate")),
        _moe("qwen3_moe", "Qwen3-MoE", _ATTN + _MLP + _QWEN_FUSED_EXPERTS + _QWEN_EXPERTS_V4, "Qwen3Moe",
             qk_norm=True, qkv_bias="attention_bias", moe_intermediate_attr="moe_intermediate_size"),
        _moe("qwen2_moe", "Qwen2-MoE", _ATTN + _MLP + _QWEN_FUSED_EXPERTS + _QWEN_EXPERTS_V4 + _SHARED_EXPERT,
             "Qwen2Moe", qkv_bias="qkv_bias", moe_intermediate_attr="moe_intermediate_size",
             shared_expert_attr="shared_expert_intermediate_size", o_bias_with_qkv=False),
    )
}

SUPPORTED_MODEL_TYPES = tuple(sorted(ADAPTERS))


# ----------------------------------------------------------------------------- lookup


def text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _non_causal_reason(config: Any) -> str | None:
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    archs = getattr(config, "architectures", None) or []
    heads = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
    if archs and not any(a.endswith(heads) for a in archs):
        return f"its architectures {archs} have no causal-LM head"
    return None


def adapter_for(config: Any) -> Adapter:
    """The adapter of a transformers config (outer or text config)."""
    text = text_config(config)
    mt = getattr(text, "model_type", None)
    adapter = ADAPTERS.get(mt)
    if adapter is None:
        raise UnsupportedArchitectureError(
            f"model_type {mt!r} is not supported; supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    reason = _non_causal_reason(config)
    if reason:
        raise UnsupportedArchitectureError(f"model_type {mt!r} is not a decoder-only causal LM: {reason}")
    adapter.stack_for(getattr(config, "model_type", mt))  # raises for an unknown wrapper
    return adapter


def check_causal_lm(model: Any, adapter: Adapter | None = None) -> Adapter:
    """The model's adapter, after checking the model is a causal LM with an LM head."""
    adapter = adapter or adapter_for(model.config)
    cls = type(model).__name__
    allowed = set(adapter.causal_lm_classes)
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as names

        for mt in (model.config.model_type, adapter.model_type):
            v = names.get(mt)
            allowed.update([v] if isinstance(v, str) else (v or []))
    except ImportError:  # pragma: no cover
        pass
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if cls not in allowed or head is None:
        raise UnsupportedArchitectureError(
            f"{cls} ({adapter.family}, model_type {model.config.model_type!r}) is not a causal LM: "
            f"expected one of {sorted(allowed)} with an LM head"
        )
    return adapter


