"""Which models should a GPU profile's metered GEMM energies price? No GPU needed.

A shipped GPU profile's ``gemm_energy`` section (``advisor.energy.profiling``) prices models whose
layers hold at least ``min_layer_weights`` weights; smaller ones follow its ``small_layers`` rule: the
fitted energy form alone, or the mean of the two forms. This script prices every measured row of every
run (``benchmarks/energy_transfer_collect.py`` outputs) with the profile as shipped, but with that
threshold moved and each rule, and reports the worst error per shape: from 0 (the section prices every
model) to infinity (the fitted form, or the mean, prices every model).

    python benchmarks/studies/gemm_energy_threshold.py --gpu-profile advisor/energy/profiles/h100_gemm_2026-11-22.json \
        --raw reports/benchmarks/energy_transfer_data/h100_raw3.json [--raw ...] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _report import command_line, read_notes, write_report  # noqa: E402
from energy_transfer import shape_rows  # noqa: E402

from advisor.energy.profiling import (
    REFERENCE_SHAPES,  # noqa: E402
    Geometry,
    layer_weights,
    shipped_profile,  # noqa: E402
)
from advisor.formats import GPU  # noqa: E402

#: (min weights per layer, rule below it)
VARIANTS = ((0.0, "fitted"), (40e6, "fitted"), (80e6, "fitted"), (math.inf, "fitted"), (80e6, "mean"),
            (math.inf, "mean"))


def worst_by_shape(profile: dict, raws: list[dict], threshold: float, rule: str) -> dict[str, float]:
    """Max |error| of the shipped-profile prediction per shape over every row of every run, with the section's
    threshold at ``threshold`` weights per layer and ``rule`` below it."""
    section = {**profile["gemm_energy"], "min_layer_weights": threshold, "small_layers": rule}
    moved = {**profile, "gemm_energy": section}
    legacy = shipped_profile(GPU(profile["gpu_kind"]))
    worst: dict[str, float] = {}
    for raw in raws:
        for name, data in raw["shapes"].items():
            for r in shape_rows(name, data, moved, legacy):
                worst[name] = max(worst.get(name, 0.0), abs(r["shipped_profile_error"]))
    return dict(sorted(worst.items(), key=lambda kv: list(REFERENCE_SHAPES).index(kv[0])))


def label(threshold: float | None, rule: str) -> str:
    below = "the fitted form" if rule == "fitted" else "the mean of both forms"
    if threshold is None:
        return f"none ({below} for every model)"
    if threshold == 0:
        return "0 (metered GEMM energies for every model)"
    return f"{threshold / 1e6:.0f}M, {below} below"


def render(d: dict) -> str:
    shapes = list(d["results"][0]["worst"])
    lines = [f"# Metered GEMM energies: which models they should price ({d['gpu']})", "",
             f"Computed {d['date']}, no GPU; command `{d['command']}`. The shipped profile as it is, with its "
             f"`min_layer_weights` moved (shipped: {d['shipped_threshold'] / 1e6:.0f}M) and each rule below it "
             f"(shipped: {d['shipped_rule']}). Each cell: max |error| over "
             f"every row of every run ({len(d['runs'])} runs on {d['units']} units). Weights per layer: "
             + ", ".join(f"{s} {d['layer_weights'][s] / 1e6:.1f}M" for s in shapes) + ".", "",
             "| min weights per layer, rule below | " + " | ".join(shapes) + " | worst |",
             "|---|" + "---:|" * (len(shapes) + 1)]
    for res in d["results"]:
        w = res["worst"]
        cells = " | ".join(f"{w[s] * 100:.1f}%" for s in shapes)
        name = label(res["threshold"], res.get("rule", "fitted"))
        lines.append(f"| {name} | {cells} | {max(w.values()) * 100:.1f}% |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in d.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-profile", type=Path, required=True, help="a GPU profile with a gemm_energy section")
    ap.add_argument("--raw", type=Path, action="append", required=True, help="energy_transfer_collect output")
    ap.add_argument("--notes", type=Path, help="a JSON list of notes for the Markdown")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    profile = json.loads(args.gpu_profile.read_text())
    if "gemm_energy" not in profile:
        ap.error(f"{args.gpu_profile} has no gemm_energy section")
    raws = [r for p in args.raw if (r := json.loads(p.read_text()))["shapes"]]
    shapes = sorted({n for r in raws for n in r["shapes"]}, key=list(REFERENCE_SHAPES).index)
    d = {"gpu": profile["gpu"], "date": date.today().isoformat(),
         "command": command_line(argv),
         "runs": [str(p) for p in args.raw], "units": len({r["gpu_uuid"] for r in raws}),
         "shipped_threshold": profile["gemm_energy"]["min_layer_weights"],
         "shipped_rule": profile["gemm_energy"].get("small_layers", "fitted"),
         "layer_weights": {s: layer_weights(Geometry.from_shape(REFERENCE_SHAPES[s].shape())) for s in shapes},
         "results": [{"threshold": None if math.isinf(t) else t, "rule": rule,
                      "worst": worst_by_shape(profile, raws, t, rule)} for t, rule in VARIANTS],
         "notes": read_notes(args.notes)}
    write_report(args.out, d, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
