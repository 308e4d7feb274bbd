"""Shipped per-model profiles for common small models: the mean of several GPU units' profiles, checked on others.

The shipped GPU profile prices models below about 3B least well (up to 15% on H100s and H200s,
reports/benchmarks/energy_transfer*.md), and those are the shapes most teams start with. For such a
shape, this script takes the per-model profiles that ``benchmarks/energy_transfer_collect.py`` measured
on several units of one GPU kind (random weights of the shape; the kind corner metered), averages them
(:func:`advisor.energy.profiling.mean_profile`) and checks the mean, leaving one unit out at a time,
against every end-to-end measurement of that shape on that kind: a unit whose profile is in the mean is
predicted by the mean of the other units' profiles, so every error reported is out of sample. With
``--ship`` it writes each mean into the package (``advisor/energy/profiles/models``), where a model of
the same layer geometry finds it (:meth:`~advisor.energy.profiling.ProfileStore.find_for_kind`).
No GPU needed here.

    python benchmarks/ship_model_profiles.py --kind h100 --raw R1.json [--raw R2.json ...] \\
        --gpu-profile advisor/energy/profiles/h100_gemm_<date>.json \\
        --out reports/benchmarks/shipped_model_profiles/h100.json [--ship]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import command_line, md_table, read_notes, write_report  # noqa: E402
from energy_transfer import date_range, predict, shape_rows  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402

from advisor.energy.prediction import ModelProfileCostModel  # noqa: E402
from advisor.energy.profiling import (  # noqa: E402  # noqa: E402
    MLP_FP8,
    REFERENCE_SHAPES,  # noqa: E402
    RUNTIME_VERSION,
    ProfileStore,
    mean_profile,  # noqa: E402
    shipped_model_profiles,
    shipped_profile,  # noqa: E402
)
from advisor.formats import GPU  # noqa: E402
from advisor.plan import Plan  # noqa: E402

TARGET = 0.10
#: runtimes whose steps cost the same: .3 was stamped on the first kind-corner runs (h100_raw14, h200_raw10/11)
#: and put back to .2 when the corner was found to need no new runtime version (commit b18d694)
SAME_RUNTIME = (RUNTIME_VERSION, "2026-11-22.3")


def full_shape(name: str, data: dict) -> bool:
    return data["num_layers"] == REFERENCE_SHAPES[name].num_layers


def sources(runs: list[tuple[str, dict]], name: str) -> list[tuple[str, dict]]:
    """The profiles of ``name`` to average: those of the whole model that metered the kind corner, with the
    same decode contexts and corners as most of them, one per GPU unit (its latest run)."""
    found: dict[str, tuple[str, dict]] = {}
    for path, raw in runs:
        data = raw["shapes"].get(name)
        if data is None or not full_shape(name, data):
            continue
        p = data["profile"]
        if MLP_FP8 in p["decode"] and p["key"]["runtime"] in SAME_RUNTIME:
            found[p["key"]["gpu_uuid"]] = (path, p)
    alike: dict[str, list[tuple[str, dict]]] = {}  # the same points metered: contexts and corners
    for path, p in found.values():
        alike.setdefault(repr((p["decode"]["contexts"], sorted(p["decode"]))), []).append((path, p))
    return max(alike.values(), key=len) if alike else []


def mean_of(profiles: list[dict], command: str) -> dict:
    return mean_profile(profiles, runtime=RUNTIME_VERSION, command=command)


def check_rows(name: str, profile: dict, data: dict) -> list[dict]:
    """``profile``'s prediction of every end-to-end row of ``data`` (one run of shape ``name``)."""
    layers = data["num_layers"]
    model = ModelProfileCostModel(profile, REFERENCE_SHAPES[name].shape(layers))
    plans = {k: Plan(v) for k, v in plan_formats(layers).items()}
    out = []
    for r in data["rows"]:
        j = predict(model, plans[r["plan"]], r)
        out.append({"plan": r["plan"], "phase": r["phase"], "batch": r["batch"],
                    "measured_j_per_token": r["measured_j_per_token"], "predicted_j_per_token": j,
                    "error": j / r["measured_j_per_token"] - 1})
    return out


def evaluate(name: str, runs: list[tuple[str, dict]], gpu_profile: dict, legacy: dict, command: str) -> dict | None:
    src = sources(runs, name)
    if len(src) < 2:
        return None
    src_units = [p["key"]["gpu_uuid"] for _, p in src]
    checks = []
    for path, raw in runs:
        data = raw["shapes"].get(name)
        if data is None or not full_shape(name, data):
            continue
        unit = raw["gpu_uuid"]
        others = [p for _, p in src if p["key"]["gpu_uuid"] != unit]
        rows = check_rows(name, mean_of(others, command), data)
        own = shape_rows(name, data, gpu_profile, legacy)
        checks.append({"raw": path, "gpu_uuid": unit, "mean_of": len(others), "unit_in_shipped": unit in src_units,
                       "rows": rows, "max_abs_error": max(abs(r["error"]) for r in rows),
                       "own_profile_max_abs_error": max(abs(r["model_profile_error"]) for r in own),
                       "gpu_profile_max_abs_error": max(abs(r["shipped_profile_error"]) for r in own)})
    worst = max(c["max_abs_error"] for c in checks)
    gpu_worst = max(c["gpu_profile_max_abs_error"] for c in checks)
    return {"shape": name, "sources": [path for path, _ in src], "units": src_units, "shipped": worst < gpu_worst,
            "contexts": src[0][1]["decode"]["contexts"], "checks": checks,
            "max_abs_error": worst, "gpu_profile_max_abs_error": gpu_worst,
            "profile": mean_of([p for _, p in src], command)}


def caveat(shape: dict, report: str) -> str:
    n = len(shape["checks"])
    return (f"random weights of the {shape['shape']} shape; with each unit left out, the other units' mean came "
            f"within {shape['max_abs_error']:.1%} of that unit's end-to-end measurements ({n} runs on "
            f"{len({c['gpu_uuid'] for c in shape['checks']})} units; {report})")


def short(uuid: str) -> str:
    return uuid[-12:]


def check_cells(shape: str, c: dict) -> list[str]:
    """One check's row: the unit left out, how many units' mean predicted it, and the worst errors."""
    return [shape, short(c["gpu_uuid"]), "yes" if c["unit_in_shipped"] else "no",
            f"{c['mean_of']} unit{'s' if c['mean_of'] != 1 else ''}", f"{c['max_abs_error']:.1%}",
            f"{c['own_profile_max_abs_error']:.1%}", f"{c['gpu_profile_max_abs_error']:.1%}",
            f"`{Path(c['raw']).name}`"]


def render(d: dict) -> str:
    lines = [
        f"# Shipped per-model profiles of common models ({d['gpu']})",
        "",
        f"Computed {d['date']}, no GPU, from per-model profiles and end-to-end measurements on {d['units']} "
        f"{d['gpu']} units, driver {d['driver']}, measured {d['measured']} (random weights of each shape, the "
        f"project's runtime, the NVML meter; `benchmarks/energy_transfer_collect.py`); command `{d['command']}`.",
        "",
        "Each shape's shipped profile is the mean of the listed units' per-model profiles (every metered number "
        "averaged). Each check predicts one run's end-to-end rows (five plans; decode at batch 1, 16, 64; "
        "prefill) from the mean of the *other* units' profiles, so no unit is predicted from its own profile. "
        "For comparison: that run's own per-model profile (same unit, the 3% target) and the shipped GPU profile "
        f"(a model nobody profiled, the {TARGET:.0%} target).",
        "",
        "A shape's mean is shipped where its worst error is below the GPU profile's on the same runs.",
        "",
        *md_table(["shape", "units averaged", "checked runs (units)", "worst, others' mean",
                   "worst, shipped GPU profile", "shipped"],
                  [[s["shape"], str(len(s["units"])),
                    f"{len(s['checks'])} ({len({c['gpu_uuid'] for c in s['checks']})})", f"{s['max_abs_error']:.1%}",
                    f"{s['gpu_profile_max_abs_error']:.1%}", "yes" if s["shipped"] else "no"] for s in d["shapes"]],
                  "lrrrrl"),
    ]
    lines += ["", "## Every check", "",
              *md_table(["shape", "GPU unit", "in the shipped mean", "predicted from", "worst, others' mean",
                         "own profile", "shipped GPU profile", "run"],
                        [check_cells(s["shape"], c) for s in d["shapes"]
                         for c in sorted(s["checks"], key=lambda c: -c["max_abs_error"])], "lllrrrrl")]
    if d["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in d["notes"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", required=True, choices=["h100", "h200"])
    ap.add_argument("--raw", type=Path, action="append", required=True, help="energy_transfer_collect output")
    ap.add_argument("--gpu-profile", type=Path, required=True, help="the shipped GPU profile, for comparison")
    ap.add_argument("--shapes", default="", help="comma-separated reference shapes (default: every one with 2+ units)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--notes", type=Path)
    ap.add_argument("--ship", action="store_true", help="write each mean into advisor/energy/profiles/models")
    args = ap.parse_args(argv)
    command = command_line(argv)
    missing = [str(p) for p in [*args.raw, args.gpu_profile] if not p.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    runs = [(str(p), json.loads(p.read_text())) for p in args.raw]
    runs = [(p, r) for p, r in runs if r.get("shapes")]
    if any(r["gpu"] != runs[0][1]["gpu"] for _, r in runs):
        print("error: the runs are of different GPUs", file=sys.stderr)
        return 2
    gpu_profile = json.loads(args.gpu_profile.read_text())
    legacy = shipped_profile(GPU(args.kind))
    names = [s for s in args.shapes.split(",") if s] or [n for n in REFERENCE_SHAPES
                                                         if any(n in r["shapes"] for _, r in runs)]
    shapes = [s for n in names if (s := evaluate(n, runs, gpu_profile, legacy, command)) is not None]
    report = str(args.out.with_suffix(".md"))
    for s in shapes:
        s["profile"]["caveat"] = caveat(s, report)
    d = {"gpu": runs[0][1]["gpu"], "kind": args.kind, "date": dt.date.today().isoformat(),
         "measured": date_range([r for _, r in runs]),
         "driver": " / ".join(sorted({r["driver"] for _, r in runs})),
         "units": len({r["gpu_uuid"] for _, r in runs}), "command": command, "target": TARGET,
         "notes": read_notes(args.notes),
         "shapes": [{k: v for k, v in s.items() if k != "profile"} for s in shapes]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, d, render)
    if args.ship:
        store = ProfileStore(root=shipped_model_profiles(), shipped=shipped_model_profiles())
        for s in shapes:
            if s["shipped"]:
                print(f"shipped {s['shape']}: {store.save(s['profile'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
