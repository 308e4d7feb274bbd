"""The decoder dimensions the measurement runtime builds its layers from (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.models.shape import ModelShape


@dataclass(frozen=True)
class LlamaDims:
    num_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float = 1e-5
    rope_theta: float = 500000.0

    @classmethod
    def llama31_8b(cls) -> LlamaDims:
        return cls(32, 4096, 14336, 32, 8, 128, 128256)

    @classmethod
    def from_shape(cls, shape: ModelShape) -> LlamaDims:
        inter = next(g.shapes[0][1] for g in shape.groups if g.name.endswith("gate_up"))
        return cls(
            shape.num_layers,
            shape.hidden_size,
            inter,
            shape.num_attention_heads,
            shape.num_kv_heads,
            shape.head_dim,
            shape.vocab_size,
        )

    def hf_config(self):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=131072,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=False,
        )
