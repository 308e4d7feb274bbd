"""The adapter data types: roles, stacks, adapters, group info and layer geometry (plain data)."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from advisor.errors import UnsupportedArchitectureError
from advisor.models.shape import LayerGeometry
from advisor.plan import DENSE_GROUP_KINDS, LayerGroup

Layout = Literal["linear", "fused_experts"]

#: every group kind, in the order the groups of one layer are listed
KIND_ORDER = (*DENSE_GROUP_KINDS, "shared_gate_up", "shared_down", "experts")
#: kinds of which one token uses only top_k / num_experts of the weights
ROUTED_KINDS = frozenset({"experts"})
#: kinds whose members read the same input, fused into one GEMM with one input scale
SHARED_INPUT_KINDS = frozenset({"qkv", "gate_up", "shared_gate_up"})
#: runtime norm name -> the module name in a layer, per norms per layer
NORM_MODULES = {
    2: {"ln_attn": "input_layernorm", "ln_mlp": "post_attention_layernorm"},
    4: {
        "ln_attn": "input_layernorm",
        "ln_attn_out": "post_attention_layernorm",
        "ln_mlp": "pre_feedforward_layernorm",
        "ln_mlp_out": "post_feedforward_layernorm",
    },
}

__all__ = ["KIND_ORDER", "NORM_MODULES", "ROUTED_KINDS", "SHARED_INPUT_KINDS", "Adapter", "GroupInfo",
           "LayerGeometry", "Layout", "Role", "Stack", "TextGeometry", "UnsupportedArchitectureError"]

# ----------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Role:
    """One quantizable weight of a decoder layer.

    ``path`` is relative to the layer (``self_attn.q_proj``); ``*`` stands for an expert
    index of a per-expert ``ModuleList`` (transformers 4 layout). ``layout`` is
    ``fused_experts`` when ``path`` names a 3-D ``[E, out, in]`` parameter. ``export``:
    the module paths (relative to the layer, ``{e}`` = expert index) under which
    ``export_hf_checkpoint`` writes this weight; empty means ``path`` itself.
    """

    path: str
    kind: str
    layout: Layout = "linear"
    export: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stack:
    """Where the text decoder layers sit for one outer ``config.model_type``."""

    layers: str  # e.g. "model.layers"
    never_quantize: tuple[str, ...] = ()  # extra patterns of this wrapper (vision tower, projector)
    export_prefix: tuple[str, str] = ("", "")  # (in-memory, checkpoint) prefix of the text model's names


@dataclass(frozen=True)
class Adapter:
    model_type: str  # text model_type: the registry key
    family: str
    roles: tuple[Role, ...]
    stacks: Mapping[str, Stack]  # outer config.model_type -> Stack
    never_quantize: tuple[str, ...]
    routers: tuple[str, ...] = ()  # patterns (also in never_quantize), for checks
    activation_attr: str = "hidden_act"
    norms_per_layer: int = 2
    qk_norm: bool = False
    qkv_bias: bool | str = False  # constant, or the config attribute holding it
    sliding_pattern: int | None = None  # fallback when the config has no layer_types (Gemma)
    moe: bool = False
    experts_attr: str = "num_experts"
    moe_intermediate_attr: str | None = None  # None: experts use intermediate_size
    shared_expert_attr: str | None = None
    causal_lm_classes: tuple[str, ...] = ()  # accepted besides AutoModelForCausalLM's class
    # -- what the energy side needs (runtime, profiles, cost models) --------------------------------
    #: (transformers module, rotary embedding class) that computes the family's RoPE tables
    rotary_embedding: tuple[str, str] = ("llama", "LlamaRotaryEmbedding")
    #: Gemma's layers: RMSNorm scales by (1 + w) in float32, embeddings by sqrt(hidden), attention by
    #: query_pre_attn_scalar
    gemma_norms: bool = False
    #: where the family biases q/k/v, o_proj has a bias too (Qwen2 biases q, k, v only)
    o_bias_with_qkv: bool = True
    #: a MoE layer's router, relative to the layer (the first that exists: transformers 5, then 4)
    router_paths: tuple[str, ...] = ("mlp.gate",)
    #: a shared expert's sigmoid output gate, relative to the layer
    shared_expert_gate: str = "mlp.shared_expert_gate"
    #: its decoder layer is what the GPU profiles' anchor models measured (two norms, SwiGLU, no q/k norm)
    llama_like: bool = False

    @property
    def norm_modules(self) -> dict[str, str]:
        """The runtime's norm of a layer -> the family's module name (before attention and MLP; Gemma's after
        them too)."""
        return NORM_MODULES[self.norms_per_layer]

    @property
    def kinds(self) -> tuple[str, ...]:
        present = {r.kind for r in self.roles}
        return tuple(k for k in KIND_ORDER if k in present)

    def stack_for(self, outer_model_type: str) -> Stack:
        try:
            return self.stacks[outer_model_type]
        except KeyError:
            raise UnsupportedArchitectureError(
                f"model_type {outer_model_type!r} wraps a {self.model_type!r} text model, but the "
                f"{self.family} adapter knows only the wrappers {sorted(self.stacks)}"
            ) from None

    def is_never_quantized(self, module_name: str, outer_model_type: str | None = None) -> bool:
        extra = self.stacks[outer_model_type].never_quantize if outer_model_type in self.stacks else ()
        return any(fnmatch.fnmatchcase(module_name, p) for p in self.never_quantize + extra)

    def is_router(self, module_name: str) -> bool:
        return any(fnmatch.fnmatchcase(module_name, p) for p in self.routers)


@dataclass(frozen=True)
class GroupInfo:
    """A :class:`LayerGroup` plus what the adapter knows about it."""

    group: LayerGroup
    stack: str
    layer: int
    kind: str
    layout: Layout
    quantizers: tuple[str, ...]  # ModelOpt quantizer names: weight and input of each member
    member_exports: tuple[tuple[str, ...], ...]  # per member: its module names in the exported checkpoint
    num_experts: int = 0  # routed experts behind each member (0: dense)
    top_k: int = 0

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def active_fraction(self) -> float:
        """Share of the group's weights one token uses (top_k / num_experts for routed experts)."""
        return self.top_k / self.num_experts if self.kind in ROUTED_KINDS and self.num_experts else 1.0

    @property
    def exported(self) -> tuple[str, ...]:
        """Module names of all members in the exported checkpoint (per expert for fused experts)."""
        return tuple(n for names in self.member_exports for n in names)

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules that carry this group's quantizers: the members, or for fused experts the
        experts module that owns the 3-D weights (one module for gate/up and down)."""
        if self.layout == "fused_experts":
            return tuple(dict.fromkeys(m.rpartition(".")[0] for m in self.group.members))
        return self.group.members

    @property
    def members_share_input(self) -> bool:
        """Members read the same activations (q/k/v, gate/up): engines run them as one GEMM."""
        return self.kind in SHARED_INPUT_KINDS and self.layout == "linear"


@dataclass(frozen=True)
class TextGeometry:
    model_type: str  # text model_type
    outer_model_type: str
    family: str
    layers: tuple[LayerGeometry, ...]
    vocab: int
    hidden: int
    tied_embeddings: bool

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def kv_bytes(self, context: int, bytes_per_element: float = 2.0) -> float:
        """Bytes of K/V cache of one sequence at ``context`` tokens (sliding windows capped)."""
        return bytes_per_element * sum(2 * g.kv_heads * g.head_dim * g.kv_tokens(context) for g in self.layers)


