"""Energy you can trust for your own model: per-model and shipped GPU profiles against measurements.

Reads what ``benchmarks/energy_transfer_collect.py`` measured on the GPU (per-model profiles and
end-to-end measurements of each shape and plan), predicts every measured row with

* the per-model profile of that shape (``advisor.energy.prediction``),
* the shipped GPU profile (``advisor.energy.prediction``: GEMM tables plus anchor models that
  are none of the tested shapes), as for a model nobody profiled,
* the older layer profile scaled by weight count (``advisor.energy.prediction``), for comparison,

and writes ``reports/benchmarks/energy_transfer.{json,md}``. No GPU needed here.

    python benchmarks/energy_transfer.py --raw RAW.json [--raw RAW2.json] [--repeat RAW3.json] \
        --gpu-profile advisor/energy/profiles/h100_gemm_<date>.json

A shape in several files is summarised once per run (``runs``: each GPU unit and meter setting),
and the latest ``--raw`` gives its rows; ``--repeat`` files add runs to that summary only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import command_line, md_table, measured_on, read_notes, write_report  # noqa: E402
from energy_transfer_collect import DECODE_CONTEXT, INPUT, OUTPUT, plan_formats  # noqa: E402

from advisor.energy.prediction import (
    GpuProfileCostModel,  # noqa: E402
    ModelProfileCostModel,  # noqa: E402
    ProfileCostModel,  # noqa: E402
)
from advisor.energy.profiling import (
    REFERENCE_SHAPES,  # noqa: E402
    shipped_profile,  # noqa: E402
)
from advisor.formats import GPU  # noqa: E402
from advisor.plan import Plan  # noqa: E402

MODEL_TARGET, SHIPPED_TARGET = 0.03, 0.10


def predict(model, plan: Plan, row: dict) -> float:
    """Predicted J per token of one measured row (decode: per generated token; prefill: per prompt token)."""
    if row["phase"] == "decode":
        _, j = model.decode_step(plan, row["batch"], row["context"])
    else:
        _, j = model.prefill(plan, row["context"])
    return j / row["tokens_per_step"]


def shape_rows(name: str, data: dict, gpu_profile: dict, legacy_profile: dict) -> list[dict]:
    layers = data["num_layers"]
    shape = REFERENCE_SHAPES[name].shape(layers)
    models = {"model_profile": ModelProfileCostModel(data["profile"], shape),
              "shipped_profile": GpuProfileCostModel(gpu_profile, shape),
              "layer_profile": ProfileCostModel(legacy_profile, shape)}
    plans = {k: Plan(v) for k, v in plan_formats(layers).items()}
    rows = []
    for r in data["rows"]:
        row = {"shape": name, "params_b": round(REFERENCE_SHAPES[name].params_b, 3), "layers": layers,
               "full_layers": data["full_layers"], "plan": r["plan"], "phase": r["phase"], "batch": r["batch"],
               "context": r["context"], "measured_j_per_token": r["measured_j_per_token"],
               "measured_cv": r["cv"], "measured_power_w": r["power_w"]}
        for key, model in models.items():
            row[f"{key}_j_per_token"] = predict(model, plans[r["plan"]], r)
            row[f"{key}_error"] = row[f"{key}_j_per_token"] / r["measured_j_per_token"] - 1
        rows.append(row)
    return rows


def request_rows(rows: list[dict]) -> list[dict]:
    """J per generated token of a request (512 in, 256 out) at each batch: prefill + decode."""
    out = []
    keys = ("measured", "model_profile", "shipped_profile", "layer_profile")
    by = {(r["shape"], r["plan"], r["phase"], r["batch"]): r for r in rows}
    for (shape, plan, phase, b), r in by.items():
        if phase != "decode":
            continue
        pre = by[(shape, plan, "prefill", 1)]
        row = {"shape": shape, "plan": plan, "batch": b}
        for k in keys:
            # prefill J/token x prompt tokens + decode J/token x output tokens, per output token
            row[f"{k}_j_per_token"] = (pre[f"{k}_j_per_token"] * INPUT + r[f"{k}_j_per_token"] * OUTPUT) / OUTPUT
        for k in keys[1:]:
            row[f"{k}_error"] = row[f"{k}_j_per_token"] / row["measured_j_per_token"] - 1
        out.append(row)
    return out


def run_summaries(paths: list[Path], raws: list[dict], gpu_profile: dict, legacy: dict) -> list[dict]:
    """Per run (file) and shape: its GPU unit, meter windows and max |error| of each predictor."""
    out = []
    for path, raw in zip(paths, raws, strict=True):
        for name, data in raw["shapes"].items():
            these = shape_rows(name, data, gpu_profile, legacy)
            out.append({"shape": name, "raw": str(path), "gpu_uuid": raw["gpu_uuid"],
                        "windows_s": [raw["profile_meter"]["min_window_s"], raw["bench_meter"]["min_window_s"]],
                        "soak": data["profile"].get("soak"), "profiled": profiled_plans(data["profile"]),
                        **{f"{k}_max_abs_error": max(abs(r[f"{k}_error"]) for r in these)
                           for k in ("model_profile", "shipped_profile")}})
    return sorted(out, key=lambda r: list(REFERENCE_SHAPES).index(r["shape"]))


def profiled_plans(profile: dict) -> str:
    """What the per-model profile metered: its decode contexts, and a corner where it has one (the last-layer one
    of a trial, not kept; the kind corner, MLP-only FP8; the mixing point, every other layer FP8, which the cost
    model reads for prefills only since 2026-11-23; a trial's middle point, not read; the position point, the last
    quarter FP8, decode, since 2026-11-26)."""
    d = profile["decode"]
    named = (("last_fp8", "last layer"), ("mlp_fp8", "MLP corner"), ("alt_fp8", "mixing point (prefill)"),
             ("middle_fp8", "middle point, not read"), ("last_quarter_fp8", "last quarter (decode)"))
    # since 2026-11-23 a profile meters the mixing point's prefill only
    corners = [name for key, name in named if key in d or key in profile["prefill"]]
    if "mixing_layout" in profile:  # run 26's trial layout (notes): every other layer counted back from the last
        corners[corners.index("mixing point (prefill)")] += f" ({profile['mixing_layout']}, trial)"
    return "/".join(str(c) for c in d["contexts"]) + "".join(f" + {c}" for c in corners)


def date_range(raws: list[dict]) -> str:
    """The day the runs were measured, or the first and last of them."""
    days = sorted({r["date"][:10] for r in raws})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def pct(v: float) -> str:
    return f"{v * 100:+.1f}%"


def run_cells(r: dict) -> list[str]:
    """One run's row: its unit, meter windows, thermal soak, what its profile metered, and its worst errors."""
    soak = r.get("soak")
    warm = f"{soak['from_c']:.0f} -> {soak['to_c']:.0f} C" if soak else "none"
    return [r["shape"], r["gpu_uuid"][-12:], f"{r['windows_s'][0]} / {r['windows_s'][1]}", warm,
            r.get("profiled", ""), f"{r['model_profile_max_abs_error'] * 100:.1f}%",
            f"{r['shipped_profile_max_abs_error'] * 100:.1f}%", f"`{Path(r['raw']).name}`"]


def render(d: dict) -> str:
    lines = [
        "# Energy transfer: per-model and shipped GPU profiles against end-to-end measurements",
        "",
        f"{measured_on(d)} (random weights of each shape, the "
        f"project's runtime, NVML meter); command `{d['command']}`. Predicted: this table's predictions, "
        "computed from profiles measured on the GPU (no GPU needed to predict).",
        "",
        f"Decode rows: J per generated token of a decode step at context {DECODE_CONTEXT} (= {INPUT} + {OUTPUT}/2); "
        f"prefill rows: J per prompt token of one {INPUT}-token prompt (batch 1). Targets: per-model profile "
        f"within {MODEL_TARGET:.0%}, shipped GPU profile within {SHIPPED_TARGET:.0%}.",
        "",
        "Plans: all-BF16 (`bf16`), all-FP8 (`fp8`), every layer's MLP in FP8 (`mlp-fp8`), the middle half of "
        "the layers in FP8 (`middle-fp8`), attention FP8 in every layer plus the MLP FP8 in the first half "
        "(`attn+half-mlp-fp8`). A per-model profile with the kind corner meters the first three itself (at "
        "its own contexts, in its own meter windows); the last two it predicts from them.",
        "",
        "## Summary (max |error| over plans, phases and batches)",
        "",
        *md_table(["shape", "params (B)", "layers run", "per-model profile", "shipped GPU profile",
                   "old layer profile", "profile time (s)"],
                  [[s["shape"], f"{s['params_b']:.2f}", f"{s['layers']}/{s['full_layers']}",
                    f"{s['model_profile_max_abs_error'] * 100:.1f}%",
                    f"{s['shipped_profile_max_abs_error'] * 100:.1f}%",
                    f"{s['layer_profile_max_abs_error'] * 100:.0f}%", f"{s['profile_seconds']:.0f}"]
                   for s in d["shapes"]], "lrrrrrr"),
    ]
    if len(d.get("runs", [])) > len(d["shapes"]):
        lines += ["", "## Every run of each shape (GPU unit, profile / plan meter windows, the profile's thermal soak, "
                  "its decode contexts and corner)", "",
                  *md_table(["shape", "GPU unit", "windows (s)", "soak", "profiled", "per-model profile",
                             "shipped GPU profile", "run"], [run_cells(r) for r in d["runs"]], "lllllrrl")]
    lines += ["", "## Every row", "",
              *md_table(["shape", "plan", "phase", "batch", "measured J/token", "its CV", "per-model", "err",
                         "shipped", "err", "old layer", "err"],
                        [[r["shape"], r["plan"], r["phase"], str(r["batch"]), f"{r['measured_j_per_token']:.5g}",
                          f"{r['measured_cv'] * 100:.1f}%", f"{r['model_profile_j_per_token']:.5g}",
                          pct(r["model_profile_error"]), f"{r['shipped_profile_j_per_token']:.5g}",
                          pct(r["shipped_profile_error"]), f"{r['layer_profile_j_per_token']:.5g}",
                          pct(r["layer_profile_error"])] for r in d["rows"]], "lllrrrrrrrrr")]
    lines += ["", f"## Requests ({INPUT} prompt + {OUTPUT} generated tokens), J per generated token", "",
              *md_table(["shape", "plan", "batch", "measured", "per-model err", "shipped err", "old layer err"],
                        [[r["shape"], r["plan"], str(r["batch"]), f"{r['measured_j_per_token']:.5g}",
                          pct(r["model_profile_error"]), pct(r["shipped_profile_error"]),
                          pct(r["layer_profile_error"])] for r in d["requests"]], "llrrrrr")]
    if d.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, action="append", required=True,
                    help="collect output; a shape in a later file replaces the earlier one")
    ap.add_argument("--repeat", type=Path, action="append", default=[],
                    help="collect output of another run of the same shapes: summarised per run only")
    ap.add_argument("--gpu-profile", type=Path, required=True)
    ap.add_argument("--notes", type=Path, help="a JSON list of notes for the Markdown")
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/energy_transfer.json"))
    args = ap.parse_args(argv)
    raws = [json.loads(p.read_text()) for p in args.raw]
    repeats = [json.loads(p.read_text()) for p in args.repeat]
    shapes: dict[str, dict] = {}
    source: dict[str, str] = {}
    for path, raw in zip(args.raw, raws, strict=True):
        for name, data in raw["shapes"].items():
            shapes[name], source[name] = data, str(path)
    gpu_profile = json.loads(args.gpu_profile.read_text())
    legacy = shipped_profile(GPU(gpu_profile["gpu_kind"]))
    rows, summary = [], []
    for name, data in shapes.items():
        these = shape_rows(name, data, gpu_profile, legacy)
        rows += these
        prof = data["profile"]
        summary.append({"shape": name, "params_b": REFERENCE_SHAPES[name].params_b, "layers": data["num_layers"],
                        "full_layers": data["full_layers"], "raw": source[name],
                        "profile_seconds": prof["profile_seconds"] + data.get("bench_create_s", 0.0),
                        **{f"{k}_max_abs_error": max(abs(r[f"{k}_error"]) for r in these)
                           for k in ("model_profile", "shipped_profile", "layer_profile")}})
    summary.sort(key=lambda r: list(REFERENCE_SHAPES).index(r["shape"]))
    first = raws[0]
    out = {
        "gpu": first["gpu"], "gpu_uuid": sorted({r["gpu_uuid"] for r in [*raws, *repeats]}), "driver": first["driver"],
        "power_limit_w": first["power_limit_w"], "date": date_range([*raws, *repeats]),
        "command": " ; ".join(r["command"] for r in [*raws, *repeats]) + " ; " + command_line(argv),
        "gpu_profile": str(args.gpu_profile), "gpu_profile_anchors": sorted(gpu_profile["anchors"]),
        "shapes": summary, "rows": rows, "requests": request_rows(rows),
        "runs": run_summaries([*args.raw, *args.repeat], [*raws, *repeats], gpu_profile, legacy),
        "notes": read_notes(args.notes),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.out, out, render, newline=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
