"""Derive an UNVERIFIED B200 energy profile from the measured H200 one and datasheet ratios.

No B200 was available. Every number here is the H200 measurement scaled by datasheet
ratios (NVIDIA H200 and HGX B200 datasheets, SXM parts), under these assumptions:

* decode GEMMs are memory-bound: time x (4.8 / 8.0 TB/s);
* prefill GEMMs are compute-bound: time x (989 / 2250) for BF16, (1979 / 4500) for FP8;
* NVFP4 GEMMs: decode at the FP8 time x 0.5625 / 1 bytes per weight (scales included),
  prefill at the FP8 time x 4500 / 9000 (twice the FP8 rate);
* the non-GEMM part of a step (attention, norms, launch gaps) x 0.75 (assumed);
* power: idle + (H200 power - H200 idle) x (1000 - 120) / (700 - 75) W, NVFP4 as FP8.

    python benchmarks/studies/energy_derive_b200.py advisor/profiles/h200_2026-11-22.json \
        advisor/profiles/b200_datasheet_2026-11-22.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from advisor.plan import DENSE_GROUP_KINDS

KINDS = DENSE_GROUP_KINDS
MEM = 4.8 / 8.0
COMP = {"bf16": 989 / 2250, "fp8": 1979 / 4500}
NG = 0.75
H_IDLE, H_TDP, B_IDLE, B_TDP = 75.0, 700.0, 120.0, 1000.0


def _power(w: float) -> float:
    return B_IDLE + (w - H_IDLE) * (B_TDP - B_IDLE) / (H_TDP - H_IDLE)


def derive(h: dict) -> dict:
    nl = h["model"]["num_layers"]
    out = json.loads(json.dumps(h))
    for phase in ("decode", "prefill"):
        src = h[phase]
        dst = out[phase]
        xs = src["batches"] if phase == "decode" else src["lengths"]
        gem = {}
        for f in ("bf16", "fp8"):
            s = MEM if phase == "decode" else COMP[f]
            gem[f] = {k: [t * s for t in src["gemm_ms"][f][k]] for k in KINDS}
        nv_scale = 0.5625 if phase == "decode" else 0.5
        gem["nvfp4"] = {k: [t * nv_scale for t in gem["fp8"][k]] for k in KINDS}
        dst["gemm_ms"] = gem

        def gemm_sum(f, i, src_gem):
            return nl * sum(src_gem[f][k][i] for k in KINDS)

        # non-GEMM time of each all-format step, scaled; nvfp4 takes fp8's
        def new_step(f_src, f_dst, t_src, i, src=src, gem=gem):
            ng = t_src - gemm_sum(f_src, i, src["gemm_ms"])
            return NG * ng + gemm_sum(f_dst, i, gem)

        if phase == "decode":
            dst["step_ms"] = {}
            for f_dst, f_src in (("bf16", "bf16"), ("fp8", "fp8"), ("nvfp4", "fp8")):
                dst["step_ms"][f_dst] = {
                    c: [new_step(f_src, f_dst, t, i) for i, t in enumerate(ts)]
                    for c, ts in src["step_ms"][f_src].items()
                }
            ex = src["energy_batches"]
            c0 = str(src["contexts"][0])
            idx = [xs.index(b) for b in ex]
        else:
            dst["step_ms"] = {
                f_dst: [new_step(f_src, f_dst, t, i) for i, t in enumerate(src["step_ms"][f_src])]
                for f_dst, f_src in (("bf16", "bf16"), ("fp8", "fp8"), ("nvfp4", "fp8"))
            }
            idx = list(range(len(xs)))
        dst["power_w"] = {}
        dst["j_per_step"] = {}
        for f_dst, f_src in (("bf16", "bf16"), ("fp8", "fp8"), ("nvfp4", "fp8")):
            if phase == "decode":
                t_src = [src["step_ms"][f_src][c0][i] for i in idx]
                t_dst = [dst["step_ms"][f_dst][c0][i] for i in idx]
            else:
                t_src = src["step_ms"][f_src]
                t_dst = dst["step_ms"][f_dst]
            # H200 effective watts over the timed step, mapped to the B200's range
            watts = [_power(j / (t / 1e3)) for j, t in zip(src["j_per_step"][f_src], t_src, strict=True)]
            dst["power_w"][f_dst] = watts
            dst["j_per_step"][f_dst] = [w * t / 1e3 for w, t in zip(watts, t_dst, strict=True)]
    out.update(
        gpu="NVIDIA B200 (datasheet-derived)",
        gpu_uuid=None,
        gpu_kind="b200",
        driver="n/a",
        power_limit_w=B_TDP,
        idle_power_w=B_IDLE,
        copy_bandwidth_gb_s=h["copy_bandwidth_gb_s"] / 4.8 * 8.0,
        source="datasheet-derived",
        verified=False,
        formats=["bf16", "fp8", "nvfp4"],
        derived_from=f"{h['gpu']} profile measured {h['date']} (driver {h['driver']})",
        derivation=(__doc__ or "").strip(),
        command="python " + " ".join(sys.argv),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    src, dst = Path(args[0]), Path(args[1])
    Path(dst).write_text(json.dumps(derive(json.loads(src.read_text())), indent=1))
    print("wrote", dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
