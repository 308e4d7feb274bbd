"""Does the profile cost model transfer to a model of another size? SmolLM2-135M, measured.

The shipped profiles were measured on a Llama-3.1-8B shape. For any other model the
cost model scales each GEMM's time by its weight count and the non-GEMM time by
layers x hidden (advisor/energy/costmodel.py). This measures the shape of
SmolLM2-135M (the quickstart's model; config numbers of HuggingFaceTB/SmolLM2-135M,
random weights) with the runtime under the NVML meter, for all-BF16, all-FP8 and
one mixed plan on the quickstart's two workloads, and puts the profile's
predictions beside the measurements.

    python benchmarks/studies/costmodel_transfer.py --profile advisor/profiles/h100_2026-11-22.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from advisor.energy.measure import MeasuredEnergyModel
from advisor.energy.prediction import ProfileCostModel
from advisor.energy.profiling import load_profile, measurement_header
from advisor.energy.runtime import copy_bandwidth_gb_s
from advisor.formats import Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

# HuggingFaceTB/SmolLM2-135M config.json
SMOLLM2_135M = dict(num_layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, head_dim=64)
WORKLOADS = (
    Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256),
    Workload(name="batch1", batch_size=1, input_tokens=512, output_tokens=256),
)


def plans(shape) -> dict[str, Plan]:
    names = [g.name for g in shape.groups]
    return {
        "bf16": Plan({n: Format.BF16 for n in names}),
        "fp8": Plan({n: Format.FP8 for n in names}),
        "mixed-mlp-fp8": Plan({n: Format.FP8 if n.endswith(("gate_up", "down")) else Format.BF16 for n in names}),
    }


def render(d: dict) -> str:
    lines = [
        "# Cost-model transfer: SmolLM2-135M shape, measured against the Llama-3.1-8B profile",
        "",
        f"Measured on **{d['gpu']}**, driver {d['driver']}, {d['date']}; command `{d['command']}`; "
        f"profile `{d['profile']}` ({d['profile_gpu']}, same GPU: {d['profile_same_gpu']}).",
        "",
        "| plan | workload | measured J/token | predicted J/token | error | measured decode tok/s "
        "| predicted decode tok/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        lines.append(
            f"| {r['plan']} | {r['workload']} | {r['measured_j_per_token']:.5f} | {r['predicted_j_per_token']:.5f} | "
            f"{r['error'] * 100:+.0f}% | {r['measured_decode_tokens_per_s']:.0f} | "
            f"{r['predicted_decode_tokens_per_s']:.0f} |"
        )
    lines += ["", "| workload | FP8 / BF16 J/token measured | predicted |", "|---|---:|---:|"]
    for w, v in d["fp8_over_bf16"].items():
        lines.append(f"| {w} | {v['measured']:.3f} | {v['predicted']:.3f} |")
    if d.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/costmodel_transfer.json"))
    ap.add_argument("--render-only", action="store_true", help="only rewrite the .md beside --out (no GPU)")
    args = ap.parse_args(argv)
    if args.render_only:
        args.out.with_suffix(".md").write_text(render(json.loads(args.out.read_text())))
        return 0
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    shape = llama_shape("model.layers", **SMOLLM2_135M)
    profile = load_profile(args.profile)
    predicted = ProfileCostModel(profile, shape)
    measured = MeasuredEnergyModel(shape)
    state = measured.meter.counter.state()
    header = measurement_header(state, measured.meter.idle_power_w(), copy_bandwidth_gb_s(), command, torch.__version__)
    rows = []
    for name, plan in plans(shape).items():
        for w in WORKLOADS:
            m = measured.estimate(plan, w)
            p = predicted.estimate(plan, w)
            rows.append(
                {
                    "plan": name,
                    "workload": w.name,
                    "measured_j_per_token": m.j_per_token,
                    "predicted_j_per_token": p.j_per_token,
                    "error": p.j_per_token / m.j_per_token - 1,
                    "measured_decode_j_per_token": m.decode_j_per_token,
                    "predicted_decode_j_per_token": p.decode_j_per_token,
                    "measured_prefill_j_per_input_token": m.prefill_j_per_input_token,
                    "predicted_prefill_j_per_input_token": p.prefill_j_per_input_token,
                    "measured_decode_tokens_per_s": m.decode_tokens_per_s,
                    "predicted_decode_tokens_per_s": p.decode_tokens_per_s,
                }
            )
            print(
                f"{name:14s} {w.name:7s} measured {m.j_per_token:.5f} J/tok, predicted {p.j_per_token:.5f} "
                f"({rows[-1]['error'] * 100:+.0f}%); decode {m.decode_tokens_per_s:.0f} vs "
                f"{p.decode_tokens_per_s:.0f} tok/s",
                flush=True,
            )
    by = {(r["plan"], r["workload"]): r for r in rows}
    ratio = {
        w.name: {
            k: by[("fp8", w.name)][f"{k}_j_per_token"] / by[("bf16", w.name)][f"{k}_j_per_token"]
            for k in ("measured", "predicted")
        }
        for w in WORKLOADS
    }
    out = {
        **header,
        "profile": str(args.profile),
        "profile_gpu": profile["gpu"],
        "profile_same_gpu": profile.get("gpu_uuid") == state.uuid,
        "model": {"name": "SmolLM2-135M shape, random weights", **SMOLLM2_135M},
        "workloads": [w.model_dump() for w in WORKLOADS],
        "rows": rows,
        "fp8_over_bf16": ratio,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    args.out.with_suffix(".md").write_text(render(out))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
