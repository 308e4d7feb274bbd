"""Metered GEMM energy in a shipped GPU profile, for models of large layers.

The GPU profile's fitted energy form (:func:`advisor.energy.prediction.energy_features`) fits a step's whole
energy to a few anchor models, and no coefficients of that form price every measured shape well
(reports/benchmarks/shipped_fit_ceiling). A profile may also carry a ``gemm_energy`` section: every reference
GEMM's joules per format and row count, metered on GPU units (``benchmarks/gemm_energy_collect.py``; their
mean), and a fitted rest for what the GEMMs do not cover:

    E = sum of the step's GEMMs' metered J + P_rest x (t - table GEMM time) + e_kv x KV bytes
        + e_act x activation bytes + e_attn x attention FLOPs

with the rest fitted (non-negative least squares, relative errors) to anchors metered on the same unit(s).
Models of layers below ``min_layer_weights`` follow the section's ``small_layers`` rule: ``fitted`` (the fitted
form alone; profiles built before the rule existed) or ``mean`` (the mean of the two forms, which miss small
shapes in opposite directions). How well each prices which shapes: reports/benchmarks/gemm_energy/. torch-free.
"""

from __future__ import annotations

from typing import Any

from advisor.energy.profiling._gpu_profile import (
    CAPPED_SHARE,
    GemmTable,
    Geometry,
    anchor_layer_weights,
    anchor_steps,
    log_distance,
)
from advisor.energy.profiling._interp import interp
from advisor.errors import InputError
from advisor.formats import Format

#: below this many weights per layer the metered form priced no better than the fitted one
#: (reports/benchmarks/gemm_energy)
MIN_LAYER_WEIGHTS = 80e6
SECTION_KEYS = ("units", "anchors", "anchor_layer_weights", "m_buckets", "j", "rest", "min_layer_weights")
#: how a section prices models of layers below ``min_layer_weights`` (absent: "fitted")
SMALL_LAYER_RULES = ("fitted", "mean")


class GemmEnergy:
    """J of one GEMM per format and ``NxK`` at the metered row counts (linear in the rows between them)."""

    def __init__(self, section: dict[str, Any]) -> None:
        self.ms = section["m_buckets"]
        self.j = {Format(f): dict(v) for f, v in section["j"].items()}
        self.approximate: set[str] = set()

    def gemm_j(self, fmt: Format, n: int, k: int, x: float) -> float:
        """J of one GEMM; a shape the table lacks is scaled from the nearest metered one by weight count (as
        the time tables do) and listed in ``approximate``."""
        row = self.j[fmt].get(f"{n}x{k}")
        if row is None:
            ref = min(self.j[fmt], key=lambda s: log_distance(s, n, k))
            rn, rk = (int(v) for v in ref.split("x"))
            self.approximate.add(f"{fmt.value} {n}x{k} (from {ref})")
            return interp(self.ms, self.j[fmt][ref], x) * n * k / (rn * rk)
        return interp(self.ms, row, x)

    def step_j(self, geo: Geometry, formats: dict[str, Format], phase: str, x: float) -> float:
        """The step's GEMMs: each group in its format at ``x`` rows, the BF16 lm_head at its rows."""
        j = sum(self.gemm_j(formats.get(name, Format.BF16), n, k, x) for name, _, n, k in geo.groups)
        return j + self.gemm_j(Format.BF16, geo.vocab, geo.hidden, x if phase == "decode" else 1)


def table_of_collect(data: dict[str, Any]) -> dict[str, Any]:
    """The compact per-GEMM J table of a ``gemm_energy_collect.py`` output (its ms, W and CVs stay there)."""
    return {"m_buckets": data["m_buckets"],
            "j": {f: {nk: [p["j"] for p in points] for nk, points in v.items()} for f, v in data["gemm"].items()}}


def mean_table(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GEMM and row count, the mean J over the units' tables that metered it."""
    buckets = tables[0]["m_buckets"]
    if any(t["m_buckets"] != buckets for t in tables):
        raise InputError("the GEMM energy runs metered different row counts; they cannot be averaged")
    out: dict[str, dict[str, list[float]]] = {}
    for fmt in sorted({f for t in tables for f in t["j"]}):
        rows: dict[str, list[list[float]]] = {}
        for t in tables:
            for nk, row in t["j"].get(fmt, {}).items():
                rows.setdefault(nk, []).append(row)
        out[fmt] = {nk: [sum(v) / len(v) for v in zip(*rs, strict=True)] for nk, rs in rows.items()}
    return {"m_buckets": buckets, "j": out}


def rest_features(t_ms: float, parts: dict[str, Any]) -> list[float]:
    """What the GEMM table does not price: the rest of the step's time, KV and activation bytes, attention FLOPs."""
    return [max(t_ms - parts["gemm_ms"], 0.0) / 1e3, parts["kv_bytes"], parts["act_bytes"], parts["attn_flops"]]


def anchor_points(profile: dict[str, Any], table: GemmTable) -> list[dict[str, Any]]:
    """The anchors' metered steps below the power cap (:func:`~advisor.energy.profiling.anchor_steps`)."""
    cap_w = CAPPED_SHARE * profile["power_limit_w"]
    return [s for s in anchor_steps(profile, table) if s["j"] is not None and s["j"] / (s["t_ms"] / 1e3) < cap_w]


def fit_rest(points: list[dict[str, Any]], energy: GemmEnergy) -> list[float]:
    """The rest's coefficients: non-negative least squares on the relative error of the whole step's J."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([rest_features(p["t_ms"], p["parts"]) for p in points])
    j = np.array([p["j"] for p in points])
    y = j - np.array([energy.step_j(p["geo"], p["formats"], p["phase"], p["x"]) for p in points])
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale / j[:, None], y / j)
    return [float(c) for c in coef / scale]


def gemm_energy_section(profile: dict[str, Any], units: list[tuple[dict[str, Any], dict[str, Any]]],
                        small_layers: str = "mean") -> dict[str, Any]:
    """A profile's ``gemm_energy`` section from one or more GPU units, each a ``gemm_energy_collect.py`` output and
    an ``energy_transfer_collect.py --anchors`` output metered on that same unit: the GEMM energies averaged over
    the units, and the rest fitted to every unit's anchors, with the profile's GEMM time tables. Several units put
    the profile nearer a fleet's middle than any one unit: units of one kind draw different energy for the same
    steps (reports/benchmarks/gemm_energy/)."""
    if not units:
        raise InputError("the GEMM energy section needs at least one unit's GEMM energies and anchors")
    records, anchors = [], {}
    for collect, anchors_run in units:
        if collect["gpu_uuid"] != anchors_run["gpu_uuid"]:
            raise InputError(f"GEMM energies from {collect['gpu_uuid']}, their anchors from "
                             f"{anchors_run['gpu_uuid']}: each unit's must be metered on that unit")
        if not anchors_run.get("anchors"):
            raise InputError(f"no anchor models in the anchors run of {anchors_run['gpu_uuid']}")
        records.append({"gpu_uuid": collect["gpu_uuid"], "date": collect["date"], "command": collect["command"],
                        "anchors_command": anchors_run["command"], "anchors": sorted(anchors_run["anchors"])})
        anchors.update({f"{name}@{collect['gpu_uuid']}": a for name, a in anchors_run["anchors"].items()})
    section = {"units": records, "anchors": sorted({n for r in records for n in r["anchors"]}),
               "anchor_layer_weights": sorted(set(anchor_layer_weights(anchors))),
               **mean_table([table_of_collect(c) for c, _ in units]), "min_layer_weights": MIN_LAYER_WEIGHTS,
               "small_layers": small_layers}
    points = anchor_points({**profile, "anchors": anchors}, GemmTable(profile))
    section["rest"] = fit_rest(points, GemmEnergy(section))
    return section


def validate_gemm_energy_section(section: dict[str, Any], origin: str) -> dict[str, Any]:
    missing = [k for k in SECTION_KEYS if k not in section]
    if missing:
        raise InputError(f"{origin}'s gemm_energy section lacks {', '.join(missing)}")
    rule = section.get("small_layers", "fitted")
    if rule not in SMALL_LAYER_RULES:
        raise InputError(f"{origin}'s gemm_energy section has small_layers {rule!r}; expected one of "
                         f"{', '.join(SMALL_LAYER_RULES)}")
    return section
