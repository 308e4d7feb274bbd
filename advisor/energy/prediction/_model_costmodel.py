"""Predict any plan of a model from its own per-model profile (:mod:`advisor.energy.profiling`).

At a decode step of batch ``b`` and context ``c`` (prefill alike, per prompt length):

* time: the all-BF16 step's non-GEMM part (its measured step minus its GEMMs), moved by the share of
  groups in FP8 towards all-FP8's non-GEMM part (FP8 adds the activation quantization), per kind where
  the kind corner was profiled (:meth:`ModelProfileCostModel._non_gemm_ms`), plus each group's own GEMM
  in its format at ``b`` rows. Steps and GEMMs are measured at this model's shapes, so kernel-launch floors
  and latency-bound small kernels are in them; times are linear in ``c`` and piecewise linear in ``b``;
* energy: each all-``f`` step's measured J (interpolated in log2(b) as a power over its timed step, linear
  in ``c`` between the profiled contexts). A mixed plan's energy is the all-BF16 step's, plus the GPU's idle
  power (measured with the profile) over its time difference, plus, for each other format, the rest of that
  format's uniform-step difference in the share of the plan's weights it holds (of a MoE layer's routed
  experts, those the step reads): what a GEMM in FP8 saves beyond time is dynamic energy (bytes read,
  multiply-adds), proportional to its weights, not to its kernel time, which for small GEMMs is a latency
  floor (reports/benchmarks/energy_transfer_h200.md).
  Where the profile metered the kind corner (MLP in FP8, attention in BF16), all-FP8's saving is split by
  kind first: the MLP groups' part is the corner's saving, attention's the rest, each shared over its own
  kind's weights, because a kind's saving is not its share of the weights and a search's plans mix kinds
  freely (reports/benchmarks/layer_additivity.md).
  Where the profile metered the mixing point (every other layer in FP8), a prefill's line is bent, because
  plans that mix formats across layers draw more than the line in prefill: the bend is what the point drew
  over the line, times the plan's mixing relative to the point's (per kind, ``s (1 - s)`` of the share ``s``
  of its weights in FP8, weighted by the kind's part of the saving: zero at the other profiled plans).
  Decode steps stay on the line: a decode step's saving depends on which layers a plan holds in FP8, so the
  alternating point bent contiguous plans the wrong way (reports/benchmarks/profile_point_trials.md).
  Where the profile metered the position point (the last quarter of the layers in FP8, decode only), a decode
  step's saving is shared between the last quarter's groups and the rest by what that point saved (the same
  fraction for each kind), then within each by weight: the last layers save more than their weights' share,
  the middle ones less (reports/benchmarks/profile_point_trials.md).

So all-BF16, all-FP8, the kind corner and the position point reproduce the profile's energy at their own
points by construction (the position point's time comes from the line), the mixing point its prefill energy
over idle (its time comes from the line); mixed plans, other batches and contexts are predictions. A MoE
layer's routed experts are one group (kind ``experts``): their grouped GEMMs are priced like any group's, and
the router, sort and gathers sit in the non-GEMM part. torch-free.
"""

from __future__ import annotations

from typing import Any

from advisor.energy.prediction._layer_costmodel import check_profiled, interp
from advisor.energy.prediction._model_label import profile_label
from advisor.energy.prediction._routing import expected_experts_touched, layer_experts_touched
from advisor.energy.profiling import (
    ALT_FP8,
    CORNERS,
    LAST_QUARTER_FP8,
    MLP_FP8,
    POINTS,
    is_attention,
    last_quarter,
    last_quarter_format,
    mixing_format,
    model_digest,
    validate_model_profile,
)
from advisor.errors import InputError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload


class ModelProfileCostModel:
    """An :class:`~advisor.estimate.EnergyModel` backed by this model's own measured profile."""

    measured = False
    gpus = 1
    #: whether the mixing point bends decode steps too, as it did until 2026-11-23
    #: (benchmarks/profile_point_trials.py compares both)
    bend_decode = False

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
        profiled = tuple(next(iter(profile["decode"]["gemm_ms"].values())))
        bad = sorted({k for k in self.kinds.values() if k not in profiled})
        if bad:
            raise InputError(f"the per-model profile prices the groups {', '.join(profiled)}, not {bad}")
        self.routed = {g.name: layer for g in shape.groups if (layer := shape.routed_layer(g.name)) is not None}
        self.digest = model_digest(profile["model"])
        self.idle_w = float(profile["idle_power_w"])
        self.last_quarter = {g.name for g in shape.groups
                             if int(g.name.split(".")[1]) in last_quarter(shape.num_layers)}
        routing = ""
        if self.routed:
            routing = ("; MoE experts: routing measured on the calibration tokens"
                       if all(la.expert_load for la in self.routed.values())
                       else "; MoE experts: the profile's routing (random weights)")
        self.label = profile_label(profile, self.digest, routing)

    @staticmethod
    def _xs(phase: dict) -> list[int]:
        return phase["batches"] if "batches" in phase else phase["lengths"]

    def _layer_gemm(self, phase: dict, fmt: Format, kind: str, x: float) -> float:
        return interp(self._xs(phase), phase["gemm_ms"][fmt.value][kind], x)

    def _group_gemm(self, phase: dict, fmt: Format, group: str, x: float, profile_routing: bool = False) -> float:
        """``group``'s GEMM at ``x`` rows (routed experts: :meth:`_experts_gemm`)."""
        layer = self.routed.get(group)
        if layer is not None:
            return self._experts_gemm(phase, fmt, layer, x, profile_routing)
        return self._layer_gemm(phase, fmt, self.kinds[group], x)

    def _experts_gemm(self, phase: dict, fmt: Format, layer, x: float, profile_routing: bool) -> float:
        """A MoE layer's grouped expert GEMMs for ``x`` tokens: the profiled time per distinct expert read
        (interpolated in ``x``) times the distinct experts read. Those are this model's measured routing's
        expectation where the shape carries one; else (and for the profiled steps) the profile's own random
        routing: measured at the profiled points, the uniform expectation scaled to them in between (the
        count is concave in ``x``, so a line between profiled batches would miss it). Far apart profiled batches
        where the per-call floor dominates can be over-priced in between; searches profile their workloads' own
        batches (reports/benchmarks/moe_gpu.md)."""
        xs, ms, seen = self._xs(phase), phase["gemm_ms"][fmt.value]["experts"], phase["experts_touched"]
        per_expert = interp(xs, [m / d for m, d in zip(ms, seen, strict=True)], x)
        return per_expert * self._touched(phase, layer, x, profile_routing)

    def _touched(self, phase: dict, layer, x: float, profile_routing: bool) -> float:
        """Distinct routed experts of ``layer`` that ``x`` tokens read (see :meth:`_experts_gemm`)."""
        if layer.expert_load and not profile_routing:
            return layer_experts_touched(layer, x)
        xs, seen = self._xs(phase), phase["experts_touched"]
        uniform = [expected_experts_touched(layer.num_experts, layer.top_k, v) for v in xs]
        return expected_experts_touched(layer.num_experts, layer.top_k, x) * interp(
            xs, [d / u for d, u in zip(seen, uniform, strict=True)], x)

    def _all_gemms(self, phase: dict, plan: Format | str, x: float) -> float:
        """The GEMMs of a profiled step (with the profile's own routing): all-``fmt``, or the kind corner."""
        return sum(self._group_gemm(phase, self._profiled_format(plan, g.name), g.name, x, profile_routing=True)
                   for g in self.shape.groups)

    def _profiled_format(self, plan: Format | str, group: str) -> Format:
        """``group``'s format in a profiled plan: a uniform one, the kind corner, the mixing or the position point."""
        if plan == LAST_QUARTER_FP8:
            return last_quarter_format(group, self.shape.num_layers)
        return CORNERS[plan](group) if plan in CORNERS else Format(plan)

    @staticmethod
    def _measured(phase: dict, plan: Format | str) -> tuple[Any, Any]:
        """(j_per_step, step_ms) of a profiled plan: all-``fmt``, the kind corner, the mixing or position point."""
        if plan in POINTS:
            return phase[plan]["j_per_step"], phase[plan]["step_ms"]
        return phase["j_per_step"][Format(plan).value], phase["step_ms"][Format(plan).value]

    @staticmethod
    def _profiled_steps(phase: dict) -> dict[Format | str, Any]:
        """Each profiled plan's measured step ms (per context for decode): all-BF16, all-FP8, and the kind
        corner, the mixing point and the position point where the profile has them."""
        out: dict[Format | str, Any] = {Format(f): v for f, v in phase["step_ms"].items()}
        out.update({c: phase[c]["step_ms"] for c in POINTS if c in phase})
        return out

    @staticmethod
    def _watts(xs: list[int], j: list[float], t: list[float], x: float) -> float:
        """Measured J/step over the step's CUDA-event time (W), interpolated in log2(x)."""
        return interp(xs, [jj / (ms / 1e3) for jj, ms in zip(j, t, strict=True)], x, log_x=True)

    def _decode_power(self, d: dict, plan: Format | str, b: float, context: float, steps_at: dict[str, float],
                      step_ms: float) -> float:
        """W of a profiled decode step (all-``fmt``, or the kind corner) of ``step_ms`` at ``context``, given its
        ms at ``b`` rows at each profiled context (``steps_at``): its J, linear in the context between the energy
        contexts (the KV bytes a step reads are), over its time: interpolating the power instead (a product of two
        lines) would bend the energy between contexts."""
        j, measured_ms = self._measured(d, plan)
        if not isinstance(j, dict):  # energy at one context only
            j = {str(d["energy_context"]): j}
        ctxs = sorted(int(c) for c in j)
        if len(ctxs) == 1:  # its power, carried to other contexts
            c = str(ctxs[0])
            return self._watts(d["batches"], j[c], measured_ms[c], b)
        joules = [self._watts(d["batches"], j[str(c)], measured_ms[str(c)], b) * steps_at[str(c)] for c in ctxs]
        return interp(ctxs, joules, context) / step_ms

    def _step(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format | str, float],
              power: dict[Format | str, float]) -> tuple[float, float]:
        """(ms, J) of ``plan``'s step from the profiled steps' ms and W at ``x`` (keys: formats, the kind corner)."""
        t = self._non_gemm_ms(phase, plan, x, step_ms) + sum(
            self._group_gemm(phase, plan.format_of(g.name), g.name, x) for g in self.shape.groups)
        return t, (self.idle_w * t + self._dynamic_mj(phase, plan, x, step_ms, power)) / 1e3

    def _non_gemm_ms(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format | str, float]) -> float:
        """The step's time outside its GEMMs (norms, attention, activation and quantization kernels, launch gaps):
        the all-BF16 step's, moved toward all-FP8's by the share of groups in FP8; where the kind corner was
        profiled, the MLP groups move it by the corner's difference and attention's by the rest, each over its
        own kind's groups, so the corner's time is its measured one (sharing over all groups would not). Not by
        position: the non-GEMM difference between formats is the quantization kernels', a small difference that
        a ratio of differences would magnify."""
        # the same split as the energy's (:meth:`_line_mj`), over groups instead of weights
        ng = {k: ms - self._all_gemms(phase, k, x) for k, ms in step_ms.items()
              if k not in (ALT_FP8, LAST_QUARTER_FP8)}
        ones = {g.name: 1.0 for g in self.shape.groups}
        return self._line_mj(plan, ng, ones, ones)

    def _dynamic_mj(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format | str, float],
                    power: dict[Format | str, float]) -> float:
        """Energy over idle (mJ) on the line between all-BF16 and all-FP8 (:meth:`_line_mj`); a prefill's bent
        where the profile metered the mixing point: by what that point drew over the line, times the plan's
        mixing (:meth:`_mixing`, 1 at the mixing point, 0 at every other profiled plan). Decode steps are not
        bent (the module doc says why)."""
        dyn = {k: (power[k] - self.idle_w) * step_ms[k] for k in power}
        # weights each group reads: with the model's routing, and with the profile's (as its steps read them)
        read = {g.name: self._read_weights(phase, g, x) for g in self.shape.groups}
        profiled = {g.name: self._read_weights(phase, g, x, profile_routing=True) for g in self.shape.groups}
        energy = self._line_mj(plan, dyn, read, profiled)
        if ALT_FP8 not in dyn or Format.FP8 not in dyn:  # decode steps: not passed in (decode_step)
            return energy
        alt = Plan({g.name: mixing_format(g.name) for g in self.shape.groups})
        at_alt = self._mixing(alt, dyn, read, profiled)
        if at_alt <= 0:  # no saving to share: no line to bend
            return energy
        over_line = dyn[ALT_FP8] - self._line_mj(alt, dyn, read, profiled)
        return energy + over_line * self._mixing(plan, dyn, read, profiled) / at_alt

    def _line_mj(self, plan: Plan, dyn: dict[Format | str, float], read: dict[str, float],
                 profiled: dict[str, float]) -> float:
        """The all-BF16 step's energy over idle, less all-FP8's saving shared out by the weights read in FP8: the
        MLP groups' part from the kind corner where it was metered (else their weight share), the rest over
        attention's weights; each kind's part split between the last quarter's layers and the rest where the
        position point was metered (:meth:`_last_quarter_share`). With the profile's routing this is exact at
        the profiled plans; with the model's own routing the weights read move."""
        energy = dyn[Format.BF16] * sum(read.values()) / sum(profiled.values())
        if Format.FP8 not in dyn:
            return energy
        share = self._last_quarter_share(dyn)
        for groups, part, _ in self._kind_savings(dyn, profiled):
            subsets = [(groups, part)] if share is None else [
                ([g for g in groups if g in self.last_quarter], part * share),
                ([g for g in groups if g not in self.last_quarter], part * (1 - share))]
            for sub, sub_part in subsets:
                weights = sum(profiled[g] for g in sub)
                in_fp8 = sum(read[g] for g in sub if plan.format_of(g) == Format.FP8)
                if in_fp8 and weights:
                    energy -= sub_part * in_fp8 / weights
        return energy

    @staticmethod
    def _last_quarter_share(dyn: dict[Format | str, float]) -> float | None:
        """The last quarter's part of all-FP8's saving (0-1), from the position point; None where it was not
        metered (or this step passed none: prefill) or all-FP8 saves nothing to share."""
        if LAST_QUARTER_FP8 not in dyn:
            return None
        saving = dyn[Format.BF16] - dyn[Format.FP8]
        if saving <= 0:
            return None
        return min(1.0, max(0.0, (dyn[Format.BF16] - dyn[LAST_QUARTER_FP8]) / saving))

    @staticmethod
    def _kind_savings(dyn: dict[Format | str, float], profiled: dict[str, float]) -> list[tuple[list, float, float]]:
        """(groups, their part of all-FP8's saving, their weights) of the MLP groups and of attention."""
        total = sum(profiled.values())
        saving = dyn[Format.BF16] - dyn[Format.FP8]
        mlp, attention = _by_kind(list(profiled))
        mlp_w = sum(profiled[g] for g in mlp)
        mlp_saving = dyn[Format.BF16] - dyn[MLP_FP8] if MLP_FP8 in dyn else saving * mlp_w / total
        return [(mlp, mlp_saving, mlp_w), (attention, saving - mlp_saving, total - mlp_w)]

    @staticmethod
    def _mixing(plan: Plan, dyn: dict[Format | str, float], read: dict[str, float],
                profiled: dict[str, float]) -> float:
        """How much ``plan`` mixes formats across layers: per kind, ``s (1 - s)`` of the share ``s`` of that
        kind's weights in FP8, weighted by the kind's part of all-FP8's saving. Zero where each kind is all in
        one format (all-BF16, all-FP8, the kind corner), largest where half of every kind is in FP8."""
        saving = dyn[Format.BF16] - dyn[Format.FP8]
        out = 0.0
        for groups, part, _ in ModelProfileCostModel._kind_savings(dyn, profiled):
            weights = sum(read[g] for g in groups)
            if weights and saving:
                s = sum(read[g] for g in groups if plan.format_of(g) == Format.FP8) / weights
                out += part / saving * s * (1 - s)
        return out

    def _read_weights(self, phase: dict, group, x: float, profile_routing: bool = False) -> float:
        """Weights of ``group`` a step of ``x`` tokens reads: all of them, or for routed experts the
        distinct experts' share."""
        layer = self.routed.get(group.name)
        if layer is None:
            return float(group.num_weights)
        return group.num_weights * self._touched(phase, layer, x, profile_routing) / layer.num_experts

    def _interp_step(self, phase: dict, plan: Format | str, steps: list[float], x: float) -> float:
        """A profiled plan's step (all-``fmt``, or the kind corner) at ``x`` rows from its profiled ones: its
        non-GEMM part interpolated (smooth in ``x``), plus its GEMMs at ``x`` (a MoE step's expert GEMMs follow
        the concave count of distinct experts, which a straight line through the whole steps would miss)."""
        xs = self._xs(phase)
        ng = [t - self._all_gemms(phase, plan, v) for t, v in zip(steps, xs, strict=True)]
        return interp(xs, ng, x) + self._all_gemms(phase, plan, x)

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step of ``batch`` sequences at ``context``."""
        check_profiled(plan, self.formats, f"per-model profile ({self.p['gpu']})")
        d = self.p["decode"]
        ctxs = [int(c) for c in d["contexts"]]
        profiled = {p: ms for p, ms in self._profiled_steps(d).items() if p != ALT_FP8 or self.bend_decode}
        steps_at = {p: {str(c): self._interp_step(d, p, ms[str(c)], batch) for c in ctxs}
                    for p, ms in profiled.items()}
        step_ms = {p: interp(ctxs, [at[str(c)] for c in ctxs], context) for p, at in steps_at.items()}
        power = {p: self._decode_power(d, p, batch, context, at, step_ms[p]) for p, at in steps_at.items()}
        return self._step(d, plan, batch, step_ms, power)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of the prefill of one request of ``length`` tokens. A profile of one prompt length (a
        stored or shipped one, measured for other workloads) scales it per token: a step interpolated
        from one point would cost the same for any prompt."""
        check_profiled(plan, self.formats, f"per-model profile ({self.p['gpu']})")
        d = self.p["prefill"]
        if len(d["lengths"]) == 1 and length != d["lengths"][0]:
            ms, j = self.prefill(plan, d["lengths"][0])
            return ms * length / d["lengths"][0], j * length / d["lengths"][0]
        step_ms = {p: self._interp_step(d, p, ms, length) for p, ms in self._profiled_steps(d).items()}
        power = {p: self._watts(d["lengths"], *self._measured(d, p), length) for p in step_ms}
        return self._step(d, plan, length, step_ms, power)

    def without_step_cap(self) -> ModelProfileCostModel:
        """Itself: it holds no step to the power limit."""
        return self

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """False: a pass over as many tokens as a prompt costs at least that prompt's prefill."""
        return False

    def step_source(self, plan: Plan) -> str:
        """The label of the model whose step times price ``plan``: this one's."""
        return self.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        step_ms, step_j = self.decode_step(plan, b, lin + lout / 2)
        _, pre_j = self.prefill(plan, lin)
        return EnergyEstimate.of_request(workload, pre_j, step_j, b / (step_ms / 1e3),
                                         self.label[:-1] + self.outside(workload) + ")", measured=False)

    def outside(self, workload: Workload) -> str:
        """What of ``workload`` lies outside the profiled points, for the label ("" where nothing does)."""
        d, lengths = self.p["decode"], self.p["prefill"]["lengths"]
        out = ""
        lo, hi = min(d["batches"]), max(d["batches"])
        if not lo <= workload.batch_size <= hi:
            out += f"; batch {workload.batch_size} extrapolated from the profiled {lo}-{hi}"
        if len(lengths) == 1 and workload.input_tokens != lengths[0]:
            out += f"; prefill scaled per token from {lengths[0]}-token prompts"
        elif not min(lengths) <= workload.input_tokens <= max(lengths):
            out += f"; prefill extrapolated from {min(lengths)}-{max(lengths)}-token prompts"
        return out


def _by_kind(groups: list[str]) -> tuple[list[str], list[str]]:
    """(MLP groups, routed experts included; attention groups): the kind corner's split."""
    return [g for g in groups if not is_attention(g)], [g for g in groups if is_attention(g)]
