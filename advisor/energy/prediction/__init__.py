"""Predicted energy per token of a plan, from a profile and no GPU: the cost models, and one registry of
predicted tiers (:data:`PREDICTED_TIERS`, name -> where its profile comes from and what prices from it)
that chooses among them; ``make_energy_tiers`` pairs the predicted tier with the measured one; ``as_served``
prices a predicted tier's plans as vLLM serves them (``_vllm_step``: one step; ``_vllm_served``: the steady
state)."""

from advisor.energy.prediction._gpu_costmodel import (
    EnergyFeatures,
    GpuProfileCostModel,
    at_power_limit,
    energy_features,
    fit_gpu_profile,
    llama_like,
    ng_features,
    outside_anchors,
)
from advisor.energy.prediction._layer_costmodel import FP8_KV_NOTE, ProfileCostModel, check_profiled
from advisor.energy.prediction._model_costmodel import ModelProfileCostModel
from advisor.energy.prediction._roofline import PhaseCost, RooflineEnergyModel, decode_step_cost, prefill_cost
from advisor.energy.prediction._routing import (
    MEASURED_ROUTING_NOTE,
    UNIFORM_ROUTING_NOTE,
    expected_experts_touched,
    layer_experts_touched,
    routing_note,
    touched_share,
)
from advisor.energy.prediction._tensor_parallel import (
    ALLREDUCE,
    AllReduceCost,
    TensorParallelEnergyModel,
    predicted_for_gpus,
    shard_shape,
)
from advisor.energy.prediction._tiers import (
    ENERGY_MODES,
    PREDICTED_TIERS,
    PredictedTier,
    TierRequest,
    WithFallback,
    dims_or_none,
    gpu_here,
    make_energy_model,
    make_energy_tiers,
    make_predicted_model,
)
from advisor.energy.prediction._vllm_moe import MoeKernelTable, VllmMoeDevice, without_routed_experts
from advisor.energy.prediction._vllm_served import (
    VllmServedModel,
    as_served,
    graph_batches,
    installed_vllm_version,
    priced_engine,
    vllm_device,
)
from advisor.energy.prediction._vllm_step import (
    Chunk,
    EngineTerms,
    StepCost,
    VllmServing,
    VllmSteps,
    capture_sizes,
    padded,
    split_prompts,
)

__all__ = [
    "ALLREDUCE", "AllReduceCost", "TensorParallelEnergyModel", "predicted_for_gpus", "shard_shape",
    "ENERGY_MODES", "FP8_KV_NOTE", "MEASURED_ROUTING_NOTE", "PREDICTED_TIERS",
    "UNIFORM_ROUTING_NOTE", "EnergyFeatures", "GpuProfileCostModel", "ModelProfileCostModel", "PhaseCost",
    "PredictedTier", "ProfileCostModel", "RooflineEnergyModel", "TierRequest", "WithFallback", "at_power_limit",
    "check_profiled", "decode_step_cost", "dims_or_none", "energy_features", "expected_experts_touched",
    "fit_gpu_profile", "gpu_here", "layer_experts_touched", "llama_like", "make_energy_model", "make_energy_tiers",
    "make_predicted_model", "ng_features", "outside_anchors", "prefill_cost", "routing_note", "touched_share",
    "Chunk", "EngineTerms", "StepCost", "VllmServedModel", "VllmServing", "VllmSteps", "as_served", "capture_sizes",
    "graph_batches", "installed_vllm_version", "padded", "priced_engine", "split_prompts",
    "MoeKernelTable", "VllmMoeDevice", "vllm_device", "without_routed_experts",
]
