"""Config numbers of common dense decoders (0.1B-70B): the GEMM shapes shipped GPU profiles cover.

Numbers from each model's Hugging Face ``config.json``. Used to build the shipped GEMM tables
(:mod:`advisor.energy.profiling._gemm_table`) and by the transfer benchmark; torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.models.shape import ModelShape, llama_shape


@dataclass(frozen=True)
class RefShape:
    name: str
    num_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool = False
    tied: bool = False

    @property
    def params_b(self) -> float:
        """Parameters in billions (embedding and an untied lm_head included)."""
        per_layer = (self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
                     + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate)
        return (self.num_layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)) / 1e9

    def gemm_nk(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each fused group's GEMM (rows of the weight, its input width) and of the lm_head."""
        q = self.heads * self.head_dim
        return {
            "qkv": ((self.heads + 2 * self.kv_heads) * self.head_dim, self.hidden),
            "o": (self.hidden, q),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
            "lm_head": (self.vocab, self.hidden),
        }

    def shape(self, num_layers: int | None = None) -> ModelShape:
        return llama_shape("model.layers", num_layers or self.num_layers, self.hidden, self.intermediate,
                           self.heads, self.kv_heads, self.vocab, self.head_dim)

    def dims(self, num_layers: int | None = None):
        """The runtime's decoder of this shape (Qwen2-style q/k/v biases where the model has them)."""
        from dataclasses import replace

        from advisor.energy.runtime import DecoderDims

        d = DecoderDims.llama(num_layers or self.num_layers, self.hidden, self.intermediate, self.heads,
                              self.kv_heads, self.head_dim, self.vocab, family=self.name)
        if self.qkv_bias:
            layers = tuple(replace(la, attention=replace(la.attention, qkv_bias=True)) for la in d.layers)
            d = replace(d, layers=layers)
        return replace(d, tied_embeddings=self.tied)


REFERENCE_SHAPES: dict[str, RefShape] = {s.name: s for s in (
    RefShape("SmolLM2-135M", 30, 576, 1536, 9, 3, 64, 49152, tied=True),
    # Gemma-3-270M's dims as a Llama-like layer (Gemma's extra norms not modelled): layers of 5.6M weights,
    # between SmolLM2-135M's and SmolLM2-360M's, for anchoring GPU profiles below SmolLM2-360M
    RefShape("Gemma-3-270M", 18, 640, 2048, 4, 1, 256, 262144, tied=True),
    RefShape("SmolLM2-360M", 32, 960, 2560, 15, 5, 64, 49152, tied=True),
    RefShape("Qwen2.5-0.5B", 24, 896, 4864, 14, 2, 64, 151936, qkv_bias=True, tied=True),
    RefShape("Qwen2.5-1.5B", 28, 1536, 8960, 12, 2, 128, 151936, qkv_bias=True, tied=True),
    RefShape("Llama-3.2-1B", 16, 2048, 8192, 32, 8, 64, 128256, tied=True),
    RefShape("Llama-3.2-3B", 28, 3072, 8192, 24, 8, 128, 128256, tied=True),
    RefShape("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
    RefShape("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256),
    RefShape("Qwen2.5-14B", 48, 5120, 13824, 40, 8, 128, 152064, qkv_bias=True),
    RefShape("Qwen2.5-32B", 64, 5120, 27648, 40, 8, 128, 152064, qkv_bias=True),
    RefShape("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128, 128256),
)}


def table_nk(names: tuple[str, ...] | None = None) -> list[tuple[int, int]]:
    """The distinct (N, K) GEMM shapes of the reference models (lm_heads included)."""
    shapes = [REFERENCE_SHAPES[n] for n in names] if names else list(REFERENCE_SHAPES.values())
    return sorted({nk for s in shapes for nk in s.gemm_nk().values()})
