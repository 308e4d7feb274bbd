"""Metered energy of each GEMM of the reference shapes (GPU): the GEMM tables' graphs, under the meter.

The shipped GPU profile times every fused group's GEMM (``advisor.energy.profiling``) and fits a
step's energy as a linear form of time, bytes and FLOPs. ``reports/benchmarks/shipped_fit_ceiling``
shows that no coefficients of that form price small models within 10%. This script meters each
GEMM's energy instead, at the row counts the transfer benchmark uses (decode batches 1, 16, 64;
prompts of 512 and 2048 tokens), so that only the non-GEMM remainder of a step is left to fit
(``benchmarks/studies/shipped_fit_ceiling.py --gemm-energy``).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import command_line, dump_json  # noqa: E402

from advisor.energy.profiling import GPU_SCHEMA as SCHEMA  # noqa: E402

#: the transfer benchmark's shapes and the shipped profile's anchors first; the rest after
FIRST = ("SmolLM2-135M", "Gemma-3-270M", "Qwen2.5-0.5B", "SmolLM2-360M", "Llama-3.2-1B", "Qwen2.5-1.5B", "Llama-3.2-3B",
         "Llama-3.1-8B", "Qwen2.5-14B", "Llama-3.1-70B", "Qwen2.5-7B")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,16,64,512,2048", help="GEMM row counts metered")
    ap.add_argument("--window-s", type=float, default=0.2)
    ap.add_argument("--deadline-s", type=float, default=480.0, help="stop starting new shapes after this")
    ap.add_argument("--resume", type=Path, help="an earlier run's output: its shapes are kept, not measured again")
    args = ap.parse_args(argv)
    from advisor.energy.measure import torch_with_gpu
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.profiling import ENERGY_METER, measure_gemm_energy, measurement_header, table_nk
    from advisor.energy.runtime import copy_bandwidth_gb_s

    torch = torch_with_gpu()
    t0 = time.perf_counter()
    rows = tuple(int(v) for v in args.rows.split(","))
    cfg = MeterConfig(**{**ENERGY_METER, "min_window_s": args.window_s})
    meter = open_meter(torch.cuda.current_device(), cfg)
    state = meter.counter.state()
    command = command_line(argv)
    out = {"schema": SCHEMA + "/gemm-energy", **measurement_header(state, meter.idle_power_w(), copy_bandwidth_gb_s(),
                                                                    command, torch.__version__),
           "meter": cfg.__dict__, "m_buckets": list(rows)}
    done = None
    if args.resume:
        earlier = json.loads(args.resume.read_text())
        done, out["resumed_from"] = earlier["gemm"], {k: earlier[k] for k in ("gpu_uuid", "date", "command")}
    order = table_nk(FIRST) + [nk for nk in table_nk() if nk not in set(table_nk(FIRST))]

    def write(gemm: dict) -> None:
        out["gemm"], out["seconds"] = gemm, time.perf_counter() - t0
        dump_json(args.out, out, indent=None)

    gemm, out["soak"] = measure_gemm_energy(meter, order, rows, deadline_s=args.deadline_s, done=done,
                                            log=lambda m: print(m, flush=True), after_shape=write)
    write(gemm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
