"""Predicted energy of a plan served over N GPUs of one node with tensor parallelism, sharded as vLLM shards a
dense decoder.

Every GPU holds 1/N of each layer: column-parallel GEMMs (``qkv``, ``gate_up``) split their output features,
row-parallel ones (``o``, ``down``) their input features; the attention heads and the KV cache split N ways (KV
heads fewer than N are replicated, one per GPU); lm_head splits over the vocabulary. One GPU's step is what the
single-GPU predicted tier gives for that sharded shape: its GEMM tables priced at the sharded (N, K), a shape
they never saw scaled from the nearest (the tier's own fallback, labelled). The node's step takes that time
plus two all-reduces per layer (after ``o`` and after ``down``), and costs N GPUs' energy plus the all-reduces'.

The all-reduce's cost (:data:`ALLREDUCE`) is assumed, not measured, and every label says so. A per-model profile
timed this model's unsharded GEMMs, so it does not price the shards: the tiers are taken from the GPU profile on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from advisor.errors import InputError
from advisor.estimate import EnergyEstimate, PredictedModel
from advisor.formats import GPU
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import Workload

COLUMN_PARALLEL = ("qkv", "gate_up")
ROW_PARALLEL = ("o", "down")
ALLREDUCES_PER_LAYER = 2
ACTIVATION_BYTES = 2  # BF16 hidden states


@dataclass(frozen=True)
class AllReduceCost:
    """One all-reduce of a step's hidden states over the node's GPUs: a latency plus a ring's bytes over the bus
    bandwidth, while every GPU draws ``power_w``. Assumed (NVLink-class H100/H200 nodes), not measured."""

    latency_s: float = 15e-6
    bus_gb_s: float = 200.0
    power_w: float = 250.0

    def time_s(self, nbytes: float, gpus: int) -> float:
        return self.latency_s + 2 * (gpus - 1) / gpus * nbytes / (self.bus_gb_s * 1e9)

    def energy_j(self, nbytes: float, gpus: int) -> float:
        return gpus * self.power_w * self.time_s(nbytes, gpus)

    def describe(self) -> str:
        return (f"{ALLREDUCES_PER_LAYER} all-reduces per layer at {self.latency_s * 1e6:g} us + bytes at "
                f"{self.bus_gb_s:g} GB/s, {self.power_w:g} W per GPU: assumed, not measured")


ALLREDUCE = AllReduceCost()


def _local_kv_heads(kv_heads: int, gpus: int) -> int:
    """KV heads on each GPU: split N ways, or replicated one per GPU where there are fewer than N."""
    if (kv_heads >= gpus and kv_heads % gpus) or (kv_heads < gpus and gpus % kv_heads):
        raise InputError(f"{kv_heads} KV heads cannot be spread over {gpus} GPUs (vLLM needs one count to divide "
                         "the other)")
    return max(1, kv_heads // gpus)


def _shard_group(g: LayerGroup, kind: str, heads: int, kv_heads: int, local_kv: int, head_dim: int,
                 gpus: int) -> LayerGroup:
    shapes = []
    for k, n in g.shapes:
        if kind in ROW_PARALLEL:
            shapes.append((k // gpus, n))
        elif kind == "qkv" and n == kv_heads * head_dim and n != heads * head_dim:
            shapes.append((k, local_kv * head_dim))
        elif kind == "qkv" and n == (heads + 2 * kv_heads) * head_dim:  # a pre-fused projection
            shapes.append((k, (heads // gpus + 2 * local_kv) * head_dim))
        else:
            shapes.append((k, n // gpus))
    return replace(g, shapes=tuple(shapes))


def shard_shape(shape: ModelShape, gpus: int) -> ModelShape:
    """What one of ``gpus`` GPUs holds of ``shape`` under vLLM's tensor parallelism (module doc). InputError for a
    model it cannot split so (routed experts, heads or MLP width not divisible)."""
    if gpus == 1:
        return shape
    if shape.is_moe:
        raise InputError("the tensor-parallel prediction prices dense decoders; this model has routed experts")
    layers = []
    for la in shape.layers:
        if la.heads % gpus or la.intermediate % gpus:
            raise InputError(f"layer {la.index} ({la.heads} heads, MLP width {la.intermediate}) does not split "
                             f"evenly over {gpus} GPUs; vLLM refuses such a tensor-parallel size")
        layers.append(replace(la, heads=la.heads // gpus, kv_heads=_local_kv_heads(la.kv_heads, gpus),
                              intermediate=la.intermediate // gpus))
    groups = []
    for g in shape.groups:
        kind = g.name.rsplit(".", 1)[-1]
        la = shape.layer_of(g.name)
        if kind not in COLUMN_PARALLEL + ROW_PARALLEL or la is None:
            raise InputError(f"the tensor-parallel prediction shards the groups {COLUMN_PARALLEL + ROW_PARALLEL}, "
                             f"not {g.name!r}")
        groups.append(_shard_group(g, kind, la.heads, la.kv_heads, _local_kv_heads(la.kv_heads, gpus), la.head_dim,
                                   gpus))
    vocab = -(-shape.vocab_size // gpus)
    return replace(shape, groups=tuple(groups), layers=tuple(layers),
                   num_attention_heads=shape.num_attention_heads // gpus,
                   num_kv_heads=_local_kv_heads(shape.num_kv_heads, gpus), vocab_size=vocab,
                   lm_head_weights=vocab * shape.hidden_size)


class TensorParallelEnergyModel:
    """A :class:`~advisor.estimate.PredictedModel` for a plan served over ``gpus`` GPUs: ``per_gpu`` prices one GPU's
    shard (a model of :func:`shard_shape`'s shape), this adds the other GPUs and the all-reduces (module doc)."""

    measured = False

    def __init__(self, per_gpu: PredictedModel, gpus: int, hidden: int, layers: int,
                 allreduce: AllReduceCost = ALLREDUCE) -> None:
        self.per_gpu, self.gpus, self.hidden, self.layers, self.allreduce = per_gpu, gpus, hidden, layers, allreduce
        self.label = self._label(per_gpu.label)

    def _label(self, per_gpu: str) -> str:
        if self.gpus == 1:
            return per_gpu
        n = self.gpus
        return (f"predicted for {n} GPUs (tensor parallel, tp={n}: one GPU's shard, 1/{n} of every GEMM, of the "
                f"attention heads and of the KV cache, priced by {per_gpu}; times {n} GPUs' energy; "
                f"{self.allreduce.describe()})")

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """Its per-GPU model's answer (the all-reduces are the same either way)."""
        return self.per_gpu.pass_is_decode_step(plan)

    def without_step_cap(self) -> TensorParallelEnergyModel:
        """This model over its per-GPU model with no step held to the power limit on its own."""
        return TensorParallelEnergyModel(self.per_gpu.without_step_cap(), self.gpus, self.hidden, self.layers,
                                         self.allreduce)

    def _allreduces(self, rows: float) -> tuple[float, float]:
        """(ms, J) of a step's all-reduces over ``rows`` tokens' hidden states."""
        if self.gpus == 1:
            return 0.0, 0.0
        calls, nbytes = ALLREDUCES_PER_LAYER * self.layers, rows * self.hidden * ACTIVATION_BYTES
        return (calls * self.allreduce.time_s(nbytes, self.gpus) * 1e3,
                calls * self.allreduce.energy_j(nbytes, self.gpus))

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step of ``batch`` sequences over every GPU."""
        ms, j = self.per_gpu.decode_step(plan, batch, context)
        ar_ms, ar_j = self._allreduces(batch)
        return ms + ar_ms, j * self.gpus + ar_j

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of one request's prefill over every GPU."""
        ms, j = self.per_gpu.prefill(plan, length)
        ar_ms, ar_j = self._allreduces(length)
        return ms + ar_ms, j * self.gpus + ar_j

    def step_source(self, plan: Plan) -> str:
        """The label of the model whose step times price ``plan``: this one's."""
        return self.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        one = self.per_gpu.estimate(plan, workload)  # its label, with what it noticed pricing the shapes
        if self.gpus == 1:
            return one
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step_ms, step_j = self.decode_step(plan, b, lin + lout / 2)
        _, pre_j = self.prefill(plan, lin)
        return EnergyEstimate.of_request(workload, pre_j, step_j, b / (step_ms / 1e3), self._label(one.source),
                                         measured=False)


def predicted_for_gpus(shape: ModelShape, target: GPU, gpus: int, model_config: Any = None,
                       store: Any = None) -> PredictedModel:
    """The predicted tier of ``shape`` served over ``gpus`` GPUs of ``target``'s kind: today's predicted tier for
    one, else :class:`TensorParallelEnergyModel` over the tiers from the GPU profile on, priced on the shard."""
    from advisor.energy.prediction._tiers import make_predicted_model

    if gpus == 1:
        return make_predicted_model(shape, target, model_config=model_config, store=store)
    per_gpu = make_predicted_model(shard_shape(shape, gpus), target, store=store, per_model=False)
    return TensorParallelEnergyModel(per_gpu, gpus, shape.hidden_size, shape.num_layers)
