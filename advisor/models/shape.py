"""Architecture facts the energy side needs, free of torch, with a JSON round trip.

:class:`ModelShape` holds the searched layer groups, the BF16 parts that still cost bytes and
FLOPs (lm_head, MoE routers), and one :class:`LayerGeometry` per decoder layer (attention
heads, head_dim, sliding window, q/k norm, biases, activation, norms, MoE experts). Group
names are ``layers.{i}.{kind}`` (docs/architecture.md, "Layer groups"), so the layer of a
group is read from its name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from advisor.plan import LayerGroup


@dataclass(frozen=True)
class LayerGeometry:
    """One decoder layer of the text model, as its config describes it."""

    index: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int | None  # None: full (global) attention
    qk_norm: bool
    qkv_bias: bool
    activation: str
    norms: int  # RMSNorms of the layer, q/k norms not counted
    intermediate: int  # dense MLP intermediate size; 0 in a MoE layer
    num_experts: int = 0  # routed experts (0: dense MLP)
    top_k: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0
    # measured routing: each expert's share of tokens choosing it (sums to top_k); () = not measured
    expert_load: tuple[float, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def active_share(self) -> float:
        """Share of the routed experts' weights one token uses (top_k / num_experts); 1 when dense."""
        return self.top_k / self.num_experts if self.num_experts else 1.0

    def kv_tokens(self, context: float) -> float:
        """Tokens of K/V this layer keeps (and attends to) for a sequence at ``context``."""
        return context if self.sliding_window is None else min(context, self.sliding_window)

    def causal_pairs(self, length: int) -> float:
        """(query, key) pairs a causal prefill of ``length`` tokens computes in this layer."""
        w = self.sliding_window
        if w is None or length <= w:
            return length * length / 2
        return w * w / 2 + (length - w) * w


def _uniform_layers(groups: tuple[LayerGroup, ...], num_layers: int, hidden: int, heads: int, kv_heads: int,
                    head_dim: int) -> tuple[LayerGeometry, ...]:
    """Llama-like layers for shapes recorded before per-layer geometry existed."""
    down = {g.name: g for g in groups if g.name.endswith(".down")}
    out = []
    for i in range(num_layers):
        g = down.get(f"layers.{i}.down")
        out.append(LayerGeometry(i, hidden, heads, kv_heads, head_dim, None, False, False, "silu", 2,
                                 g.in_features if g else 0))
    return tuple(out)


@dataclass(frozen=True)
class ModelShape:
    """The layer groups plus the non-quantized parts that still cost bytes and FLOPs."""

    groups: tuple[LayerGroup, ...]
    num_layers: int
    hidden_size: int
    num_attention_heads: int  # of layer 0 (every supported family keeps it per model)
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    # lm_head is kept in BF16 (ModelOpt's default configs disable it).
    lm_head_weights: int
    layers: tuple[LayerGeometry, ...] = ()  # empty: uniform Llama-like layers from the fields above
    model_type: str = ""  # text model_type ("" for shapes stored before adapters)
    outer_model_type: str = ""  # the config's own model_type (a multimodal wrapper's differs)
    family: str = ""
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if not self.layers:
            object.__setattr__(self, "layers", _uniform_layers(
                self.groups, self.num_layers, self.hidden_size, self.num_attention_heads, self.num_kv_heads,
                self.head_dim))

    @property
    def quantizable_weights(self) -> int:
        return sum(g.num_weights for g in self.groups)

    @property
    def router_weights(self) -> int:
        """BF16 weights of the MoE routers (and shared-expert gates), read at every step."""
        return sum(g.num_experts * g.hidden + (g.hidden if g.shared_expert_intermediate else 0)
                   for g in self.layers if g.is_moe)

    @property
    def is_moe(self) -> bool:
        return any(g.is_moe for g in self.layers)

    @property
    def searches_text_tower_only(self) -> bool:
        """A multimodal wrapper: only its language model is searched; the rest stays BF16."""
        return bool(self.outer_model_type) and self.outer_model_type != self.model_type

    def layer_of(self, group: str) -> LayerGeometry | None:
        """The decoder layer of a ``layers.{i}.{kind}`` group; None for other names."""
        parts = group.split(".")
        if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and int(parts[1]) < len(self.layers):
            return self.layers[int(parts[1])]
        return None

    def routed_layer(self, group: str) -> LayerGeometry | None:
        """The MoE layer of a routed-experts group (``layers.{i}.experts``); None for every other group.

        Its members are the experts' gate/up then down weights, all experts stacked.
        """
        layer = self.layer_of(group)
        return layer if layer is not None and layer.is_moe and group.endswith(".experts") else None

    def with_expert_load(self, loads: dict[int, tuple[float, ...]]) -> ModelShape:
        """The shape with measured routing (layer index -> each expert's share of tokens) on its MoE layers."""
        layers = tuple(replace(g, expert_load=tuple(loads[g.index])) if g.is_moe and g.index in loads else g
                       for g in self.layers)
        return replace(self, layers=layers)

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """Bytes of K and V cache one token occupies across all layers (no window cap)."""
        return sum(2 * g.kv_heads * g.head_dim for g in self.layers) * bytes_per_element

    def kv_bytes(self, context: float, bytes_per_element: float = 2.0) -> float:
        """Bytes of K/V one sequence at ``context`` keeps; sliding-window layers keep their window."""
        return sum(2 * g.kv_heads * g.head_dim * g.kv_tokens(context) for g in self.layers) * bytes_per_element

    def to_dict(self) -> dict:
        data = asdict(self)
        data["groups"] = [
            {"name": g.name, "members": list(g.members), "shapes": [list(s) for s in g.shapes]}
            for g in self.groups
        ]
        data["layers"] = [asdict(g) for g in self.layers]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelShape:
        """Reads what :meth:`to_dict` writes, and the shape dicts of summaries written before
        per-layer geometry (no ``layers``: uniform Llama-like layers)."""
        groups = tuple(
            LayerGroup(g["name"], tuple(g["members"]), tuple(tuple(s) for s in g["shapes"]))
            for g in data["groups"]
        )
        layers = tuple(LayerGeometry(**{**g, "expert_load": tuple(g.get("expert_load", ()))})
                       for g in data.get("layers", ()))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k not in ("groups", "layers")}
        return cls(**{**known, "groups": groups, "layers": layers})


def llama_shape(
    name_prefix: str,
    num_layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    head_dim: int | None = None,
) -> ModelShape:
    """The shape of a Llama-family model from its config numbers (no weights needed)."""
    hd = head_dim or hidden // heads
    groups = []
    for i in range(num_layers):
        p = f"{name_prefix}.{i}"
        groups += [
            LayerGroup(
                f"layers.{i}.qkv",
                (f"{p}.self_attn.q_proj", f"{p}.self_attn.k_proj", f"{p}.self_attn.v_proj"),
                ((hidden, heads * hd), (hidden, kv_heads * hd), (hidden, kv_heads * hd)),
            ),
            LayerGroup(f"layers.{i}.o", (f"{p}.self_attn.o_proj",), ((heads * hd, hidden),)),
            LayerGroup(
                f"layers.{i}.gate_up",
                (f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj"),
                ((hidden, intermediate), (hidden, intermediate)),
            ),
            LayerGroup(f"layers.{i}.down", (f"{p}.mlp.down_proj",), ((intermediate, hidden),)),
        ]
    return ModelShape(tuple(groups), num_layers, hidden, heads, kv_heads, hd, vocab, vocab * hidden,
                      model_type="llama", outer_model_type="llama", family="Llama 3.x")
