"""Architecture facts the energy side needs, free of torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from advisor.plan import LayerGroup


@dataclass(frozen=True)
class ModelShape:
    """The layer groups plus the non-quantized parts that still cost bytes and FLOPs."""

    groups: tuple[LayerGroup, ...]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    # lm_head is kept in BF16 (ModelOpt's default configs disable it).
    lm_head_weights: int

    @property
    def quantizable_weights(self) -> int:
        return sum(g.num_weights for g in self.groups)

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """Bytes of K and V cache one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def to_dict(self) -> dict:
        data = asdict(self)
        data["groups"] = [
            {"name": g.name, "members": list(g.members), "shapes": [list(s) for s in g.shapes]}
            for g in self.groups
        ]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelShape:
        groups = tuple(
            LayerGroup(g["name"], tuple(g["members"]), tuple(tuple(s) for s in g["shapes"]))
            for g in data["groups"]
        )
        return cls(**{**data, "groups": groups})


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
    return ModelShape(tuple(groups), num_layers, hidden, heads, kv_heads, hd, vocab, vocab * hidden)
