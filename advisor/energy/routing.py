"""Which routed experts a step touches: the MoE accounting shared by the roofline and the cost model.

A step of ``tokens`` tokens (a decode step of batch ``b``, or a prefill of ``L`` tokens)
reads the weights of the distinct experts its tokens are routed to and multiplies each
token by ``top_k`` experts. Routing is assumed uniform and independent across tokens
(each token picks ``top_k`` distinct experts uniformly at random), so the expected number
of distinct experts per layer is ``E * (1 - (1 - k/E) ** tokens)``. Real routers are
skewed, which touches fewer distinct experts at a given batch; a measured routing
distribution can replace :func:`expected_experts_touched` without changing its callers.
"""

from __future__ import annotations

from advisor.models.shape import LayerGeometry

UNIFORM_ROUTING_NOTE = "MoE experts: uniform routing assumed"


def expected_experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts of one layer that ``tokens`` tokens are routed to (uniform routing)."""
    if num_experts <= 0 or top_k <= 0 or tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - min(top_k, num_experts) / num_experts) ** tokens)


def touched_share(layer: LayerGeometry, tokens: float) -> float:
    """Share of a MoE layer's routed-expert weights that a step of ``tokens`` tokens reads."""
    return expected_experts_touched(layer.num_experts, layer.top_k, tokens) / layer.num_experts
