"""Write the short Markdown summary beside an energy_formats JSON (no GPU needed).

python benchmarks/studies/energy_formats_md.py [reports/benchmarks/energy_formats.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def render(d: dict) -> str:
    rows = d["rows"]
    lines = [
        "# Energy per token by format: Llama-3.1-8B shape (random weights)",
        "",
        f"Measured on **{d['gpu']}**, driver {d['driver']}, power limit {d['power_limit_w']:.0f} W "
        f"(idle {d['idle_power_w']:.0f} W), {d['date']}; copy bandwidth measured {d['copy_bandwidth_gb_s']:.0f} GB/s; "
        f"torch {d['torch']}.",
        f"Command: `{d['command']}`.",
        "",
        "Runtime: static KV cache, CUDA-graph decode step and prefill, fused Triton RMSNorm and SiLU*up "
        f"kernels, decode attention `{d['decode_attention']}` (one fused kernel: rotary embedding, KV-cache write, "
        "flash-decoding over the real context only, FP8 output for an FP8 o_proj); FP8 groups are "
        "cuBLASLt FP8 GEMMs (`torch._scaled_mm`, per-tensor static scales; kernels `nvjet_sm90_qqtst_*`), "
        "lm_head BF16. Meter: NVML energy counter, tick-aligned windows >= 5 s, 3 repeats, median; "
        "`cv` = coefficient of variation of J/step across the windows. `ms_per_step` is the sustained step "
        "time inside the meter windows (decode rows without J were timed with CUDA events only). "
        "floor = (weight bytes + KV bytes read) / copy bandwidth; floor_ratio = format floor / BF16 floor.",
        "",
        "| format | phase | batch | seq | ms/step | floor ms | x floor | J/token | W | tok/s/W "
        "| floor_ratio | J vs BF16 | cv |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['format']} | {r['phase']} | {r['batch']} | {r['seq_len']} | {r['ms_per_step']:.3f} | "
            f"{r['floor_ms']:.3f} | {r['time_over_floor']:.2f} | {_f(r['j_per_token'], '{:.4f}')} | "
            f"{_f(r['power_w'], '{:.0f}')} | {_f(r.get('tokens_per_s_per_w'), '{:.2f}')} | {r['floor_ratio']:.3f} | "
            f"{_f(r.get('j_ratio_vs_bf16'))} | {_f(r['cv'], '{:.4f}')} |"
        )
    lines += ["", "## Targets", ""]
    bf_dec = [r for r in rows if r["format"] == "bf16" and r["phase"] == "decode" and r["batch"] <= 64]
    worst = max(bf_dec, key=lambda r: r["time_over_floor"])
    lines.append(
        f"- BF16 decode within 1.3x of the floor, batch 1-64, context {worst['seq_len']}: worst "
        f"{worst['time_over_floor']:.2f}x (batch {worst['batch']}); per batch "
        + ", ".join(f"b{r['batch']} {r['time_over_floor']:.2f}x" for r in bf_dec)
        + (" -> **met**" if worst["time_over_floor"] <= 1.3 else " -> **missed**")
    )
    for r in rows:
        if r["format"] == "fp8" and r.get("j_ratio_vs_bf16") is not None:
            if r["phase"] == "decode":
                ok = r["j_ratio_over_floor_ratio"] <= 1.1
                tag = "" if r["batch"] < 16 else (" -> **met**" if ok else " -> **missed**")
                lines.append(
                    f"- FP8 decode b{r['batch']}: J/token {r['j_ratio_vs_bf16']:.3f}x BF16, floor ratio "
                    f"{r['floor_ratio']:.3f}, so {r['j_ratio_over_floor_ratio']:.3f}x the floor ratio "
                    f"(target <= 1.1 at batch >= 16){tag}"
                )
            else:
                ok = r["j_ratio_vs_bf16"] <= 0.65
                lines.append(
                    f"- FP8 prefill L{r['seq_len']}: {r['j_ratio_vs_bf16']:.3f}x BF16 J/token (target <= 0.65)"
                    + (" -> **met**" if ok else " -> **missed**")
                )
    cvs = [r["cv"] for r in rows if r["cv"] is not None]
    lines.append(
        f"- Repeat CV of J/token: max {max(cvs):.4f} (target <= 0.01)"
        + (" -> **met**" if max(cvs) <= 0.01 else " -> **missed**")
    )
    if d.get("predictions"):
        errs = [abs(p["error"]) for p in d["predictions"]]
        lines.append(
            f"- Cost model (profile `{d['profile']}`, same GPU: {d.get('profile_same_gpu')}) vs measurement: "
            f"max |error| {max(errs) * 100:.1f}% over {len(errs)} rows (target <= 5%)"
            + (" -> **met**" if max(errs) <= 0.05 else " -> **missed**")
        )
        lines += [
            "",
            "| plan | phase | batch | seq | measured J/step | predicted J/step | error |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for p in d["predictions"]:
            lines.append(
                f"| {p['format']} | {p['phase']} | {p['batch']} | {p['seq_len']} | "
                f"{p['measured_j_per_step']:.3f} | {p['predicted_j_per_step']:.3f} | {p['error'] * 100:+.1f}% |"
            )
    if d.get("requests"):
        lines += [
            "",
            "## J per request (prefill of the input + output tokens decoded at the batch)",
            "",
            "| format | batch | input | output | J/request | J/output token |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for q in d["requests"]:
            lines.append(
                f"| {q['format']} | {q['batch']} | {q['input_tokens']} | {q['output_tokens']} | "
                f"{q['j_per_request']:.1f} | {q['j_per_output_token']:.4f} |"
            )
    if d.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    for path in map(Path, args or ["reports/benchmarks/energy_formats.json"]):
        out = path.with_suffix(".md")
        out.write_text(render(json.loads(path.read_text())))
        print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
