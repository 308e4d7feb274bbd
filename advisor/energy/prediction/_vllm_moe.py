"""A mixture of experts' device costs as vLLM runs it: its routed experts from vLLM's fused MoE measured per layer, the
rest of the model from the GPU profile's layer model. torch-free.

vLLM runs a MoE layer's routing and experts as a few fused kernels (top-k, then its Triton fused MoE for the
experts: the kernel the advisor serves them with on Hopper, :func:`advisor.serving.vllm_moe_backend`). The built-in
runtime runs them otherwise (torch grouped GEMMs, routing in torch ops), and its per-model profile priced
Qwen3-30B-A3B's all-FP8 steps 1.5-2x slower than vLLM served them
(reports/benchmarks/vllm_step_check_h200_moe_before_table.md).
Where the vLLM step profile carries ``moe_kernels`` (``benchmarks/device/vllm_moe_kernels.py``: ms and J of one
layer's router, top-k and experts at a sweep of tokens, per geometry and format), a step of ``n`` tokens costs

* the model without its routed experts (attention, shared experts, norms, the LM head), as the GPU profile's layer
  model prices it, plus
* for each MoE layer, the table's row of its geometry (experts, top-k, hidden, expert intermediate) and its experts'
  format at ``n`` tokens (piecewise linear; linear past the ends): the router's GEMM, the top-k and the experts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from advisor.energy.profiling import interp
from advisor.formats import Format
from advisor.models.shape import LayerGeometry, ModelShape
from advisor.plan import Plan

GeometryKey = tuple[int, int, int, int, str]


def geometry_key(layer: LayerGeometry, fmt: Format) -> GeometryKey:
    return layer.num_experts, layer.top_k, layer.hidden, layer.moe_intermediate, fmt.value


class MoeKernelTable:
    """vLLM's fused MoE measured per layer on one GPU kind: per geometry and format, ms and J at token counts."""

    def __init__(self, data: dict[str, Any]) -> None:
        by_key: dict[GeometryKey, list[tuple[int, float, float]]] = {}
        for r in data["rows"]:
            key = (int(r["experts"]), int(r["top_k"]), int(r["hidden"]), int(r["intermediate"]), str(r["format"]))
            by_key.setdefault(key, []).append((int(r["tokens"]), float(r["ms_per_layer"]), float(r["j_per_layer"])))
        self._rows = {k: tuple(zip(*sorted(v), strict=True)) for k, v in by_key.items()}
        self.label = (f"vLLM {data['vllm_version']}'s fused MoE measured on {data['gpu']}, {data['date']}, at uniform "
                      "routing")  # a trained model's skewed expert loads touch fewer experts a step: not measured

    def covers(self, shape: ModelShape, plan: Plan) -> bool:
        """Every MoE layer of ``shape`` has a row of its geometry in its experts' format under ``plan``."""
        return shape.is_moe and all(geometry_key(g, plan.format_of(f"layers.{g.index}.experts")) in self._rows
                                    for g in shape.layers if g.is_moe)

    def layer_cost(self, layer: LayerGeometry, fmt: Format, tokens: float) -> tuple[float, float]:
        """(ms, J) of ``layer``'s router, top-k and experts at ``tokens`` tokens in ``fmt``."""
        xs, ms, js = self._rows[geometry_key(layer, fmt)]
        return max(interp(xs, ms, tokens), 0.0), max(interp(xs, js, tokens), 0.0)


def without_routed_experts(shape: ModelShape) -> ModelShape:
    """``shape`` less its routed experts (their groups, and the MoE fields of its layers): what is left of a step."""
    layers = tuple(replace(g, num_experts=0, top_k=0, moe_intermediate=0, expert_load=()) if g.is_moe else g
                   for g in shape.layers)
    groups = tuple(g for g in shape.groups if not g.name.endswith(".experts"))
    return replace(shape, groups=groups, layers=layers)


class VllmMoeDevice:
    """A step model (:class:`advisor.search.operating.StepModel`) of a MoE's device costs in vLLM: ``rest`` (a
    predicted tier of :func:`without_routed_experts`' shape) and the kernel table for each MoE layer; a plan whose
    experts' geometry or format the table does not hold is priced by ``fallback`` (the predicted tier as it was)."""

    measured = False

    def __init__(self, rest: Any, table: MoeKernelTable, shape: ModelShape, fallback: Any) -> None:
        self.rest, self.table, self.shape, self.fallback = rest, table, shape, fallback
        self.gpus = rest.gpus
        self._moe = [g for g in shape.layers if g.is_moe]
        inner = rest.label.removeprefix("predicted (").removesuffix(")")
        self.label = f"predicted ({table.label}, for the routed experts; the rest from {inner})"

    def covers(self, plan: Plan) -> bool:
        return self.table.covers(self.shape, plan)

    def _plans(self, plan: Plan) -> tuple[Plan, list[Format]]:
        rest = Plan({g: f for g, f in plan.formats.items() if not g.endswith(".experts")}, kv_cache=plan.kv_cache)
        return rest, [plan.format_of(f"layers.{g.index}.experts") for g in self._moe]

    def _experts(self, formats: list[Format], tokens: float) -> tuple[float, float]:
        costs = [self.table.layer_cost(g, f, tokens) for g, f in zip(self._moe, formats, strict=True)]
        return sum(c[0] for c in costs), sum(c[1] for c in costs)

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        if not self.covers(plan):
            return self.fallback.decode_step(plan, batch, context)
        rest, formats = self._plans(plan)
        ms, j = self.rest.decode_step(rest, batch, context)
        e_ms, e_j = self._experts(formats, batch)
        return ms + e_ms, j + e_j

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        if not self.covers(plan):
            return self.fallback.prefill(plan, length)
        rest, formats = self._plans(plan)
        ms, j = self.rest.prefill(rest, length)
        e_ms, e_j = self._experts(formats, length)
        return ms + e_ms, j + e_j

    def pass_is_decode_step(self, plan: Plan) -> bool:
        if not self.covers(plan):
            return self.fallback.pass_is_decode_step(plan)
        return self.rest.pass_is_decode_step(self._plans(plan)[0])

    def without_step_cap(self) -> VllmMoeDevice:
        return VllmMoeDevice(self.rest.without_step_cap(), self.table, self.shape, self.fallback.without_step_cap())

    def step_source(self, plan: Plan) -> str:
        return self.label if self.covers(plan) else self.fallback.step_source(plan)
