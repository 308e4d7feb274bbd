"""Does metering each GEMM's energy let a GPU profile price unprofiled models within 10%? No GPU needed.

The shipped GPU profile fits a step's whole energy as ``P0 t + e_byte B + e_bf16 F + e_fp8 F8`` to a
few anchor models (``advisor.energy.prediction``); no coefficients of that form price small models
within 10% (``reports/benchmarks/shipped_fit_ceiling``). The alternative tried here: every GEMM's
energy read from a metered table (``benchmarks/gemm_energy_collect.py``: J per GEMM per format and
row count, on one unit), and only the rest fitted to the anchors (metered on the same unit):

    E = sum of the step's GEMMs' table J + P_rest x (t - table GEMM time) + e_kv x KV bytes
        + e_act x activation bytes + e_attn x attention FLOPs

Both forms are fitted to the same anchors and predict the same measured rows (every run of
``benchmarks/energy_transfer_collect.py``), with the step time predicted by the shipped profile's
time model (its GEMM time tables and its non-GEMM time, fitted to its own anchors). Also, as in ``shipped_fit_ceiling``,
each form fitted to every measured row at once (measured step times, largest error minimised), the
least any coefficients of that form reach; and the GEMM-energy form's rest fitted to every other shape's rows
(all units), predicting the shape left out.

    python benchmarks/studies/gemm_energy_eval.py --gpu-profile advisor/energy/profiles/h100_gemm_2026-11-22.json \
        --gemm-energy GEMM_ENERGY.json --anchors RAW_WITH_ANCHORS.json --raw RAW.json [--raw ...] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _report import command_line, read_notes, write_report  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402
from shipped_fit_ceiling import measured_rows, minimax  # noqa: E402

from advisor.energy.prediction import GpuProfileCostModel, energy_features, fit_gpu_profile
from advisor.energy.profiling import (  # noqa: E402
    REFERENCE_SHAPES,  # noqa: E402
    GemmEnergy,
    GemmTable,
    Geometry,
    anchor_points,
    fit_rest,
    rest_features,
    step_parts,
    table_of_collect,
)
from advisor.plan import Plan  # noqa: E402

TARGET = 0.10


def leave_one_shape_out(profile: dict, raws: list[tuple[str, dict]], points: list[dict],
                        energy: GemmEnergy) -> dict[str, dict[str, float]]:
    """The GEMM-energy form with its rest fitted to every other shape's measured rows (all units, measured step
    times), predicting the shape left out with the step time predicted: far more training data than anchors."""
    out = {}
    for shape in sorted({p["shape"] for p in points}):
        rest = fit_rest([p for p in points if p["shape"] != shape], energy)
        only = [(run, {**raw, "shapes": {shape: raw["shapes"][shape]}}) for run, raw in raws if shape in raw["shapes"]]
        out.update(predicted_errors(profile, only, rest, energy))
    return out


def predicted_errors(profile: dict, raws: list[tuple[str, dict]], rest: list[float] | None = None,
                     energy: GemmEnergy | None = None) -> dict[str, dict[str, float]]:
    """Max |error| per shape and run. The step time: ``profile``'s time model (with its power-limit rule). The
    energy: ``profile``'s fit (the shipped form), or with ``energy`` the metered GEMMs plus ``rest``; the table's
    GEMM energies were metered as they ran, at the power limit where they reached it, so no cap rule is applied
    on top of them."""
    table = GemmTable(profile)
    out: dict[str, dict[str, float]] = {}
    for run, raw in raws:
        for name, data in raw["shapes"].items():
            layers = data["num_layers"]
            shape = REFERENCE_SHAPES[name].shape(layers)
            geo = Geometry.from_shape(shape)
            model = GpuProfileCostModel(profile, shape)
            plans = plan_formats(layers)
            for r in data["rows"]:
                plan = Plan(plans[r["plan"]])
                decode = r["phase"] == "decode"
                t, j = (model.decode_step(plan, r["batch"], r["context"]) if decode
                        else model.prefill(plan, r["context"]))
                if energy is not None and rest is not None:
                    x = r["batch"] if decode else r["context"]
                    formats = dict(plan.formats)
                    parts = step_parts(geo, table, formats, r["phase"], x, r["context"])
                    j = energy.step_j(geo, formats, r["phase"], x) + float(np.dot(rest, rest_features(t, parts)))
                err = abs(j / r["measured_j_per_step"] - 1)
                out.setdefault(name, {})[run] = max(out.get(name, {}).get(run, 0.0), err)
    return out


def pooled_floor(points: list[dict], energy: GemmEnergy) -> dict[str, dict[str, float]]:
    """Each form fitted to every point at once (measured step times), its largest relative error minimised: the
    worst error per shape."""
    out = {}
    y = np.array([p["j"] for p in points])
    for name, offset, feats in (
            ("shipped form", lambda p: 0.0, energy_features),
            ("GEMM energy metered", lambda p: energy.step_j(p["geo"], p["formats"], p["phase"], p["x"]),
             rest_features)):
        a = np.array([feats(p["t_ms"], p["parts"]) for p in points])
        base = np.array([offset(p) for p in points])
        errs = (base + a @ minimax(a, y, base)) / y - 1
        worst: dict[str, float] = {}
        for p, e in zip(points, errs, strict=True):
            worst[p["shape"]] = max(worst.get(p["shape"], 0.0), abs(float(e)))
        out[name] = worst
    return out


def render(d: dict) -> str:
    shapes = [s for s in REFERENCE_SHAPES if s in d["anchors_fit"]["GEMM energy metered"]]
    lines = [
        f"# Metered GEMM energy in a GPU profile: an experiment ({d['gpu']})",
        "",
        f"Computed {d['date']}, no GPU; command `{d['command']}`. GEMM energies and anchors metered on one "
        f"unit ({d['unit']}, {d['energy_date']}: `{d['energy_command']}`; `{d['anchors_command']}`); "
        f"predicted rows: {len(d['runs'])} runs on {d['units']} units. Each cell: max |error| over every row "
        f"(plans, phases, batches) of every run of that shape. Target: {TARGET:.0%}.",
        "",
        f"Rest coefficients fitted to the anchors ({', '.join(d['anchors'])}): P_rest {d['rest'][0]:.0f} W, "
        f"e_kv {d['rest'][1] * 1e12:.0f} pJ/B, e_act {d['rest'][2] * 1e12:.0f} pJ/B, "
        f"e_attn {d['rest'][3] * 1e12:.2f} pJ/FLOP.",
        "",
        "| form | fit | " + " | ".join(shapes) + " | worst |",
        "|---|---|" + "---:|" * (len(shapes) + 1),
    ]
    ways = (("anchors, step time predicted", "anchors_fit"), ("every row, minimax (floor)", "pooled"),
            ("every other shape's rows, step time predicted", "loso"))
    tables = {**d, "loso": {"GEMM energy metered": d["leave_one_shape_out"]}}
    for way, key in ways:
        for form, worst in tables[key].items():
            per = {s: max(v.values()) if isinstance(v, dict) else v for s, v in worst.items()}
            cells = [f"{per[s] * 100:.1f}%" if s in per else "-" for s in shapes]
            lines.append(f"| {form} | {way} | " + " | ".join(cells) + f" | {max(per.values()) * 100:.1f}% |")
    lines += ["", "## Per run (anchors fit, step time predicted): shipped form -> GEMM energy metered", "",
              "| shape | run: error |", "|---|---|"]
    ship, gemm = d["anchors_fit"]["shipped form"], d["anchors_fit"]["GEMM energy metered"]
    for s in shapes:
        lines.append(f"| {s} | " + ", ".join(f"{Path(r).stem.removeprefix('h100_')}: {ship[s][r] * 100:.1f} -> "
                                              f"{gemm[s][r] * 100:.1f}" for r in sorted(gemm[s])) + " |")
    if d.get("approximate_gemm_energy"):
        lines += ["", "GEMMs the energy run did not reach, scaled from the nearest metered shape by weight count: "
                  + "; ".join(d["approximate_gemm_energy"]) + "."]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in d.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-profile", type=Path, required=True, help="its time tables and non-GEMM time model")
    ap.add_argument("--gemm-energy", type=Path, required=True, help="benchmarks/gemm_energy_collect.py output")
    ap.add_argument("--anchors", type=Path, required=True, help="energy_transfer_collect output with --anchors")
    ap.add_argument("--raw", type=Path, action="append", required=True)
    ap.add_argument("--cap-share", type=float, default=0.8, help="rows drawing this share of the power limit or "
                    "more are left out of the every-row fit (%(default)s, as shipped_fit_ceiling's reports)")
    ap.add_argument("--notes", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    profile = json.loads(args.gpu_profile.read_text())
    # without the profile's own metered GEMM energies, which would price the large shapes of both forms compared
    profile.pop("gemm_energy", None)
    energy_data = json.loads(args.gemm_energy.read_text())
    anchors_raw = json.loads(args.anchors.read_text())
    if anchors_raw["gpu_uuid"] != energy_data["gpu_uuid"]:
        print(f"warning: anchors on {anchors_raw['gpu_uuid']}, GEMM energies on {energy_data['gpu_uuid']}")
    raws = [(str(p), json.loads(p.read_text())) for p in args.raw]
    raws = [(p, r) for p, r in raws if r["shapes"]]
    with_anchors = {k: v for k, v in profile.items() if k != "fit"} | {"anchors": anchors_raw["anchors"]}
    table, energy = GemmTable(profile), GemmEnergy(table_of_collect(energy_data))
    # both forms keep the shipped profile's time model (its non-GEMM time fit); only the energy is refitted here
    fit = {**profile["fit"], "energy": fit_gpu_profile(with_anchors)["energy"]}
    rest = fit_rest(anchor_points(with_anchors, table), energy)
    points = measured_rows(raws, table, profile["power_limit_w"], args.cap_share)
    d = {"gpu": profile["gpu"], "date": date.today().isoformat(),
         "command": command_line(argv),
         "unit": energy_data["gpu_uuid"], "energy_date": energy_data["date"], "energy_command": energy_data["command"],
         "anchors_command": anchors_raw["command"], "anchors": sorted(anchors_raw["anchors"]),
         "runs": [p for p, _ in raws], "units": len({r["gpu_uuid"] for _, r in raws}), "rest": rest,
         "shipped_form_energy": fit["energy"],
         "anchors_fit": {"shipped form": predicted_errors({**with_anchors, "fit": fit}, raws),
                         "GEMM energy metered": predicted_errors({**with_anchors, "fit": fit}, raws, rest, energy)},
         "pooled": pooled_floor(points, energy),
         "leave_one_shape_out": leave_one_shape_out({**with_anchors, "fit": fit}, raws, points, energy),
         "notes": read_notes(args.notes)}
    d["approximate_gemm_energy"] = sorted(energy.approximate)
    write_report(args.out, d, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
