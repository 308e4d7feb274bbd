"""Metered energy of each GEMM of the reference shapes (GPU): the GEMM tables' graphs, under the meter.

The shipped GPU profile times every fused group's GEMM (``advisor.energy.gemm_table``) and fits a
step's energy as a linear form of time, bytes and FLOPs. ``reports/benchmarks/shipped_fit_ceiling``
shows that no coefficients of that form price small models within 10%. This script meters each
GEMM's energy instead, at the row counts the transfer benchmark uses (decode batches 1, 16, 64;
prompts of 512 and 2048 tokens), so that only the non-GEMM remainder of a step is left to fit
(``benchmarks/shipped_fit_ceiling.py --gemm-energy``).

    python benchmarks/gemm_energy_collect.py --out OUT.json [--rows 1,16,64,512,2048] [--deadline-s 480]

Short meter windows (0.2 s, two per point), after a thermal soak; the file is rewritten after
every shape, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.energy.gemm_table import SCHEMA, nk_key  # noqa: E402
from advisor.formats import Format  # noqa: E402

#: the transfer benchmark's shapes and the shipped profile's anchors first; the rest after
FIRST = ("SmolLM2-135M", "Gemma-3-270M", "Qwen2.5-0.5B", "SmolLM2-360M", "Llama-3.2-1B", "Qwen2.5-1.5B", "Llama-3.2-3B",
         "Llama-3.1-8B", "Qwen2.5-14B", "Llama-3.1-70B", "Qwen2.5-7B")
SOAK_NK = (28672, 4096)  # Llama-3.1-8B's gate_up


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,16,64,512,2048", help="GEMM row counts metered")
    ap.add_argument("--window-s", type=float, default=0.2)
    ap.add_argument("--deadline-s", type=float, default=480.0, help="stop starting new shapes after this")
    ap.add_argument("--resume", type=Path, help="an earlier run's output: its shapes are kept, not measured again")
    args = ap.parse_args(argv)
    from advisor.energy.cuda_tools import GraphReplay, capture, copy_bandwidth_gb_s
    from advisor.energy.gemm_table import _over_copies, _weight_copies, gemm_row_energy
    from advisor.energy.measure import torch_with_gpu
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.model_profile import _release
    from advisor.energy.profile import measurement_header
    from advisor.energy.reference_shapes import REFERENCE_SHAPES, table_nk

    torch = torch_with_gpu()
    t0 = time.perf_counter()
    rows = tuple(int(v) for v in args.rows.split(","))
    cfg = MeterConfig(warmup_s=0.2, min_window_s=args.window_s, min_ticks=2, repeats=2, max_cv=0.02, attempts=2,
                      soak_s=20.0)
    meter = open_meter(torch.cuda.current_device(), cfg)
    state = meter.counter.state()
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    out = {"schema": SCHEMA + "/gemm-energy", **measurement_header(state, meter.idle_power_w(), copy_bandwidth_gb_s(),
                                                                    command, torch.__version__),
           "meter": cfg.__dict__, "m_buckets": list(rows), "gemm": {Format.BF16.value: {}, Format.FP8.value: {}}}
    if args.resume:
        earlier = json.loads(args.resume.read_text())
        out["gemm"], out["resumed_from"] = earlier["gemm"], {k: earlier[k] for k in ("gpu_uuid", "date", "command")}
    heads = {s.gemm_nk()["lm_head"] for s in REFERENCE_SHAPES.values()}
    order = table_nk(FIRST) + [nk for nk in table_nk() if nk not in set(table_nk(FIRST))]
    lins = _weight_copies(*SOAK_NK, Format.BF16, 16)  # warm the GPU once, on a large GEMM
    out["soak"] = meter.soak(GraphReplay(capture(_over_copies(lins, max(rows), SOAK_NK[1], Format.BF16))).launch,
                             cfg.soak_s)
    del lins
    for n, k in order:
        if time.perf_counter() - t0 > args.deadline_s:
            print(f"deadline: {nk_key(n, k)} and later not measured", flush=True)
            break
        for fmt in (Format.BF16, Format.FP8):
            if (fmt == Format.FP8 and (n, k) in heads) or nk_key(n, k) in out["gemm"][fmt.value]:
                continue  # the lm_head stays BF16; resumed shapes are kept
            points = gemm_row_energy(n, k, fmt, rows, meter)
            out["gemm"][fmt.value][nk_key(n, k)] = points
            print(f"[{time.perf_counter() - t0:6.1f}s] {nk_key(n, k):12s} {fmt.value:4s} " + " ".join(
                f"m{m}:{p['j'] * 1e3:.4f}mJ/{p['ms'] * 1e3:.1f}us/{p['power_w']:.0f}W"
                for m, p in zip(rows, points, strict=True)), flush=True)
        _release()
        out["seconds"] = time.perf_counter() - t0
        args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
