"""Predicted energy from a roofline model of the target GPU and datasheet numbers.

Model (documented in docs/architecture.md, "Energy"):

* A phase moves ``bytes`` through HBM and does ``flops_f`` tensor-core FLOPs in
  each format ``f``. Its time is the roofline ``max(bytes / BW, sum_f flops_f / peak_f)``.
* Its energy is ``time * P_idle + bytes * e_byte + sum_f flops_f * e_flop_f``, where
  ``e_byte = (0.6 * TDP - P_idle) / BW`` (a GPU streaming HBM at full bandwidth
  draws about 60% of TDP) and ``e_flop_f = (TDP - P_idle) / peak_f`` (a GPU at peak
  tensor throughput draws its TDP). Both constants are assumptions, not
  measurements; a measured profile replaces them.
* Decode step at context ``c`` and batch ``B``: every weight once (in its format's
  bytes, scales included), the BF16 lm_head and MoE routers, and ``B`` sequences of KV
  cache (2 bytes per element, 1 with an FP8 KV cache), a sliding-window layer's capped at
  its window; FLOPs ``2 * B * weights`` plus
  attention ``4 * B * c_l * heads * head_dim`` per layer (``c_l``: the tokens layer ``l``
  attends to).
* Prefill of one request of ``L`` tokens: weights once, ``2 * L * weights`` FLOPs plus
  ``4 * heads * head_dim`` per causal (query, key) pair of each layer (``L^2 / 2``, fewer
  in a sliding-window layer).
* MoE layers (:mod:`advisor.energy.prediction._routing`): a step of ``t`` tokens reads the routed
  experts its tokens touch (expected distinct experts under the routing measured on the
  calibration tokens, or uniform routing, labelled which) and multiplies ``t * top_k``
  expert rows.
* J per output token = (prefill J + output_tokens * decode-step J / B) / output_tokens,
  with the decode step taken at the mean context ``input + output / 2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.energy.prediction._routing import routing_note, touched_share
from advisor.errors import UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import FORMAT_SPECS, GPU, GPU_SPECS, KV_CACHE_BYTES, Format, GPUSpec
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

MEMORY_BOUND_POWER_FRACTION = 0.6
FP8_KV_NOTE = "FP8 KV cache: KV bytes per token halved"


@dataclass(frozen=True)
class PhaseCost:
    bytes: float
    flops: dict[Format, float]

    def time_s(self, gpu: GPUSpec) -> float:
        t_mem = self.bytes / (gpu.memory_bandwidth_tb_s * 1e12)
        t_compute = sum(f / (gpu.tensor_tflops[fmt] * 1e12) for fmt, f in self.flops.items())
        return max(t_mem, t_compute)

    def energy_j(self, gpu: GPUSpec) -> float:
        bw = gpu.memory_bandwidth_tb_s * 1e12
        e_byte = (MEMORY_BOUND_POWER_FRACTION * gpu.tdp_w - gpu.idle_w) / bw
        e_flops = sum(
            f * (gpu.tdp_w - gpu.idle_w) / (gpu.tensor_tflops[fmt] * 1e12) for fmt, f in self.flops.items()
        )
        return self.time_s(gpu) * gpu.idle_w + self.bytes * e_byte + e_flops


def _weight_bytes_and_flops(shape: ModelShape, plan: Plan, tokens: int) -> tuple[float, dict[Format, float]]:
    bf16_weights = shape.lm_head_weights + shape.router_weights
    nbytes = bf16_weights * 2.0
    flops: dict[Format, float] = {Format.BF16: 2.0 * tokens * bf16_weights}
    for g in shape.groups:
        fmt = plan.format_of(g.name)
        moe = shape.routed_layer(g.name)
        read, used = (touched_share(moe, tokens), moe.active_share) if moe else (1.0, 1.0)
        nbytes += g.num_weights * read * FORMAT_SPECS[fmt].weight_bytes_per_element
        flops[fmt] = flops.get(fmt, 0.0) + 2.0 * tokens * g.num_weights * used
    return nbytes, flops


def decode_step_cost(shape: ModelShape, plan: Plan, batch: int, context: float) -> PhaseCost:
    nbytes, flops = _weight_bytes_and_flops(shape, plan, batch)
    nbytes += batch * shape.kv_bytes(context, KV_CACHE_BYTES[plan.kv_cache])
    attn = 4.0 * batch * sum(g.kv_tokens(context) * g.heads * g.head_dim for g in shape.layers)
    flops[Format.BF16] = flops.get(Format.BF16, 0.0) + attn
    return PhaseCost(nbytes, flops)


def prefill_cost(shape: ModelShape, plan: Plan, length: int) -> PhaseCost:
    nbytes, flops = _weight_bytes_and_flops(shape, plan, length)
    nbytes += shape.kv_bytes(length, KV_CACHE_BYTES[plan.kv_cache])  # the cache written once
    attn = 4.0 * sum(g.causal_pairs(length) * g.heads * g.head_dim for g in shape.layers)
    flops[Format.BF16] = flops.get(Format.BF16, 0.0) + attn
    return PhaseCost(nbytes, flops)


class RooflineEnergyModel:
    """Datasheet roofline predictor. Every estimate it gives is labelled predicted."""

    measured = False
    gpus = 1

    def __init__(self, shape: ModelShape, target: GPU, note: str = "") -> None:
        self.shape = shape
        self.gpu = GPU_SPECS[target]
        notes = [n for n in (note, routing_note(shape)) if n]
        self.label = f"predicted (roofline, datasheet {self.gpu.marketing_name}{''.join('; ' + n for n in notes)})"

    def _check(self, plan: Plan) -> None:
        if not self.gpu.supports_kv_cache(plan.kv_cache):
            raise UnsupportedError(f"an {plan.kv_cache.value} KV cache is not served on {self.gpu.marketing_name}")
        for fmt in set(plan.formats.values()):
            if not self.gpu.supports(fmt):
                raise UnsupportedError(
                    f"{fmt.value} does not run natively on {self.gpu.marketing_name} "
                    f"(sm_{self.gpu.compute_capability[0]}{self.gpu.compute_capability[1]}); "
                    "no energy can be predicted for it there"
                )

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step of ``batch`` sequences at ``context``, as the profile tiers give it."""
        self._check(plan)
        step = decode_step_cost(self.shape, plan, batch, context)
        return step.time_s(self.gpu) * 1e3, step.energy_j(self.gpu)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of the prefill of one request of ``length`` tokens."""
        self._check(plan)
        cost = prefill_cost(self.shape, plan, length)
        return cost.time_s(self.gpu) * 1e3, cost.energy_j(self.gpu)

    def without_step_cap(self) -> RooflineEnergyModel:
        """Itself: it holds no step to the power limit."""
        return self

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """False: a pass over as many tokens as a prompt costs at least that prompt's prefill."""
        return False

    def step_source(self, plan: Plan) -> str:
        """The label of the model whose step times price ``plan``: this one's."""
        return self.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        self._check(plan)
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step = decode_step_cost(self.shape, plan, b, lin + lout / 2)
        pre = prefill_cost(self.shape, plan, lin)
        step_j, pre_j = step.energy_j(self.gpu), pre.energy_j(self.gpu)
        decode_per_token = step_j / b
        return EnergyEstimate(
            workload=workload.name,
            j_per_token=(pre_j + lout * decode_per_token) / lout,
            decode_j_per_token=decode_per_token,
            prefill_j_per_input_token=pre_j / lin,
            decode_tokens_per_s=b / step.time_s(self.gpu),
            source=self.label if plan.kv_cache == Format.BF16 else f"{self.label[:-1]}; {FP8_KV_NOTE})",
            measured=False,
        )
