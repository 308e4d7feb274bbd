"""Read a GPU profile (schema ``precision-advisor/gpu-energy-profile``, version 1): its GEMM time tables
per format and ``NxK``, the geometry of a model's steps, and the anchors' metered steps.

Torch-free: the cost model (:mod:`advisor.energy.prediction`) and the metered GEMM energies
(:mod:`advisor.energy.profiling._gemm_energy`) read profiles through it; measuring them is
:mod:`advisor.energy.profiling._gemm_table`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from advisor.energy.profiling._interp import interp
from advisor.energy.profiling._schemas import GPU_SCHEMA as SCHEMA
from advisor.energy.profiling._schemas import GPU_VERSION as VERSION
from advisor.errors import InputError
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import DENSE_GROUP_KINDS


def nk_key(n: int, k: int) -> str:
    return f"{n}x{k}"


BYTES = {Format.BF16: 2.0, Format.FP8: 1.0}
#: anchor steps drawing this share of the power limit or more are at the limit: left out of the energy fit
CAPPED_SHARE = 0.95
FORMATS = (Format.BF16, Format.FP8)


@dataclass(frozen=True)
class Geometry:
    """What the model costs need: per layer, its groups' (kind, N, K) and its attention."""

    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    groups: tuple[tuple[str, str, int, int], ...]  # (group name, kind, N, K)
    windows: tuple[int | None, ...]  # per layer: sliding window or None

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    def kv_tokens(self, context: float) -> float:
        return sum(context if w is None else min(context, w) for w in self.windows)

    @classmethod
    def from_shape(cls, shape: ModelShape) -> Geometry:
        groups = []
        for g in shape.groups:
            kind = g.name.rsplit(".", 1)[-1]
            if shape.routed_layer(g.name) is not None:
                raise InputError("the shipped GPU profile prices dense layers; this model has routed experts")
            if kind not in DENSE_GROUP_KINDS:
                raise InputError(f"the shipped GPU profile prices decoder groups {DENSE_GROUP_KINDS}, not {g.name!r}")
            groups.append((g.name, kind, sum(o for _, o in g.shapes), g.shapes[0][0]))
        windows = tuple(lay.sliding_window for lay in shape.layers) if shape.layers else (None,) * shape.num_layers
        return cls(shape.hidden_size, shape.vocab_size, shape.num_attention_heads, shape.num_kv_heads,
                   shape.head_dim, tuple(groups), windows)

    @classmethod
    def from_dims(cls, d: dict[str, Any]) -> Geometry:
        """From a per-model profile's ``model`` (``DecoderDims.to_dict()``)."""
        groups, windows = [], []
        for i, la in enumerate(d["layers"]):
            a, h = la["attention"], d["hidden"]
            q = a["heads"] * a["head_dim"]
            groups += [(f"layers.{i}.qkv", "qkv", q + 2 * a["kv_heads"] * a["head_dim"], h),
                       (f"layers.{i}.o", "o", h, q), (f"layers.{i}.gate_up", "gate_up", 2 * la["intermediate"], h),
                       (f"layers.{i}.down", "down", h, la["intermediate"])]
            windows.append(a.get("sliding_window"))
        a0 = d["layers"][0]["attention"]
        return cls(d["hidden"], d["vocab"], a0["heads"], a0["kv_heads"], a0["head_dim"], tuple(groups),
                   tuple(windows))


class GemmTable:
    """GEMM times per format and ``NxK``, made non-decreasing in the rows (a suffix minimum): a GEMM of
    fewer rows never takes longer, while a table's first row bucket can carry a start-up delay that the same
    GEMM inside a model does not show."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.ms = profile["m_buckets"]
        self.t = {Format(f): {k: _suffix_min(row) for k, row in v.items()} for f, v in profile["gemm_ms"].items()}
        self.approximate: set[tuple[int, int]] = set()

    def floor(self, fmt: Format, m: float) -> float:
        return min(interp(self.ms, row, m) for row in self.t[fmt].values())

    def ms_at(self, fmt: Format, n: int, k: int, m: float) -> float:
        row = self.t[fmt].get(nk_key(n, k))
        if row is not None:
            return interp(self.ms, row, m)
        self.approximate.add((n, k))
        ref = min(self.t[fmt], key=lambda s: log_distance(s, n, k))
        rn, rk = (int(v) for v in ref.split("x"))
        f = self.floor(fmt, m)
        return f + (interp(self.ms, self.t[fmt][ref], m) - f) * (n * k) / (rn * rk)


def _suffix_min(row: list[float]) -> list[float]:
    out, low = [], math.inf
    for v in reversed(row):
        low = min(low, v)
        out.append(low)
    return out[::-1]


def log_distance(key: str, n: int, k: int) -> float:
    rn, rk = (int(v) for v in key.split("x"))
    return abs(math.log(rn / n)) + abs(math.log(rk / k))



def fmt_of(plan_formats: dict[str, Format], name: str) -> Format:
    return plan_formats.get(name, Format.BF16)


def step_parts(geo: Geometry, table: GemmTable, formats: dict[str, Format], phase: str, x: float,
               context: float) -> dict[str, Any]:
    """GEMM time, the features of the fitted non-GEMM time, and bytes / FLOPs of one step."""
    gemm_ms, flops = 0.0, {f: 0.0 for f in FORMATS}
    weight_bytes = 0.0
    share = {f: 0.0 for f in FORMATS}
    for name, _kind, n, k in geo.groups:
        f = fmt_of(formats, name)
        gemm_ms += table.ms_at(f, n, k, x)
        flops[f] += 2.0 * x * n * k
        weight_bytes += BYTES[f] * n * k
        share[f] += 1 / len(geo.groups)
    head_rows = x if phase == "decode" else 1
    gemm_ms += table.ms_at(Format.BF16, geo.vocab, geo.hidden, head_rows)
    flops[Format.BF16] += 2.0 * head_rows * geo.vocab * geo.hidden
    weight_bytes += 2.0 * geo.vocab * geo.hidden
    kv_per_token = 2 * geo.kv_heads * geo.head_dim * 2.0  # K and V, BF16
    layers = geo.num_layers
    if phase == "decode":
        kv_bytes = x * kv_per_token * geo.kv_tokens(context)
        attn_flops = 4.0 * x * geo.heads * geo.head_dim * geo.kv_tokens(context)
    else:
        kv_bytes = x * kv_per_token * layers  # written once
        attn_flops = 2.0 * geo.heads * geo.head_dim * x * x * layers  # causal: half of 4 L^2 h d
    act_bytes = x * geo.hidden * 2.0 * layers
    flops[Format.BF16] += attn_flops
    return {"gemm_ms": gemm_ms, "share": share, "layers": layers, "act_bytes": act_bytes, "kv_bytes": kv_bytes,
            "attn_flops": attn_flops, "bytes": weight_bytes + kv_bytes + act_bytes, "flops": flops}



def anchor_steps(profile: dict[str, Any], table: GemmTable) -> list[dict[str, Any]]:
    """Every metered step of the profile's anchors (all-BF16 and all-FP8, decode at each batch and context,
    prefill at each length): its ``geo``, uniform ``formats`` and ``format``, ``phase``, rows ``x``, ``context``,
    measured ``t_ms`` and ``j`` (None where that decode context was not metered) and its :func:`step_parts`."""
    out = []
    for anchor in profile["anchors"].values():
        geo = Geometry.from_dims(anchor["model"])
        d, p = anchor["decode"], anchor["prefill"]
        for f in FORMATS:
            uniform = {name: f for name, *_ in geo.groups}
            points = [("decode", b, c, d["step_ms"][f.value][str(c)][i], _energy_at(d, f, c, i))
                      for i, b in enumerate(d["batches"]) for c in d["contexts"]]
            points += [("prefill", n, n, p["step_ms"][f.value][i], p["j_per_step"][f.value][i])
                       for i, n in enumerate(p["lengths"])]
            out += [{"geo": geo, "formats": uniform, "format": f, "phase": phase, "x": x, "context": c, "t_ms": t,
                     "j": j, "parts": step_parts(geo, table, uniform, phase, x, c)} for phase, x, c, t, j in points]
    return out



def _energy_at(d: dict, f: Format, c: int, i: int) -> float | None:
    j = d["j_per_step"][f.value]
    if isinstance(j, dict):
        return j[str(c)][i] if str(c) in j else None
    return j[i] if c == d.get("energy_context") else None


def validate_gpu_profile(data: dict[str, Any], origin: str = "GPU profile") -> dict[str, Any]:
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise InputError(f"{origin} is not a GPU profile of schema {SCHEMA} version {VERSION}")
    for k in ("gpu", "gpu_kind", "driver", "date", "m_buckets", "gemm_ms", "anchors", "formats"):
        if k not in data:
            raise InputError(f"{origin} lacks the field {k!r}")
    return data



def layer_weights(geo: Geometry) -> float:
    """Weights of one decoder layer (the mean over layers)."""
    return sum(n * k for _, _, n, k in geo.groups) / geo.num_layers


def anchor_layer_weights(anchors: dict[str, Any]) -> list[float]:
    """Each anchor model's weights per layer."""
    return [layer_weights(Geometry.from_dims(a["model"])) for a in anchors.values()]
