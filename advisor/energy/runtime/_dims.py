"""The decoder the measurement runtime builds: per-layer attention and MLP specs (torch-free).

A :class:`DecoderDims` describes one dense decoder-only model layer by layer, from its
transformers config through the architecture adapters (:func:`DecoderDims.from_config`),
or as a Llama stand-in from a :class:`ModelShape` alone (:func:`DecoderDims.from_shape`).
What the runtime cannot run honestly is refused here, with the reason, before any GPU
work: partial rotary embeddings, activations other than SiLU and GELU-tanh, head dims
outside 16..256. Routed-expert layers (Mixtral, Qwen3-MoE, Qwen2-MoE) run as grouped GEMMs
(:mod:`advisor.energy.runtime._moe`); a shared expert (Qwen2-MoE) as a dense gated MLP beside them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from advisor.errors import UnsupportedError
from advisor.models.shape import ModelShape

#: activation names of transformers configs -> the gated activation the runtime runs
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
DEFAULT_ROPE = "default"


@dataclass(frozen=True)
class AttentionSpec:
    heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int | None = None  # keys a query sees, itself included (HF: key > query - window)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE
    qkv_bias: bool = False
    o_bias: bool = False
    scale: float | None = None  # None: head_dim ** -0.5
    softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    rope: str = DEFAULT_ROPE  # which RoPE table (Gemma 3 has one per layer type)

    @property
    def q_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim**-0.5

    def first_key(self, context: int) -> int:
        """First position a query at ``context - 1`` attends to."""
        return 0 if self.sliding_window is None else max(0, context - self.sliding_window)

    def kv_tokens(self, context: int) -> int:
        """Cached tokens a decode step at ``context`` reads for one sequence."""
        return context - self.first_key(context)


@dataclass(frozen=True)
class MoESpec:
    """A layer's routed experts: softmax router over ``num_experts``, ``top_k`` per token."""

    num_experts: int
    top_k: int
    intermediate: int  # one expert's
    norm_topk_prob: bool = True  # renormalize the top-k probabilities (Mixtral, Qwen3-MoE)


@dataclass(frozen=True)
class LayerSpec:
    attention: AttentionSpec
    intermediate: int  # dense MLP; 0 in a MoE layer
    activation: str = "silu"  # "silu" or "gelu_tanh", applied to gate, times up
    norms: int = 2  # 2: before attention and MLP; 4: Gemma's after them too
    moe: MoESpec | None = None
    shared_intermediate: int = 0  # a MoE layer's shared expert (a gated MLP, sigmoid-gated output); 0: none


@dataclass(frozen=True)
class DecoderDims:
    hidden: int
    vocab: int
    layers: tuple[LayerSpec, ...]
    rms_eps: float = 1e-5
    family: str = "Llama 3.x"
    model_type: str = "llama"
    gemma_norms: bool = False  # RMSNorm weight is (1 + w), multiplied in float32 before rounding
    embed_scale: float = 1.0
    final_softcap: float | None = None
    tied_embeddings: bool = False
    stand_in: bool = False  # True: a Llama layer of the shape, not the model's own architecture
    config: Any = field(default=None, compare=False, repr=False)  # transformers text config (RoPE tables)

    # -- uniform views (the KV cache is one tensor, so kv heads and head dim are per model)
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def heads(self) -> int:
        return self.layers[0].attention.heads

    @property
    def kv_heads(self) -> int:
        return self.layers[0].attention.kv_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].attention.head_dim

    @property
    def intermediate(self) -> int:
        return self.layers[0].intermediate

    @property
    def is_moe(self) -> bool:
        return any(la.moe is not None for la in self.layers)

    @property
    def label(self) -> str:
        if self.stand_in:
            return "Llama layers of this shape, a stand-in: the model's architecture was not given"
        return f"{self.family} layers"

    def kv_bytes(self, batch: int, context: int, bytes_per_element: int = 2) -> int:
        """KV-cache bytes a decode step at ``context`` reads (sliding windows capped)."""
        per_token = 2 * self.kv_heads * self.head_dim * bytes_per_element
        return batch * per_token * sum(layer.attention.kv_tokens(context) for layer in self.layers)

    def summary(self) -> dict[str, Any]:
        """The flat fields energy profiles record (layer 0's attention and MLP)."""
        return {
            "family": self.family,
            "num_layers": self.num_layers,
            "hidden": self.hidden,
            "intermediate": self.intermediate,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab": self.vocab,
            "rms_eps": self.rms_eps,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description (the transformers config left out)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "config"}

    def with_layers(self, num_layers: int) -> DecoderDims:
        """The same model with its first ``num_layers`` layers (to fit a GPU or a time budget)."""
        cfg = self.config
        if cfg is not None:
            cfg = _copy_config(cfg, num_layers)
        return replace(self, layers=self.layers[:num_layers], config=cfg)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def llama(
        cls,
        num_layers: int,
        hidden: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        vocab: int,
        rms_eps: float = 1e-5,
        stand_in: bool = False,
        family: str = "Llama 3.x",
    ) -> DecoderDims:
        att = AttentionSpec(heads, kv_heads, head_dim)
        _check_head_dim(head_dim, family)
        return cls(hidden, vocab, (LayerSpec(att, intermediate),) * num_layers, rms_eps, family, stand_in=stand_in)

    @classmethod
    def llama31_8b(cls) -> DecoderDims:
        return cls.llama(32, 4096, 14336, 32, 8, 128, 128256)

    @classmethod
    def from_shape(cls, shape: ModelShape) -> DecoderDims:
        """Llama layers of a shape whose config is unknown (the label says it is a stand-in)."""
        gate_up = [g for g in shape.groups if g.name.rsplit(".", 1)[-1] == "gate_up"]
        if not gate_up:
            raise UnsupportedError(
                "the measurement runtime runs dense decoder layers (a gate_up group per layer); this model has "
                "none, e.g. a mixture-of-experts model; use --energy predicted"
            )
        return cls.llama(
            shape.num_layers,
            shape.hidden_size,
            gate_up[0].shapes[0][1],
            shape.num_attention_heads,
            shape.num_kv_heads,
            shape.head_dim,
            shape.vocab_size,
            stand_in=True,
        )

    @classmethod
    def from_config(cls, config: Any) -> DecoderDims:
        """The model's own decoder, layer by layer, from a transformers config (outer or text)."""
        from advisor.models.adapters import ADAPTERS, text_geometry

        geo = text_geometry(config)
        adapter = ADAPTERS[geo.model_type]
        text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
        if getattr(text, "mlp_bias", False):
            raise UnsupportedError(f"{geo.family}: MLP biases (mlp_bias=True) are not in the measurement runtime")
        gemma = adapter.gemma_norms
        rope_keys = _rope_keys(text, geo.family, geo.num_layers)
        scalar = getattr(text, "query_pre_attn_scalar", None) if gemma else None
        layers = []
        for g, rope in zip(geo.layers, rope_keys, strict=True):
            _check_head_dim(g.head_dim, geo.family)
            act = ACTIVATIONS.get(g.activation)
            if act is None:
                raise UnsupportedError(
                    f"{geo.family}: activation {g.activation!r} is not in the measurement runtime "
                    f"(it runs {', '.join(sorted(ACTIVATIONS))})"
                )
            att = AttentionSpec(
                g.heads,
                g.kv_heads,
                g.head_dim,
                sliding_window=g.sliding_window,
                qk_norm=g.qk_norm,
                qkv_bias=g.qkv_bias,
                o_bias=g.qkv_bias and adapter.o_bias_with_qkv,
                scale=float(scalar) ** -0.5 if scalar else None,
                softcap=getattr(text, "attn_logit_softcapping", None) or None,
                rope=rope,
            )
            moe = MoESpec(g.num_experts, g.top_k, g.moe_intermediate,
                          bool(getattr(text, "norm_topk_prob", True))) if g.is_moe else None
            layers.append(LayerSpec(att, 0 if moe else g.intermediate, act, g.norms, moe,
                                    g.shared_expert_intermediate if moe else 0))
        if {(la.attention.kv_heads, la.attention.head_dim) for la in layers} != {(geo.layers[0].kv_heads,
                                                                                 geo.layers[0].head_dim)}:
            raise UnsupportedError(f"{geo.family}: kv heads or head dim differ between layers (one KV cache layout)")
        return cls(
            geo.hidden,
            geo.vocab,
            tuple(layers),
            float(getattr(text, "rms_norm_eps", 1e-6)),
            geo.family,
            geo.model_type,
            gemma_norms=gemma,
            embed_scale=geo.hidden**0.5 if gemma else 1.0,
            final_softcap=getattr(text, "final_logit_softcapping", None) or None,
            tied_embeddings=geo.tied_embeddings,
            config=text,
        )

    def hf_config(self) -> Any:
        """The transformers text config: the model's own, or a Llama-3.1-style one for a stand-in."""
        if self.config is not None:
            return self.config
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
            rope_theta=500000.0,
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


def _check_head_dim(head_dim: int, family: str) -> None:
    if head_dim % 2 or not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise UnsupportedError(
            f"{family}: head_dim {head_dim} is outside what the runtime's attention kernels run "
            f"(even, {MIN_HEAD_DIM}..{MAX_HEAD_DIM})"
        )


def _rope_keys(text: Any, family: str, num_layers: int) -> list[str]:
    """Which RoPE table each layer uses; refuses partial rotary embeddings."""
    params = getattr(text, "rope_parameters", None) or {}
    nested = bool(params) and all(isinstance(v, dict) for v in params.values())
    for p in params.values() if nested else [params]:
        factor = p.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0)) or 1.0
        if float(factor) != 1.0:
            raise UnsupportedError(
                f"{family}: partial rotary embeddings (partial_rotary_factor={factor}) are not in the "
                "measurement runtime's attention kernels"
            )
    if not nested:
        return [DEFAULT_ROPE] * num_layers
    types = getattr(text, "layer_types", None) or []
    return [types[i] if i < len(types) and types[i] in params else DEFAULT_ROPE for i in range(num_layers)]


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value


def _copy_config(config: Any, num_layers: int) -> Any:
    import copy

    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = num_layers
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        cfg.layer_types = list(types)[:num_layers]
    return cfg
