"""Predict a plan's J/token from a hardware profile (no GPU needed).

Model, for a decode step at batch ``b`` and context ``c`` (prefill alike at length L):

* GEMM time of each group: the profile's time of one GEMM of that kind and format
  at ``b`` rows (piecewise linear in ``b``), scaled by the group's weight count over
  the profiled layer's when the model differs from the profiled one;
* non-GEMM time of the all-``f`` plan: its measured step minus its GEMMs (linear in
  ``c``); a mixed plan takes BF16's plus the FP8 share of groups times the
  difference (FP8 adds quantization work);
* energy: the BF16 step's measured J/step over its timed step (``P_b``, watts)
  over the non-GEMM time and the BF16 GEMMs, and an FP8-GEMM power ``P_f`` over the FP8 GEMMs, where ``P_f`` is
  the value that makes the all-FP8 plan's predicted energy equal its measured one.
  Powers are interpolated in log2(batch) between measured batches.

So all-BF16 and all-FP8 reproduce the profile's own measurements by construction;
mixed plans, other batches and contexts are predictions.

Models of another size are scaled, and the label says so ("scaled from ..."). Far
from the profiled size the scaling is extrapolation and is labelled that way: the
per-kernel launch floors and the low power of a latency-bound step are not in the
profile, and for SmolLM2-135M on an H100 it predicted 2-3x less energy than measured
(reports/benchmarks/costmodel_transfer.md).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from advisor.energy.profile import KINDS
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

# Per-layer weight ratios (model / profiled model) beyond which scaling is extrapolation.
EXTRAPOLATION_RANGE = (0.25, 4.0)


def interp(xs: Sequence[float], ys: Sequence[float], x: float, log_x: bool = False) -> float:
    """Piecewise-linear interpolation; linear extrapolation from the end segments."""
    if len(xs) == 1:
        return ys[0]
    f = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = f(xs[i - 1]), f(xs[i])
    t = (f(x) - x0) / (x1 - x0)
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def _kind(group_name: str) -> str:
    kind = group_name.rsplit(".", 1)[-1]
    if kind not in KINDS:
        raise InputError(f"group {group_name!r} is not one of the profiled kinds {KINDS}")
    return kind


class ProfileCostModel:
    """An :class:`~advisor.estimate.EnergyModel` backed by a measured (or derived) profile."""

    measured = False

    def __init__(self, profile: dict[str, Any], shape: ModelShape) -> None:
        self.p = profile
        self.shape = shape
        self.formats = {Format(f) for f in profile["formats"]}
        m = profile["model"]
        ref = {
            "qkv": m["hidden"] * (m["heads"] + 2 * m["kv_heads"]) * m["head_dim"],
            "o": m["heads"] * m["head_dim"] * m["hidden"],
            "gate_up": 2 * m["hidden"] * m["intermediate"],
            "down": m["intermediate"] * m["hidden"],
        }
        self._scale = {g.name: g.num_weights / ref[_kind(g.name)] for g in shape.groups}
        # non-GEMM part scales with layers x hidden when the model is not the profiled one
        self._ng_scale = (shape.num_layers * shape.hidden_size) / (m["num_layers"] * m["hidden"])
        self._ref_layers = m["num_layers"]
        self.per_layer_weight_ratio = (
            sum(g.num_weights for g in shape.groups) / shape.num_layers / sum(ref.values())
        )
        tag = "" if profile.get("verified", False) else ", unverified"
        self.label = (
            f"predicted (profile {profile['gpu']}, {profile.get('source', 'measured')} {profile['date']}{tag}"
            f"{self._scaling_note(m, shape)})"
        )

    def _scaling_note(self, m: dict[str, Any], shape: ModelShape) -> str:
        r = self.per_layer_weight_ratio
        if shape.num_layers == m["num_layers"] and all(abs(v - 1) < 1e-9 for v in self._scale.values()):
            return ""
        name = m.get("name", "profiled").split(",")[0]
        note = f"; scaled from its {name} ({r:.3g}x the weights per layer)"
        return note + (": extrapolated" if not EXTRAPOLATION_RANGE[0] <= r <= EXTRAPOLATION_RANGE[1] else "")

    # -- pieces ------------------------------------------------------------------
    def _check(self, plan: Plan) -> None:
        bad = set(plan.formats.values()) - self.formats
        if bad:
            names = ", ".join(sorted(f.value for f in bad))
            raise UnsupportedError(
                f"the {self.p['gpu']} profile has no {names} costs: the format does not run "
                f"natively there (profiled formats: {', '.join(sorted(self.p['formats']))})"
            )

    def _gemm(self, phase: dict, fmt: Format, kind: str, m: float) -> float:
        xs = phase["batches"] if "batches" in phase else phase["lengths"]
        return interp(xs, phase["gemm_ms"][fmt.value][kind], m)

    def _all_gemms(self, phase: dict, fmt: Format, m: float) -> float:
        return self._ref_layers * sum(self._gemm(phase, fmt, k, m) for k in KINDS)

    def _power(self, phase: dict, fmt: Format, x: float) -> float:
        """Measured J per step over the step's CUDA-event time (W), interpolated in log2(x).

        Anchoring to J/step (not to the meter's mean power) keeps the calibration
        points exact even where the sustained step runs slower than a short timed burst.
        """
        if "energy_batches" in phase:
            xs = phase["energy_batches"]
            c0 = str(phase["contexts"][0])
            t = [interp(phase["batches"], phase["step_ms"][fmt.value][c0], x_) for x_ in xs]
        else:
            xs = phase["lengths"]
            t = phase["step_ms"][fmt.value]
        watts = [j / (ms / 1e3) for j, ms in zip(phase["j_per_step"][fmt.value], t, strict=True)]
        return interp(xs, watts, x, log_x=True)

    def _step(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format, float]) -> tuple[float, float]:
        """(time ms, energy J) of one step given the all-format step times at this point."""
        fmts = [f for f in (Format.BF16, Format.FP8, Format.NVFP4) if f.value in phase["step_ms"]]
        ng = {f: step_ms[f] - self._all_gemms(phase, f, x) for f in fmts}
        gemm_ms = {f: 0.0 for f in fmts}
        for g in self.shape.groups:
            f = plan.format_of(g.name)
            gemm_ms[f] += self._gemm(phase, f, _kind(g.name), x) * self._scale[g.name]
        n = len(self.shape.groups)
        share = {f: sum(1 for v in plan.formats.values() if v == f) / n for f in fmts}
        t_ng = ng[Format.BF16] + sum(share[f] * (ng[f] - ng[Format.BF16]) for f in fmts if f != Format.BF16)
        t_ng *= self._ng_scale
        p_b = self._power(phase, Format.BF16, x)
        energy = p_b * (t_ng + gemm_ms[Format.BF16])
        for f in fmts:
            if f == Format.BF16 or gemm_ms[f] == 0.0:
                continue
            e_all = self._power(phase, f, x) * step_ms[f]
            p_f = (e_all - p_b * ng[f]) / self._all_gemms(phase, f, x)
            energy += p_f * gemm_ms[f]
        t = t_ng + sum(gemm_ms.values())
        return t, energy / 1e3

    # -- public --------------------------------------------------------------------
    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step of ``batch`` sequences at ``context``."""
        self._check(plan)
        d = self.p["decode"]
        ctxs = [int(c) for c in d["contexts"]]
        step_ms = {}
        for f, per_ctx in d["step_ms"].items():
            at_c = [interp(d["batches"], per_ctx[str(c)], batch) for c in ctxs]
            step_ms[Format(f)] = interp(ctxs, at_c, context)
        return self._step(d, plan, batch, step_ms)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of the prefill of one request of ``length`` tokens."""
        self._check(plan)
        d = self.p["prefill"]
        step_ms = {Format(f): interp(d["lengths"], v, length) for f, v in d["step_ms"].items()}
        return self._step(d, plan, length, step_ms)

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step_ms, step_j = self.decode_step(plan, b, lin + lout / 2)
        _, pre_j = self.prefill(plan, lin)
        return EnergyEstimate(
            workload=workload.name,
            j_per_token=(pre_j + lout * step_j / b) / lout,
            decode_j_per_token=step_j / b,
            prefill_j_per_input_token=pre_j / lin,
            decode_tokens_per_s=b / (step_ms / 1e3),
            source=self.label,
            measured=False,
        )
