"""How close can the shipped GPU profile's energy form come, given the data? No GPU needed.

The shipped GPU profile prices a step's energy as a linear form of its time, bytes and FLOPs
(:func:`advisor.energy.prediction.energy_features`), fitted to a few anchor models metered on one
GPU unit. ``energy_transfer.md`` measures its error on other shapes and units. This script asks
whether a better fit of this kind of form could meet the 10% target, by fitting each form three
ways to what ``benchmarks/energy_transfer_collect.py`` has measured:

* ``anchors``: to the profile's anchors, as shipped, predicting every run's rows (step time
  predicted too): the error a user gets;
* ``pooled``: to every measured row of every shape and unit at once, with each row's measured
  step time, minimising the largest relative error (a linear programme): no coefficients of that
  form do better on these rows, so its worst cell is a floor under the shipped path's error;
* ``leave-one-shape-out``: to every other shape's rows (all units), measured step time, predicting
  the shape left out: the error for an unseen shape with far more training data than the anchors;
  and the same coefficients with the step time predicted from the tables, as a user would get.

Under every form sits the units' own spread: where the same row (shape, plan, phase, batch) was measured
on several GPU units, one prediction for all of them misses one unit by at least half the range,
``(max - min) / (max + min)`` of the units' J/token (:func:`unit_spread_floor`).

Steps near the power limit (``--cap-share`` of it, the profile's own 95% by default) follow the
profile's cap rule, not the fit: the pooled and leave-one-shape-out fits leave them out.

    python benchmarks/studies/shipped_fit_ceiling.py --gpu-profile advisor/energy/profiles/h100_gemm_2026-11-22.json \
        --raw reports/benchmarks/energy_transfer_data/h100_raw3.json [--raw ...] \
        --out reports/benchmarks/shipped_fit_ceiling_h100.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _report import command_line, read_notes, write_report  # noqa: E402
from energy_transfer import predict  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402

from advisor.energy.prediction import GpuProfileCostModel, energy_features, fit_gpu_profile
from advisor.energy.profiling import (
    CAPPED_SHARE,
    REFERENCE_SHAPES,  # noqa: E402
    GemmTable,
    Geometry,
    step_parts,
)
from advisor.formats import Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402

TARGET = 0.10
WAYS = ("anchors", "pooled", "leave_one_shape_out", "leave_one_shape_out_predicted_time")


def _split_time(t_ms: float, parts: dict[str, Any]) -> list[float]:
    """Static power apart for the table GEMMs' time and the rest (kernel floors, attention, gaps)."""
    g = min(parts["gemm_ms"], t_ms)
    return [g / 1e3, (t_ms - g) / 1e3, parts["bytes"], parts["flops"][Format.BF16], parts["flops"][Format.FP8]]


def _split_time_bytes(t_ms: float, parts: dict[str, Any]) -> list[float]:
    """As :func:`_split_time`, and weight bytes apart from KV cache and activation bytes."""
    g = min(parts["gemm_ms"], t_ms)
    weights = parts["bytes"] - parts["kv_bytes"] - parts["act_bytes"]
    return [g / 1e3, (t_ms - g) / 1e3, weights, parts["kv_bytes"] + parts["act_bytes"],
            parts["flops"][Format.BF16], parts["flops"][Format.FP8]]


FORMS: dict[str, Callable[[float, dict[str, Any]], list[float]]] = {
    "fitted (shipped below 80M weights per layer): P0 t + e_byte B + e_bf16 F + e_fp8 F8": energy_features,
    "GEMM and other time apart": _split_time,
    "GEMM and other time apart, weight and KV bytes apart": _split_time_bytes,
}


def measured_rows(raws: list[tuple[str, dict]], table: GemmTable, limit_w: float,
                  cap_share: float = CAPPED_SHARE) -> list[dict]:
    """Every measured row below ``cap_share`` of the power limit: its step's geometry, formats, phase, rows, and
    parts (bytes, FLOPs, table GEMM time)."""
    rows = []
    for name, raw in raws:
        for shape_name, data in raw["shapes"].items():
            layers = data["num_layers"]
            geo = Geometry.from_shape(REFERENCE_SHAPES[shape_name].shape(layers))
            plans = plan_formats(layers)
            for r in data["rows"]:
                t, j = r["ms_per_step_events"], r["measured_j_per_step"]
                if j / (t / 1e3) >= cap_share * limit_w:
                    continue
                x = r["batch"] if r["phase"] == "decode" else r["context"]
                formats = dict(Plan(plans[r["plan"]]).formats)
                rows.append({"run": name, "unit": raw["gpu_uuid"], "shape": shape_name, "t_ms": t, "j": j,
                             "geo": geo, "formats": formats, "phase": r["phase"], "x": x,
                             "parts": step_parts(geo, table, formats, r["phase"], x, r["context"])})
    return rows


def fit_rows(form, rows: list[dict]) -> np.ndarray:
    """Non-negative least squares on relative errors, as :func:`~advisor.energy.prediction.fit_gpu_profile`."""
    a = np.array([form(r["t_ms"], r["parts"]) for r in rows], dtype=float)
    y = np.array([r["j"] for r in rows], dtype=float)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale / y[:, None], np.ones_like(y))
    return coef / scale


def minimax(a: np.ndarray, y: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
    """Non-negative ``c`` with the least max relative error of ``offset + a @ c`` against ``y``: a linear
    programme (minimise ``e`` with ``|(offset + a @ c) / y - 1| <= e``)."""
    from scipy.optimize import linprog

    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    rel = a / scale / y[:, None]
    base = np.zeros(len(y)) if offset is None else offset / y
    n, ones = rel.shape[1], np.ones((len(y), 1))
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=np.block([[rel, -ones], [-rel, -ones]]),
                  b_ub=np.r_[1 - base, base - 1], bounds=[(0, None)] * (n + 1), method="highs")
    if not res.success:
        raise RuntimeError(f"minimax fit failed: {res.message}")
    return res.x[:n] / scale


def minimax_rows(form, rows: list[dict]) -> np.ndarray:
    """The form's coefficients with the least max relative error over ``rows``."""
    return minimax(np.array([form(r["t_ms"], r["parts"]) for r in rows], dtype=float),
                   np.array([r["j"] for r in rows], dtype=float))


def worst_by_shape(errors: list[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for shape, e in errors:
        out[shape] = max(out.get(shape, 0.0), abs(e))
    return dict(sorted(out.items(), key=lambda kv: list(REFERENCE_SHAPES).index(kv[0])))


def predicted_errors(form, profile: dict, raws: list[tuple[str, dict]], only: str | None = None,
                     energy: list[float] | None = None) -> list[tuple[str, float]]:
    """The shipped path with this form, step time predicted, every row of every run (of shape ``only``): energy
    coefficients fitted to the anchors, or ``energy``."""
    fitted = fit_gpu_profile({k: v for k, v in profile.items() if k != "fit"}, form)
    if energy is not None:
        fitted["energy"] = list(energy)
    profile = {**profile, "fit": fitted}
    errors = []
    for _, raw in raws:
        for shape_name, data in raw["shapes"].items():
            if only is not None and shape_name != only:
                continue
            layers = data["num_layers"]
            model = GpuProfileCostModel(profile, REFERENCE_SHAPES[shape_name].shape(layers), features=form)
            plans = {k: Plan(v) for k, v in plan_formats(layers).items()}
            errors += [(shape_name, predict(model, plans[r["plan"]], r) / r["measured_j_per_token"] - 1)
                       for r in data["rows"]]
    return errors


def relative_errors(form, coef: np.ndarray, rows: list[dict]) -> list[tuple[str, float]]:
    return [(r["shape"], float(np.dot(coef, form(r["t_ms"], r["parts"]))) / r["j"] - 1) for r in rows]


def evaluate(profile: dict, raws: list[tuple[str, dict]], cap_share: float) -> list[dict]:
    rows = measured_rows(raws, GemmTable(profile), profile["power_limit_w"], cap_share)
    shapes = sorted({r["shape"] for r in rows})
    out = []
    for name, form in FORMS.items():
        pooled = worst_by_shape(relative_errors(form, minimax_rows(form, rows), rows))
        loso: list[tuple[str, float]] = []
        loso_predicted: list[tuple[str, float]] = []
        for s in shapes:
            coef = fit_rows(form, [r for r in rows if r["shape"] != s])
            loso += relative_errors(form, coef, [r for r in rows if r["shape"] == s])
            loso_predicted += predicted_errors(form, profile, raws, only=s, energy=coef)
        out.append({"form": name, "anchors": worst_by_shape(predicted_errors(form, profile, raws)), "pooled": pooled,
                    "leave_one_shape_out": worst_by_shape(loso),
                    "leave_one_shape_out_predicted_time": worst_by_shape(loso_predicted)})
    return out


def unit_spread_floor(raws: list[tuple[str, dict]]) -> dict[str, dict[str, Any]]:
    """Per shape: the least worst error of any prediction that is the same for every GPU unit, from the rows
    measured on two or more units (a unit measured twice counts its mean): the largest half-range
    ``(max - min) / (max + min)`` over its rows, with that row and its number of units."""
    by_row: dict[tuple[str, str, str, int], dict[str, list[float]]] = {}
    for _, raw in raws:
        for shape_name, data in raw["shapes"].items():
            for r in data["rows"]:
                key = (shape_name, r["plan"], r["phase"], r["batch"])
                by_row.setdefault(key, {}).setdefault(raw["gpu_uuid"], []).append(r["measured_j_per_token"])
    out: dict[str, dict[str, Any]] = {}
    for (shape_name, plan, phase, batch), units in by_row.items():
        if len(units) < 2:
            continue
        means = [sum(v) / len(v) for v in units.values()]
        floor = (max(means) - min(means)) / (max(means) + min(means))
        if floor > out.get(shape_name, {}).get("floor", -1.0):
            out[shape_name] = {"floor": floor, "row": f"{plan} {phase} {batch}", "units": len(units)}
    return dict(sorted(out.items(), key=lambda kv: list(REFERENCE_SHAPES).index(kv[0])))


def render(d: dict) -> str:
    shapes = list(d["forms"][0]["anchors"])
    lines = [
        f"# Shipped GPU profile: how close its energy form can come ({d['gpu']})",
        "",
        f"Computed {d['date']} from {len(d['runs'])} measured runs on {d['units']} {d['gpu']} units "
        f"({d['rows']} rows below {d['cap_share']:.0%} of the power limit in the pooled and leave-one-shape-out "
        "fits; the anchors rows are every row, priced with the cap rule), no GPU; "
        f"command `{d['command']}`. Each cell: max |error| over every row (plans, phases, batches) of every run "
        "of that shape. Target of the shipped profile: "
        f"{TARGET:.0%}.",
        "",
        "- **anchors**: fitted to the profile's anchor models (one unit), step time predicted: what a user gets.",
        "- **pooled**: fitted to every row of every shape and unit at once, measured step time, minimising the "
        "largest error (a linear programme). In-sample: no coefficients of that form do better on these rows "
        "(the worst cell over all shapes is the floor; a shape's cell alone is not).",
        "- **leave-one-shape-out**: fitted to every other shape's rows on every unit, measured step time.",
        "- **leave-one-shape-out-predicted-time**: the same coefficients, step time predicted from the tables: what a "
        "user would get from a profile fitted to every measured shape but theirs.",
        "",
        "| energy form | fit | " + " | ".join(shapes) + " |",
        "|---|---|" + "---:|" * len(shapes),
    ]
    for f in d["forms"]:
        for way in WAYS:
            cells = [f"{f[way][s] * 100:.1f}%" if s in f[way] else "-" for s in shapes]
            lines.append(f"| {f['form']} | {way.replace('_', '-')} | " + " | ".join(cells) + " |")
    spread = d.get("unit_spread_floor", {})
    if spread:
        cells = [f"{spread[s]['floor'] * 100:.1f}%" if s in spread else "-" for s in shapes]
        lines.append("| any form | one prediction for every unit: the units' spread (floor) | " + " | ".join(cells)
                     + " |")
        lines += ["", "Units' spread, per shape: the row whose units differ most, and how many units measured it: "
                  + "; ".join(f"{s} {v['row']} ({v['units']} units)" for s, v in spread.items()) + "."]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in d.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-profile", type=Path, required=True)
    ap.add_argument("--raw", type=Path, action="append", required=True, help="energy_transfer_collect output")
    ap.add_argument("--notes", type=Path, help="a JSON list of notes for the Markdown")
    ap.add_argument("--cap-share", type=float, default=CAPPED_SHARE,
                    help="rows drawing this share of the power limit or more are left out of the pooled and "
                    "leave-one-shape-out fits (default: the profile's own, %(default)s)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    profile = json.loads(args.gpu_profile.read_text())
    # fitted energy forms are compared: the profile's metered GEMM energies would price its large shapes instead
    profile.pop("gemm_energy", None)
    raws = [(str(p), json.loads(p.read_text())) for p in args.raw]
    raws = [(p, r) for p, r in raws if r["shapes"]]
    d = {"gpu": profile["gpu"], "date": date.today().isoformat(), "gpu_profile": str(args.gpu_profile),
         "command": command_line(argv),
         "runs": [p for p, _ in raws], "units": len({r["gpu_uuid"] for _, r in raws}),
         "cap_share": args.cap_share,
         "rows": len(measured_rows(raws, GemmTable(profile), profile["power_limit_w"], args.cap_share)),
         "forms": evaluate(profile, raws, args.cap_share), "unit_spread_floor": unit_spread_floor(raws),
         "notes": read_notes(args.notes)}
    write_report(args.out, d, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
