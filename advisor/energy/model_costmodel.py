"""Predict any plan of a model from its own per-model profile (:mod:`advisor.energy.model_profile`).

At a decode step of batch ``b`` and context ``c`` (prefill alike, per prompt length):

* time: the all-BF16 step's non-GEMM part (its measured step minus its GEMMs), moved by each
  format's share of groups towards that format's non-GEMM part (FP8 adds the activation
  quantization in the norms), plus each group's own GEMM in its format at ``b`` rows. Steps
  and GEMMs are measured at this model's shapes, so kernel-launch floors and latency-bound
  small kernels are in them; times are linear in ``c`` and piecewise linear in ``b``;
* energy: each all-``f`` step's measured J (interpolated in log2(b) as a power over its timed
  step, linear in ``c`` between the profiled contexts). A mixed plan's energy is the all-BF16
  step's, plus the GPU's idle power (measured with the profile) over its time difference, plus,
  for each other format, the rest of that format's uniform-step difference in the share of the
  plan's weights it holds: what a GEMM in FP8 saves beyond time is dynamic energy (bytes read,
  multiply-adds), proportional to its weights, not to its kernel time, which for small GEMMs is a
  latency floor (H200, reports/benchmarks/energy_transfer_h200.md: Qwen2.5-0.5B's MLP-only FP8
  plan drew within 2% of all-FP8's power while its FP8 GEMMs took 64% of all-FP8's GEMM time).

So all-BF16 and all-FP8 reproduce the profile at its own points by construction; mixed plans,
other batches and contexts are predictions. torch-free.
"""

from __future__ import annotations

from typing import Any

from advisor.energy.costmodel import interp
from advisor.energy.model_profile import model_digest, validate_model_profile
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import DENSE_GROUP_KINDS, Plan
from advisor.recipe.schema import Workload


class ModelProfileCostModel:
    """An :class:`~advisor.estimate.EnergyModel` backed by this model's own measured profile."""

    measured = False

    def __init__(self, profile: dict[str, Any], shape: ModelShape) -> None:
        self.p = validate_model_profile(profile)
        layers = profile["model"]["layers"]
        if shape.num_layers != len(layers) or shape.hidden_size != profile["model"]["hidden"]:
            raise InputError(
                f"the per-model profile is of a {len(layers)}-layer model of hidden size "
                f"{profile['model']['hidden']}; this model has {shape.num_layers} layers of {shape.hidden_size}"
            )
        self.shape = shape
        self.formats = {Format(f) for f in profile["formats"]}
        self.kinds = {g.name: g.name.rsplit(".", 1)[-1] for g in shape.groups}
        bad = sorted({k for k in self.kinds.values() if k not in DENSE_GROUP_KINDS})
        if bad:
            raise InputError(f"the per-model profile prices dense groups {DENSE_GROUP_KINDS}, not {bad}")
        self.digest = model_digest(profile["model"])
        self.idle_w = float(profile["idle_power_w"])
        self.total_weights = sum(g.num_weights for g in shape.groups)
        self.label = (f"predicted (per-model profile, {profile['gpu']}, driver {profile['driver']}, "
                      f"{profile['date']}, model {self.digest})")

    def _check(self, plan: Plan) -> None:
        if plan.kv_cache != Format.BF16:
            raise UnsupportedError("the per-model profile has no FP8 KV-cache measurement")
        bad = set(plan.formats.values()) - self.formats
        if bad:
            raise UnsupportedError(f"the per-model profile ({self.p['gpu']}) has no "
                                   f"{', '.join(sorted(f.value for f in bad))} costs")

    @staticmethod
    def _xs(phase: dict) -> list[int]:
        return phase["batches"] if "batches" in phase else phase["lengths"]

    def _layer_gemm(self, phase: dict, fmt: Format, kind: str, x: float) -> float:
        return interp(self._xs(phase), phase["gemm_ms"][fmt.value][kind], x)

    def _all_gemms(self, phase: dict, fmt: Format, x: float) -> float:
        return self.shape.num_layers * sum(self._layer_gemm(phase, fmt, k, x) for k in DENSE_GROUP_KINDS)

    @staticmethod
    def _watts(xs: list[int], j: list[float], t: list[float], x: float) -> float:
        """Measured J/step over the step's CUDA-event time (W), interpolated in log2(x)."""
        return interp(xs, [jj / (ms / 1e3) for jj, ms in zip(j, t, strict=True)], x, log_x=True)

    def _decode_power(self, d: dict, fmt: Format, b: float, context: float) -> float:
        """W of the all-``fmt`` decode step, linear in the context between the energy contexts."""
        j = d["j_per_step"][fmt.value]
        if not isinstance(j, dict):  # energy at one context only
            j = {str(d["energy_context"]): j}
        ctxs = sorted(int(c) for c in j)
        return interp(ctxs, [self._watts(d["batches"], j[str(c)], d["step_ms"][fmt.value][str(c)], b)
                             for c in ctxs], context)

    def _step(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format, float],
              power: dict[Format, float]) -> tuple[float, float]:
        fmts = [f for f in (Format.BF16, Format.FP8) if f.value in phase["step_ms"]]
        ng = {f: step_ms[f] - self._all_gemms(phase, f, x) for f in fmts}
        gemm = {f: 0.0 for f in fmts}
        weights = {f: 0 for f in fmts}
        for g in self.shape.groups:
            f = plan.format_of(g.name)
            gemm[f] += self._layer_gemm(phase, f, self.kinds[g.name], x)
            weights[f] += g.num_weights
        n = len(self.shape.groups)
        share = {f: sum(1 for g in self.shape.groups if plan.format_of(g.name) == f) / n for f in fmts}
        t_ng = ng[Format.BF16] + sum(share[f] * (ng[f] - ng[Format.BF16]) for f in fmts if f != Format.BF16)
        t = t_ng + sum(gemm.values())
        e_bf16, t_bf16 = power[Format.BF16] * step_ms[Format.BF16], step_ms[Format.BF16]
        energy = e_bf16 + self.idle_w * (t - t_bf16)  # mJ
        for f in fmts:
            if f != Format.BF16 and weights[f]:
                dynamic = power[f] * step_ms[f] - e_bf16 - self.idle_w * (step_ms[f] - t_bf16)
                energy += dynamic * weights[f] / self.total_weights
        return t, energy / 1e3

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step of ``batch`` sequences at ``context``."""
        self._check(plan)
        d = self.p["decode"]
        ctxs = [int(c) for c in d["contexts"]]
        step_ms = {Format(f): interp(ctxs, [interp(d["batches"], v[str(c)], batch) for c in ctxs], context)
                   for f, v in d["step_ms"].items()}
        power = {f: self._decode_power(d, f, batch, context) for f in step_ms}
        return self._step(d, plan, batch, step_ms, power)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of the prefill of one request of ``length`` tokens."""
        self._check(plan)
        d = self.p["prefill"]
        step_ms = {Format(f): interp(d["lengths"], v, length) for f, v in d["step_ms"].items()}
        power = {f: self._watts(d["lengths"], d["j_per_step"][f.value], d["step_ms"][f.value], length)
                 for f in step_ms}
        return self._step(d, plan, length, step_ms, power)

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step_ms, step_j = self.decode_step(plan, b, lin + lout / 2)
        _, pre_j = self.prefill(plan, lin)
        return EnergyEstimate.of_request(workload, pre_j, step_j, b / (step_ms / 1e3), self.label, measured=False)
