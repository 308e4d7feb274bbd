"""Predict a plan's J/token from a layer profile (no GPU needed): the fallback tier.

Model, for a decode step at batch ``b`` and context ``c`` (prefill alike at length L):

* GEMM time of each group: the profile's time of one GEMM of that kind and format
  at ``b`` rows (piecewise linear in ``b``), scaled by the group's weight count over
  the profiled layer's when the model differs from the profiled one. Pre-fused
  projections (Phi-3 ``qkv_proj``, ``gate_up_proj``) are the ``qkv``/``gate_up`` kinds; a
  shared expert's groups price as ``gate_up``/``down``. A MoE layer's routed experts
  (:mod:`advisor.energy.prediction._routing`, measured or uniform routing, labelled which) cost, per
  projection, ``D`` GEMMs of one expert's weights at ``b * top_k / D`` rows each, where
  ``D`` is the expected number of distinct experts ``b`` tokens touch;
* non-GEMM time of the all-``f`` plan: its measured step minus its GEMMs (linear in
  ``c``), scaled by layers x hidden size, its part that grows with ``c`` (the KV read) by the KV cache's bytes per
  token instead; a mixed plan takes BF16's plus the FP8 share of groups times the
  difference (FP8 adds quantization work). A sliding-window layer counts at the
  context it attends to (``min(c, window)``). The profiled layer is a Llama one: norms,
  activations, q/k norms, biases and MoE routing of other families are priced as its
  non-GEMM time, and the label says which of them the model has;
* energy: the BF16 step's measured J/step over its timed step (``P_b``, watts)
  over the non-GEMM time and the BF16 GEMMs, and an FP8-GEMM power ``P_f`` over the FP8 GEMMs, where ``P_f`` is
  the value that makes the all-FP8 plan's predicted energy equal its measured one.
  Powers are interpolated in log2(batch) between measured batches.

So all-BF16 and all-FP8 reproduce the profile's own measurements by construction;
mixed plans, other batches and contexts are predictions.

An FP8 KV cache halves the part of the decode step that grows with the context (the step
time is linear in ``c``: its slope is the KV read), at the same power; prefill is unchanged. Profiles hold no
FP8-KV measurement (the runtime has no FP8 KV attention yet), so estimates of such plans say
so in their label.

Models of another size are scaled, and the label says so ("scaled from ..."). Far
from the profiled size the scaling is extrapolation and is labelled that way: the
per-kernel launch floors and the low power of a latency-bound step are not in the
profile, so small models are priced far too low (reports/benchmarks/costmodel_transfer.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from advisor.energy.prediction._routing import layer_experts_touched, routing_note
from advisor.energy.profiling import KINDS, interp
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import KV_CACHE_BYTES, Format
from advisor.models.shape import LayerGeometry, ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

# Per-layer weight ratios (model / profiled model) beyond which scaling is extrapolation.
EXTRAPOLATION_RANGE = (0.25, 4.0)
FP8_KV_NOTE = "FP8 KV cache: the context-dependent part of the decode step halved (not profiled)"


def check_profiled(plan: Plan, formats: set[Format], profile: str) -> None:
    """UnsupportedError for a plan that ``profile`` (measured in ``formats``, BF16 KV cache) cannot price."""
    if plan.kv_cache != Format.BF16:
        raise UnsupportedError(f"the {profile} has no FP8 KV-cache measurement")
    bad = set(plan.formats.values()) - formats
    if bad:
        raise UnsupportedError(f"the {profile} has no {', '.join(sorted(f.value for f in bad))} costs: "
                               "the format does not run natively there")


# group kind -> the profiled GEMM kind it runs as
_PROFILED_KIND = {"qkv": "qkv", "o": "o", "gate_up": "gate_up", "down": "down",
                  "shared_gate_up": "gate_up", "shared_down": "down"}


def _kind(group_name: str) -> str:
    kind = _PROFILED_KIND.get(group_name.rsplit(".", 1)[-1])
    if kind is None:
        raise InputError(f"group {group_name!r} is not one of the profiled kinds {KINDS} (or their MoE forms)")
    return kind


def _unprofiled_parts(shape: ModelShape) -> list[str]:
    """What this model's layers have that the profiled Llama layer does not."""
    layers = shape.layers
    parts = []
    if any(g.norms > 2 for g in layers):
        parts.append(f"{max(g.norms for g in layers)} norms per layer")
    acts = sorted({g.activation for g in layers} - {"silu"})
    parts += acts
    parts += ["q/k norms"] if any(g.qk_norm for g in layers) else []
    parts += ["qkv biases"] if any(g.qkv_bias for g in layers) else []
    parts += ["MoE routing"] if shape.is_moe else []
    return parts


@dataclass(frozen=True)
class _Gemm:
    """One profiled-kind GEMM of a group: ``scale`` x the profiled GEMM's weights; for routed
    experts, the GEMM of ONE expert, run once per touched expert."""

    kind: str
    scale: float
    moe: LayerGeometry | None = None


def _group_gemms(shape: ModelShape, name: str, shapes: tuple[tuple[int, int], ...], ref: dict[str, int]) -> list[_Gemm]:
    moe = shape.routed_layer(name)
    if moe is None:
        kind = _kind(name)
        return [_Gemm(kind, sum(i * o for i, o in shapes) / ref[kind])]
    per_kind = {"gate_up": 0, "down": 0}  # experts' members: gate/up read the hidden state, down does not
    for i, o in shapes:
        per_kind["gate_up" if i == moe.hidden else "down"] += i * o
    return [_Gemm(k, w / moe.num_experts / ref[k], moe) for k, w in per_kind.items() if w]


class ProfileCostModel:
    """An :class:`~advisor.estimate.EnergyModel` backed by a measured (or derived) profile."""

    measured = False
    gpus = 1

    def __init__(self, profile: dict[str, Any], shape: ModelShape) -> None:
        if shape.num_layers < 1 or shape.hidden_size < 1 or not shape.groups:
            raise InputError(f"the model shape has {shape.num_layers} layers, hidden size {shape.hidden_size} and "
                             f"{len(shape.groups)} groups: nothing the profile can price")
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
        self._gemms = {g.name: _group_gemms(shape, g.name, g.shapes, ref) for g in shape.groups}
        # non-GEMM part scales with layers x hidden when the model is not the profiled one, but for its KV read,
        # which scales with the KV cache's bytes per token (layers x KV heads x head size: a tensor-parallel shard
        # holds 1/N of the heads, a GQA model fewer KV heads than heads)
        self._ng_scale = (shape.num_layers * shape.hidden_size) / (m["num_layers"] * m["hidden"])
        self._kv_scale = (sum(la.kv_heads * la.head_dim for la in shape.layers)
                          / (m["num_layers"] * m["kv_heads"] * m["head_dim"])) if shape.layers else self._ng_scale
        self._ref_layers = m["num_layers"]
        active = sum(g.num_weights * (lay.active_share if (lay := shape.routed_layer(g.name)) else 1.0)
                     for g in shape.groups)
        self.per_layer_weight_ratio = active / shape.num_layers / sum(ref.values())
        tag = "" if profile.get("verified", False) else ", unverified"
        unprofiled = _unprofiled_parts(shape)
        notes = "".join([
            f"; non-GEMM time of the profiled Llama layer, without this model's {', '.join(unprofiled)}"
            if unprofiled else "",
            f"; {routing_note(shape)}" if shape.is_moe else "",
            self._scaling_note(m, shape),
        ])
        source = f"{profile.get('source', 'measured')} {profile['date']}{tag}"
        self.label = f"predicted (profile {profile['gpu']}, {source}{notes})"

    def _scaling_note(self, m: dict[str, Any], shape: ModelShape) -> str:
        r = self.per_layer_weight_ratio
        scales = [x.scale for gemms in self._gemms.values() for x in gemms]
        if shape.num_layers == m["num_layers"] and all(abs(v - 1) < 1e-9 for v in scales):
            return ""
        name = m.get("name", "profiled").split(",")[0]
        note = f"; scaled from its {name} ({r:.3g}x the weights per layer"
        lo, hi = EXTRAPOLATION_RANGE
        expert = [x.scale for gemms in self._gemms.values() for x in gemms if x.moe]
        if expert:
            span = f"{min(expert):.3g}x" if min(expert) == max(expert) else f"{min(expert):.3g}x-{max(expert):.3g}x"
            note += f"; one expert's GEMM {span} the profiled one"
        outside = not lo <= r <= hi or any(not lo <= v <= hi for v in expert)
        return note + ")" + (": extrapolated" if outside else "")

    # -- pieces ------------------------------------------------------------------
    def _check(self, plan: Plan) -> None:
        if plan.kv_cache != Format.BF16 and plan.kv_cache not in self.formats:
            raise UnsupportedError(f"the {self.p['gpu']} profile has no {plan.kv_cache.value} kernels for a KV cache")
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

    def _group_ms(self, phase: dict, fmt: Format, group: str, x: float) -> float:
        """GEMM time of one group in a step of ``x`` rows (tokens)."""
        total = 0.0
        for gm in self._gemms[group]:
            if gm.moe is None:
                total += self._gemm(phase, fmt, gm.kind, x) * gm.scale
                continue
            touched = layer_experts_touched(gm.moe, x)
            total += touched * self._gemm(phase, fmt, gm.kind, x * gm.moe.top_k / touched) * gm.scale
        return total

    def _step(self, phase: dict, plan: Plan, x: float, step_ms: dict[Format, float]) -> tuple[float, float]:
        """(time ms, energy J) of one step given the all-format step times at this point."""
        fmts = [f for f in (Format.BF16, Format.FP8, Format.NVFP4) if f.value in phase["step_ms"]]
        ng = {f: step_ms[f] - self._all_gemms(phase, f, x) for f in fmts}
        gemm_ms = {f: 0.0 for f in fmts}
        for g in self.shape.groups:
            f = plan.format_of(g.name)
            gemm_ms[f] += self._group_ms(phase, f, g.name, x)
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
        # each layer's share of the step at the context it attends to (sliding windows: their window)
        layers_at = Counter(g.kv_tokens(context) for g in self.shape.layers)
        kv_share = KV_CACHE_BYTES[plan.kv_cache] / KV_CACHE_BYTES[Format.BF16]
        kv_read = kv_share * self._kv_scale / self._ng_scale  # _step scales the whole by _ng_scale
        step_ms = {}
        for f, per_ctx in d["step_ms"].items():
            at_c = [interp(d["batches"], per_ctx[str(c)], batch) for c in ctxs]
            at_0 = interp(ctxs, at_c, 0)  # the step without a KV read (linear extrapolation to context 0)
            step_ms[Format(f)] = sum(n / self.shape.num_layers * (at_0 + kv_read * (interp(ctxs, at_c, c) - at_0))
                                     for c, n in layers_at.items())
        return self._step(d, plan, batch, step_ms)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of the prefill of one request of ``length`` tokens."""
        self._check(plan)
        d = self.p["prefill"]
        step_ms = {Format(f): interp(d["lengths"], v, length) for f, v in d["step_ms"].items()}
        return self._step(d, plan, length, step_ms)

    def without_step_cap(self) -> ProfileCostModel:
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
        source = self.label if plan.kv_cache == Format.BF16 else f"{self.label[:-1]}; {FP8_KV_NOTE})"
        return EnergyEstimate.of_request(workload, pre_j, step_j, b / (step_ms / 1e3), source, measured=False)
