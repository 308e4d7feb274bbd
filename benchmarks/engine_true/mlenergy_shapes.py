"""The shapes of the ML.ENERGY models the engine_true report prices: Llama-3.1-8B (the fitted one) as this
project's reference shape, the held-out ones from their public configs (Hugging Face ``config.json`` values,
written out here so that no download is needed), built on the meta device through the advisor's adapters."""

from __future__ import annotations

from functools import cache
from typing import Any

#: the only ML.ENERGY files the B200 anchor may be fitted on
FIT_PREFIX = "meta-llama__Llama-3.1-8B-Instruct__"

_QWEN3 = dict(head_dim=128, hidden_act="silu", max_position_embeddings=40960, rms_norm_eps=1e-06,
              rope_theta=1000000.0, tie_word_embeddings=False, vocab_size=151936, attention_bias=False)
_LLAMA_405B = dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                   num_key_value_heads=8, head_dim=128, vocab_size=128256, hidden_act="silu", rms_norm_eps=1e-05,
                   rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=False)
#: model id -> (transformers config class, its values); None: the reference shape of that name
MODELS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "meta-llama/Llama-3.1-8B-Instruct": None,
    "Qwen/Qwen3-8B": ("Qwen3Config", dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                          num_attention_heads=32, num_key_value_heads=8)),
    "Qwen/Qwen3-14B": ("Qwen3Config", dict(_QWEN3, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                                           num_attention_heads=40, num_key_value_heads=8)),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": ("Qwen3MoeConfig", dict(
        _QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=262144)),
    "meta-llama/Llama-3.1-70B-Instruct": None,
    "meta-llama/Llama-3.3-70B-Instruct": None,
    "meta-llama/Llama-3.1-405B-Instruct": ("LlamaConfig", _LLAMA_405B),
    "meta-llama/Llama-3.1-405B-Instruct-FP8": ("LlamaConfig", _LLAMA_405B),
}
_REFERENCE = {"meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B", "meta-llama/Llama-3.1-70B-Instruct": "Llama-3.1-70B",
              "meta-llama/Llama-3.3-70B-Instruct": "Llama-3.1-70B"}
#: model id -> the layer kinds its published checkpoint holds in FP8 (the rest BF16): Meta's FP8 405B quantizes the
#: feed-forward layers' weights and activations only (its model card; FBGEMM's per-channel FP8 in vLLM). Assumed
#: from the card, not read from the checkpoint, which is not downloaded here.
FP8_KINDS: dict[str, tuple[str, ...]] = {"meta-llama/Llama-3.1-405B-Instruct-FP8": ("gate_up", "down")}


@cache
def shape_of(model_id: str) -> tuple[Any, Any]:
    """(ModelShape, transformers config or None) of an ML.ENERGY model id."""
    spec = MODELS[model_id]
    if spec is None:
        from advisor.energy.profiling import REFERENCE_SHAPES

        return REFERENCE_SHAPES[_REFERENCE[model_id]].shape(), None
    import torch
    import transformers

    from advisor.models.adapters.geometry import model_shape

    config = getattr(transformers, spec[0])(**spec[1])
    with torch.device("meta"):
        return model_shape(transformers.AutoModelForCausalLM.from_config(config)), config
