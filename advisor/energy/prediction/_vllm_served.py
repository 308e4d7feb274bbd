"""The predicted tier as vLLM serves a plan: its steady state (TPOT, TTFT, J/token, tokens/s) from vLLM steps
(:mod:`advisor.energy.prediction._vllm_step`), and the operating batches on vLLM's CUDA-graph sizes. torch-free.

B requests in flight, each for ``L_out`` tokens: a step admits ``k`` new prompts, Poisson with mean
``lambda = B / L_out`` (as :mod:`advisor.search.operating`), and runs them with the decodes, chunked over further
steps where they do not fit the token budget. A step of ``k`` admissions and the steps its chunks spill into make
one cycle of ``n_k`` steps costing ``T_k`` ms and ``J_k``; with ``p_k`` the Poisson weights (a cycle of ``n``
steps admits ``B n / L_out`` prompts on average, ``n`` averaged over the cycles by iteration):

- mean step ``m = sum p_k T_k / sum p_k n_k``; tokens/s ``B / m``; J/token ``sum p_k J_k / (B sum p_k n_k)``;
- TPOT at quantile q: ``m + z_q sd`` over a request's ``L_out`` steps (``sd``: the spread of ``T_k - m n_k``
  over the cycles it lives through; z of the normal distribution: the Poisson quantile of the built-in model's
  TPOT for a step linear in ``k``);
- TTFT at quantile q: the wait for the step in flight (q of one) and the engine's scheduling lag
  (``admission_steps``), then the cycle that carries the prompt with the ``Poisson_q(lambda)`` others admitted
  with it;
- the GPU's power limit holds the mix, not each step: where the mean power ``sum p_k J_k / sum p_k T_k`` exceeds
  it, every step runs longer by ``(P / limit)^(1/3)`` at the limit (:func:`at_power_limit` once, over the mean).
  The limiter averages over many steps of a few ms, so a prompt's step above the limit among decodes below it
  is not slowed on its own; the device costs come uncapped (``without_step_cap``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import metadata
from typing import NamedTuple

import numpy as np
from scipy.stats import norm, poisson

from advisor.energy.prediction._gpu_costmodel import at_power_limit
from advisor.energy.prediction._vllm_moe import MoeKernelTable, VllmMoeDevice, without_routed_experts
from advisor.energy.prediction._vllm_step import (
    EngineTerms,
    StepCost,
    VllmServing,
    VllmSteps,
    capture_sizes,
    split_prompts,
)
from advisor.estimate import EnergyEstimate
from advisor.formats import GPU, GPU_SPECS
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.operating import QUANTILE, SteadyState, within_cap

TAIL = 1e-9  # Poisson weight left out of a cycle's expectation
#: what a mixture of experts' prediction misses where the profile has no measured fused MoE for its geometry and
#: formats (reports/benchmarks/vllm_step_check_h200_moe_before_table.md)
MOE_KERNELS_NOTE = ("vLLM's fused MoE is not measured for this MoE's experts on this GPU kind: the routed experts are "
                    "priced from the device costs below; so priced, Qwen3-30B-A3B's all-FP8 (H200, 2026-11-30) came "
                    "out 47-95% above what vLLM served in TPOT and its operating batches 25-75% below: check with "
                    "`advisor verify`")
_GRID_CEILING = 1 << 20
#: the share of a TPOT objective an operating batch is kept under (advisor.search.operating): the step model's TPOT
#: RMS error over the rows vLLM served, with the GPU fed, of shapes it was not fitted on
#: (reports/benchmarks/engine_true.md); aimed at the objective itself, about half the predicted batches were above
#: the largest that met as served. The same report's margin table: 3.5% is where the predicted batch is most often
#: within 10% of the largest that met (39 of 45), with 6 of 45 at or above a batch that missed (17 at no margin)
TPOT_MARGIN = 0.035


def installed_vllm_version() -> str | None:
    """The vLLM version installed here (its package metadata; vLLM is not imported), or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


class Cycle(NamedTuple):
    """A step that admits prompts and the steps its chunks spill into: ms, J, how many steps, and the ms of them the
    GPU is busy (:attr:`StepCost.busy_share`)."""

    ms: float
    joules: float
    steps: int
    busy_ms: float


@lru_cache(maxsize=4096)
def poisson_weights(lam: float) -> tuple[float, ...]:
    """P(k) of a Poisson count of mean ``lam`` for k = 0, 1, ... until all but :data:`TAIL` is covered, normalised
    (one vectorised call: a served steady state asks for thousands)."""
    ks = np.arange(int(poisson.ppf(1 - TAIL, lam)) + 1)
    weights = poisson.pmf(ks, lam)
    return tuple(float(w) for w in weights / weights.sum())


@lru_cache(maxsize=8)
def graph_batches(limit: int) -> tuple[int, ...]:
    """vLLM's CUDA-graph sizes up to ``limit`` (a decode batch runs padded to the next one, so only these batches
    differ in step time), and ``limit`` itself: the operating batches vLLM can be held at."""
    sizes = [b for b in capture_sizes(_GRID_CEILING, _GRID_CEILING) if b <= limit]
    return tuple(sizes if sizes and sizes[-1] == limit else [*sizes, limit]) if limit >= 1 else ()


class VllmServedModel:
    """An :class:`~advisor.estimate.EnergyModel` pricing each plan as vLLM serves it, from ``builtin`` (a predicted
    tier's step model: the device's costs) and a vLLM step profile (the engine's terms)."""

    measured = False
    tpot_margin = TPOT_MARGIN

    def __init__(self, builtin, shape: ModelShape, target: GPU, profile: dict, installed: str | None = None) -> None:
        self.builtin, self.shape, self.gpu = builtin, shape, GPU_SPECS[target]
        self.profile = profile
        params = profile["params"]
        self.terms = EngineTerms(**{k: float(params[k]) for k in (*EngineTerms.NAMES, "gap_power_w")})
        self.steps = VllmSteps(builtin.without_step_cap(), self.terms, shape.num_layers)
        self.gpus = builtin.gpus
        self.power_limit_w = self.gpu.tdp_w * self.gpus  # every GPU the steps' energy is of
        self.vllm_version = str(profile["vllm_version"])
        self.installed = installed
        self.label = self._words(builtin.label, isinstance(builtin, VllmMoeDevice))

    def _words(self, builtin_label: str, moe_kernels: bool = False) -> str:
        """``builtin_label`` ("predicted[ for N GPUs] (...)") with the vLLM step model named first inside (and, for a
        MoE whose experts are not priced from vLLM's measured fused MoE, what that leaves out)."""
        p = self.profile
        head, _, inner = builtin_label.partition(" (")
        inner = inner.removesuffix(")")
        words = (f"vLLM {self.vllm_version} step model: engine terms fitted on {p['gpu']}, driver {p['driver']}, "
                 f"{p['date']}")
        if p.get("anchor"):
            words += f"; {p['anchor']['label']}"
            if self.gpus > 1 and p["anchor"].get("several_gpus"):  # the anchor is an 8B's on one GPU
                words += f"; over several GPUs {p['anchor']['several_gpus']}"
        if self.shape.is_moe and not moe_kernels:
            words += f"; {MOE_KERNELS_NOTE}"
        words += f"; device costs from {inner}"
        if self.installed and self.installed != self.vllm_version:
            words += (f"; vLLM {self.installed} is installed, but the profile is of vLLM {self.vllm_version}: its "
                      "engine terms may not hold for it")
        return f"{head} ({words})"

    def with_terms(self, terms: EngineTerms) -> VllmServedModel:
        """This model with other engine terms (the built-in costs it has read are kept: a fit changes only these)."""
        self.terms = self.steps.terms = terms
        return self

    # ------------------------------------------------------------------ steps and cycles
    def serving(self, workload: Workload, batch: int) -> VllmServing:
        return VllmServing.as_advisor_serves(batch, workload.input_tokens, workload.output_tokens, self.gpu)

    def cycle(self, plan: Plan, workload: Workload, batch: int, admitted: int, serving: VllmServing,
              cap_w: float | None = None) -> Cycle:
        """A step that admits ``admitted`` prompts and the steps its chunks spill into."""
        context = workload.input_tokens + workload.output_tokens / 2
        room = serving.max_num_batched_tokens - batch
        ms = joules = busy = 0.0
        chunks_by_step = split_prompts(admitted, workload.input_tokens, room)
        for chunks in chunks_by_step:
            s: StepCost = self.steps.step(plan, batch, context, chunks, serving)
            t, j = within_cap(s.ms, s.joules, cap_w)
            ms, joules, busy = ms + t, joules + j, busy + s.busy_share * t
        return Cycle(ms, joules, len(chunks_by_step), busy)

    def served_state(self, plan: Plan, workload: Workload, batch: int, power_cap_w: float | None = None,
                     serving: VllmServing | None = None) -> SteadyState:
        """The steady state of ``workload`` at ``batch`` in flight, as vLLM serves it (module docstring), in an
        engine sized as the advisor serves (``serving``: another engine's sizes)."""
        lout = workload.output_tokens
        serving = serving or self.serving(workload, batch)
        cycles: dict[int, Cycle] = {}

        def at(k: int) -> Cycle:
            if k not in cycles:
                cycles[k] = self.cycle(plan, workload, batch, k, serving, power_cap_w)
            return cycles[k]

        lam, steps_per_cycle = batch / lout, 1.0
        for _ in range(3):  # admissions per cycle that keep B tokens a step balancing B / L_out requests a step
            lam = batch / lout * steps_per_cycle
            weights = poisson_weights(lam)
            steps_per_cycle = sum(w * at(k).steps for k, w in enumerate(weights))
        raw_ms = sum(w * at(k).ms for k, w in enumerate(weights))
        e_ms, e_j = at_power_limit(raw_ms, sum(w * at(k).joules for k, w in enumerate(weights)), self.power_limit_w)
        slow = e_ms / raw_ms  # 1 below the power limit
        mean_step = e_ms / steps_per_cycle
        spread = sum(w * (slow * at(k).ms - mean_step * at(k).steps) ** 2 for k, w in enumerate(weights))
        q = QUANTILE[workload.quantile]
        tpot = mean_step + float(norm.ppf(q)) * math.sqrt(spread / (steps_per_cycle * lout))
        others = int(poisson.ppf(q, lam))
        ttft = (q + self.terms.admission_steps) * mean_step + slow * at(1 + others).ms
        return SteadyState(batch=batch, tpot_ms=tpot, ttft_ms=ttft, j_per_token=e_j / (batch * steps_per_cycle),
                           tokens_per_s=batch / (mean_step / 1e3), power_w=e_j / (e_ms / 1e3),
                           busy_share=sum(w * at(k).busy_ms for k, w in enumerate(weights)) / raw_ms)

    def batch_grid(self, limit: int) -> list[int]:
        """The batches an operating point is searched over: vLLM's CUDA-graph sizes up to ``limit``."""
        return list(graph_batches(limit))

    # ------------------------------------------------------------------ the EnergyModel interface
    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one step of ``batch`` decodes at ``context`` (a FULL graph, padded), engine terms included."""
        s = self.steps.step(plan, batch, context, [], VllmServing.as_advisor_serves(batch, 0, int(context), self.gpu))
        return at_power_limit(s.ms, s.joules, self.power_limit_w)  # the step repeated: its own mean

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of one ``length``-token prompt run alone (its chunks' steps), engine terms included."""
        serving = VllmServing.as_advisor_serves(1, length, 1, self.gpu)
        ms = joules = 0.0
        for chunks in split_prompts(1, length, serving.max_num_batched_tokens):
            s = self.steps.step(plan, 0, 0.0, chunks, serving)
            ms, joules = ms + s.ms, joules + s.joules
        return at_power_limit(ms, joules, self.power_limit_w)

    def without_step_cap(self) -> VllmServedModel:
        """Itself: its steady state holds the mix of steps to the power limit, no step on its own."""
        return self

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """Its built-in tier's answer: the passes it prices are that tier's."""
        return self.steps.builtin.pass_is_decode_step(plan)

    def step_source(self, plan: Plan) -> str:
        """The label of what prices ``plan``'s steps (the built-in tier's fallback named where it takes over)."""
        moe_kernels = isinstance(self.builtin, VllmMoeDevice) and self.builtin.covers(plan)
        return self._words(self.builtin.step_source(plan), moe_kernels)

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        """J/token of ``workload`` at its batch as vLLM serves it: the steady state's, the prefill's share split
        out as the decode-only step's J against the rest."""
        state = self.served_state(plan, workload, workload.batch_size)
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        _, step_j = self.decode_step(plan, b, lin + lout / 2)
        decode = min(step_j / b, state.j_per_token)
        return EnergyEstimate(workload=workload.name, j_per_token=state.j_per_token, decode_j_per_token=decode,
                              prefill_j_per_input_token=(state.j_per_token - decode) * lout / lin,
                              decode_tokens_per_s=state.tokens_per_s, source=self.step_source(plan), measured=False)


def priced_engine(engine: str, measured_here: bool) -> str | None:
    """The step model the predicted tier prices plans by (:class:`advisor.engines.Engine`'s ``step_model``): that of
    the engine serving them, where it has one (vLLM's); the export's default engine's where the built-in runtime is
    the engine but measures nothing in this run (the plans will be served from their export); None (the built-in
    runtime's profiles, as they are) where the runtime measures them (predicted and measured then compare like with
    like) or the engine has no step model here (TensorRT-LLM)."""
    from advisor.engines import engine as engine_entry
    from advisor.engines import export_served_by

    chosen = engine_entry(engine)
    if chosen.tier is None and not measured_here:
        chosen = export_served_by()
    return chosen.step_model


def as_served(predicted, shape: ModelShape, target: GPU, priced: str | None):
    """``predicted`` (a predicted tier) as the plans are served (``priced``: :func:`priced_engine`): wrapped in vLLM's
    step model where that is the step model and a vLLM step profile is shipped for ``target``; else ``predicted``."""
    from advisor.energy.profiling import shipped_vllm_profile

    if priced is None:
        return predicted
    profile = shipped_vllm_profile(target)
    if profile is None:
        return predicted
    return VllmServedModel(vllm_device(predicted, shape, target, profile.get("moe_kernels")), shape, target, profile,
                           installed_vllm_version())


def vllm_device(predicted, shape: ModelShape, target: GPU, moe_kernels: dict | None):
    """The device costs of ``shape``'s steps in vLLM: ``predicted`` (a predicted tier), or for a MoE on one GPU with
    a measured table of vLLM's fused MoE (a vLLM step profile's ``moe_kernels``), its routed experts from the table
    and the rest from the GPU profile's layer model, ``predicted`` for plans the table does not hold
    (:mod:`advisor.energy.prediction._vllm_moe`)."""
    if not (shape.is_moe and moe_kernels and predicted.gpus == 1):
        return predicted
    from advisor.energy.prediction._tiers import make_predicted_model

    rest = make_predicted_model(without_routed_experts(shape), target, per_model=False)
    return VllmMoeDevice(rest, MoeKernelTable(moe_kernels), shape, predicted)
