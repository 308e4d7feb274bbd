"""Which routed experts a step touches: the MoE accounting shared by the roofline and the cost model.

A step of ``tokens`` tokens (a decode step of batch ``b``, or a prefill of ``L`` tokens)
reads the weights of the distinct experts its tokens are routed to and multiplies each
token by ``top_k`` experts. Tokens are taken as independent (a decode batch holds one token
of each of ``b`` different requests), each choosing expert ``e`` with probability ``q_e``
(``sum_e q_e = top_k``), so the expected number of distinct experts of a layer is
``sum_e 1 - (1 - q_e) ** tokens``.

``q_e`` is the layer's measured routing (``LayerGeometry.expert_load``: the share of the
calibration tokens that chose each expert, :mod:`advisor.energy.profiling._routing`) when the
shape carries it; otherwise uniform, ``q_e = top_k / E``, giving ``E * (1 - (1 - k/E) **
tokens)``, and the label says so. Real routers are skewed: fewer distinct experts at a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from advisor.models.shape import LayerGeometry, ModelShape

UNIFORM_ROUTING_NOTE = "MoE experts: uniform routing assumed"
MEASURED_ROUTING_NOTE = "MoE experts: routing measured on the calibration tokens"


def expected_experts_touched(num_experts: int, top_k: int, tokens: float, load: Sequence[float] = ()) -> float:
    """Expected distinct experts of one layer that ``tokens`` independent tokens are routed to.

    ``load``: each expert's probability of being chosen by one token (sums to top_k); empty: uniform.
    """
    if num_experts <= 0 or top_k <= 0 or tokens <= 0:
        return 0.0
    if load:
        return sum(1.0 - (1.0 - min(max(q, 0.0), 1.0)) ** tokens for q in load)
    return num_experts * (1.0 - (1.0 - min(top_k, num_experts) / num_experts) ** tokens)


def layer_experts_touched(layer: LayerGeometry, tokens: float) -> float:
    """Expected distinct routed experts of ``layer`` a step of ``tokens`` tokens reads (measured routing if any)."""
    return expected_experts_touched(layer.num_experts, layer.top_k, tokens, layer.expert_load)


def touched_share(layer: LayerGeometry, tokens: float) -> float:
    """Share of a MoE layer's routed-expert weights that a step of ``tokens`` tokens reads."""
    return layer_experts_touched(layer, tokens) / layer.num_experts


def routing_note(shape: ModelShape) -> str:
    """What an estimate of this shape assumed about routing ("" for a dense model)."""
    moe = [g for g in shape.layers if g.is_moe]
    if not moe:
        return ""
    return MEASURED_ROUTING_NOTE if all(g.expert_load for g in moe) else UNIFORM_ROUTING_NOTE
