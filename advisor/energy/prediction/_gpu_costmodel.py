"""Predict a plan of a model nobody profiled, from a GPU profile (:mod:`advisor.energy.profiling`).

Time of a step (a decode step of ``b`` sequences at context ``c``, or the prefill of one
request of ``L`` tokens, ``x`` = ``b`` or ``L`` rows):

* GEMMs: each group's GEMM in its format at ``x`` rows, read from the measured table at the
  group's ``(N, K)`` (linear in ``x`` between row buckets); the BF16 lm_head likewise at ``b``
  rows (one row in prefill). A shape outside the table scales the nearest one's time above
  the kernel floor (the fastest GEMM at ``x`` rows) by the weight-count ratio, and says so;
* the rest (norms, attention, activation, quantization, embedding; the gaps between kernels):
  ``layers x (floor_f + per-activation-byte + per-KV-byte)`` plus a constant, the per-layer
  kernel floor ``floor_f`` per format; fitted (non-negative least squares, relative errors)
  to the anchor models' measured steps minus their table GEMMs.

Energy of a step: ``P_0 x time + e_byte x bytes + e_bf16 x BF16 FLOPs + e_fp8 x FP8 FLOPs``:
a static power while the GPU works (idle and clocks), a cost per HBM byte (weights in their
format, KV cache, activations) and per tensor-core FLOP of each format, fitted to the anchors'
measured joules (steps below 95% of the power limit). Where that power exceeds the GPU's power
limit (large prefills), the GPU lowers its clocks: the step runs at the limit, longer by the
cube root of the excess (:func:`at_power_limit`). torch-free; numpy and scipy fit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from advisor.energy.prediction._layer_costmodel import check_profiled
from advisor.energy.profiling import (
    CAPPED_SHARE,
    FORMATS,
    GemmEnergy,
    GemmTable,
    Geometry,
    anchor_layer_weights,
    anchor_steps,
    layer_weights,
    rest_features,
    step_parts,
    validate_gemm_energy_section,
    validate_gpu_profile,
)
from advisor.errors import InputError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload


def ng_features(parts: dict[str, Any], phase: str) -> list[float]:
    """Non-GEMM time features: layers (the per-layer kernel floor), activation bytes, KV bytes (decode)
    or attention FLOPs (prefill), and 1."""
    third = parts["kv_bytes"] if phase == "decode" else parts["attn_flops"]
    return [parts["layers"], parts["act_bytes"], third, 1.0]


def energy_features(t_ms: float, parts: dict[str, Any]) -> list[float]:
    return [t_ms / 1e3, parts["bytes"], parts["flops"][Format.BF16], parts["flops"][Format.FP8]]


EnergyFeatures = Callable[[float, dict[str, Any]], list[float]]


def fit_gpu_profile(profile: dict[str, Any], features: EnergyFeatures = energy_features) -> dict[str, Any]:
    """Fit the non-GEMM time (per phase and format) and the energy coefficients (of ``features``: the shipped
    form unless a benchmark compares another) to the anchors."""
    import numpy as np
    from scipy.optimize import nnls

    ng_rows: dict[tuple[str, Format], list] = {}
    e_rows: list = []
    cap_w = CAPPED_SHARE * profile["power_limit_w"]
    for step in anchor_steps(profile, GemmTable(profile)):
        t, parts, phase = step["t_ms"], step["parts"], step["phase"]
        ng_rows.setdefault((phase, step["format"]), []).append((ng_features(parts, phase), t - parts["gemm_ms"]))
        j = step["j"]
        if j is not None and j / (t / 1e3) < cap_w:  # a step at the power limit follows the cap rule, not the fit
            e_rows.append((features(t, parts), j))
    if not e_rows:
        raise InputError("the GPU profile has no anchor models to fit its non-GEMM and energy terms to")

    def solve(rows) -> list[float]:
        a = np.array([r for r, _ in rows], dtype=float)
        y = np.array([v for _, v in rows], dtype=float)
        scale = a.max(axis=0)
        scale[scale == 0] = 1.0
        w = 1.0 / np.maximum(np.abs(y), 1e-12)  # relative errors
        coef, _ = nnls(a / scale * w[:, None], y * w)
        return list(coef / scale)

    return {
        "non_gemm": _shared_constant_fit(ng_rows, solve),
        "energy": solve(e_rows),
        "anchors": sorted(profile["anchors"]),
    }


def _shared_constant_fit(ng_rows: dict[tuple[str, Format], list], solve) -> dict[str, list[float]]:
    """Per phase, one fit over both formats: a per-layer floor, per-byte terms per format, and one constant
    (embedding, final norm, the step's launch: the same kernels in every format). Fitted per format, anchors
    of many layers leave the constant ill-determined, and a model of few layers then pays a constant of the
    wrong format."""
    out: dict[str, list[float]] = {}
    for phase in sorted({ph for ph, _ in ng_rows}):
        fmts = [f for f in FORMATS if (phase, f) in ng_rows]
        rows = []
        for i, f in enumerate(fmts):
            for feats, y in ng_rows[(phase, f)]:
                per = [0.0] * (3 * len(fmts))
                per[3 * i:3 * i + 3] = feats[:3]
                rows.append((per + [feats[3]], y))
        coef = solve(rows)
        for i, f in enumerate(fmts):
            out[f"{phase}:{f.value}"] = [*coef[3 * i:3 * i + 3], coef[-1]]
    return out


def at_power_limit(t_ms: float, energy_j: float, limit_w: float) -> tuple[float, float]:
    """(ms, J) of a step whose predicted power exceeds the power limit: the GPU lowers its clocks
    until it draws the limit; with dynamic power ~ f^3 (voltage following frequency), the step
    takes (P / limit)^(1/3) longer, at the limit."""
    power = energy_j / (t_ms / 1e3)
    if power <= limit_w:
        return t_ms, energy_j
    t = t_ms * (power / limit_w) ** (1 / 3)
    return t, limit_w * t / 1e3


def outside_anchors(geo: Geometry, sizes: list[float]) -> str:
    """A label note for a model whose layers are smaller or larger than every anchor's (``sizes``: their weights
    per layer): the fitted floors and power split are extrapolated there (reports/benchmarks/energy_transfer*.md)."""
    mine = layer_weights(geo)
    if not sizes or min(sizes) <= mine <= max(sizes):
        return ""
    return (f"; its layers ({mine / 1e6:.0f}M weights) lie outside the anchors' ({min(sizes) / 1e6:.0f}-"
            f"{max(sizes) / 1e6:.0f}M): extrapolated")


def llama_like(model_type: str) -> bool:
    """Whether a text model type's layers are what the anchors measured (its adapter says; "": a shape stored
    before adapters existed, a Llama one)."""
    from advisor.models.adapters import ADAPTERS

    return model_type == "" or (model_type in ADAPTERS and ADAPTERS[model_type].llama_like)


class GpuProfileCostModel:
    """An :class:`~advisor.estimate.EnergyModel` from a shipped GPU profile (no per-model profile)."""

    measured = False
    gpus = 1

    def __init__(self, profile: dict[str, Any], shape: ModelShape, features: EnergyFeatures = energy_features) -> None:
        self.p = validate_gpu_profile(profile)
        self.features = features
        self.cap_steps = True  # each step held to the power limit (:func:`at_power_limit`)
        self.fit = profile.get("fit") or fit_gpu_profile(profile, features)
        self.geo = Geometry.from_shape(shape)
        self.table = GemmTable(profile)
        self.formats = {Format(f) for f in profile["formats"]}
        tag = "" if profile.get("verified", False) else ", unverified"
        # The anchors that fit the non-GEMM part are Llama/Qwen2-like layers (two norms, SwiGLU, no QK
        # norm); other families' extra per-layer kernels are priced as if they were the same.
        like = "" if llama_like(shape.model_type) else \
            f"; {shape.family or shape.model_type} non-GEMM work priced as Llama-like layers"
        caveat = f"; {profile['caveat']}" if profile.get("caveat") else ""  # a known flaw of this profile
        self.gemm_energy, self.blend = self._metered_gemm_energy(profile)
        n_fit = len(self.fit["anchors"])
        if self.gemm_energy is None:
            energy = (f"GEMM tables and {n_fit} anchor models{like}"
                      f"{outside_anchors(self.geo, anchor_layer_weights(profile['anchors']))}")
        else:
            section = profile["gemm_energy"]
            units = section["units"]
            metered = (f"GEMM energies metered on {'one unit' if len(units) == 1 else f'{len(units)} units'} "
                       f"{max(u['date'] for u in units)} and a rest fitted to {len(section['anchors'])} anchor "
                       f"models metered with them")
            outside = outside_anchors(self.geo, section["anchor_layer_weights"])
            energy = (f"GEMM tables; energy the mean of a form fitted to {n_fit} anchor models and of {metered}"
                      if self.blend else f"GEMM tables, {metered}") + f"{like}{outside}"
        yours = f", yours: {profile['stored']}" if profile.get("stored") else ""  # measured by the user
        self.label = (f"predicted (GPU profile {profile['gpu']}, {profile.get('source', 'measured')} "
                      f"{profile['date']}{tag}{yours}: {energy}{caveat})")

    def _metered_gemm_energy(self, profile: dict[str, Any]) -> tuple[GemmEnergy | None, bool]:
        """The profile's metered GEMM energies (:class:`~advisor.energy.profiling.GemmEnergy`) where it has them,
        else None (the fitted energy form alone); and whether this model's energy is the mean of both forms: a model of
        layers below the section's ``min_layer_weights``, where its ``small_layers`` rule says ``mean``."""
        section = profile.get("gemm_energy")
        if section is None:
            return None, False
        validate_gemm_energy_section(section, "the GPU profile")
        if layer_weights(self.geo) >= section["min_layer_weights"]:
            return GemmEnergy(section), False
        if section.get("small_layers", "fitted") == "mean":
            return GemmEnergy(section), True
        return None, False

    def _step(self, plan: Plan, phase: str, x: float, context: float) -> tuple[float, float]:
        check_profiled(plan, self.formats, f"{self.p['gpu']} profile")
        parts = step_parts(self.geo, self.table, dict(plan.formats), phase, x, context)
        feats = ng_features(parts, phase)
        ng = 0.0
        for f in FORMATS:
            coef = self.fit["non_gemm"][f"{phase}:{f.value}"]
            ng += parts["share"][f] * sum(a * b for a, b in zip(coef, feats, strict=True))
        t = parts["gemm_ms"] + ng
        energy = sum(a * b for a, b in zip(self.fit["energy"], self.features(t, parts), strict=True))
        if self.cap_steps:
            t, energy = at_power_limit(t, energy, self.p["power_limit_w"])
        if self.gemm_energy is not None:  # metered as they ran, at the power limit where they reached it
            rest = self.p["gemm_energy"]["rest"]
            metered = self.gemm_energy.step_j(self.geo, dict(plan.formats), phase, x) + sum(
                a * b for a, b in zip(rest, rest_features(t, parts), strict=True))
            energy = (energy + metered) / 2 if self.blend else metered
        return t, energy

    def without_step_cap(self) -> GpuProfileCostModel:
        """This model with each step's cost as fitted, not held to the power limit on its own (a copy: the tier's
        own rule stands)."""
        other = copy.copy(self)
        other.cap_steps = False
        return other

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """True: a decode step's GEMMs come from the measured table at its row count, however many rows; its
        prefill adds a non-GEMM floor fitted on prompts (larger per layer than the decode fit's, FP8's most), which a
        pass of decodes does not pay (reports/energy_model.md, the held-out Qwen2.5-7B)."""
        return True

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        return self._step(plan, "decode", batch, context)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        return self._step(plan, "prefill", length, length)

    def step_source(self, plan: Plan) -> str:
        """The label of the model whose step times price ``plan``: this one's."""
        return self.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step_ms, step_j = self.decode_step(plan, b, lin + lout / 2)
        _, pre_j = self.prefill(plan, lin)
        label = self.label
        if self.table.approximate or (self.gemm_energy is not None and self.gemm_energy.approximate):
            label = f"{label[:-1]}; GEMM shapes outside the table scaled from the nearest)"
        return EnergyEstimate.of_request(workload, pre_j, step_j, b / (step_ms / 1e3), label, measured=False)
