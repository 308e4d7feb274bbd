"""Do the shipped GPU profile's GEMM tables time a GEMM as the model's step runs it?

For each shape (random weights, the project's runtime) and each group kind, format and row count:

* ``in_model``: the per-model profile's timing (``model_profile.layer_gemm_ms``: one graph over every
  layer's own weights of that kind);
* ``table_capped``: the shipped tables' timing (``gemm_table.gemm_row_ms``: at most 16 copies of one
  weight, 10 replays), which on an H200 put Llama-3.1-8B's GEMMs 4.5-6.3% above the per-model profiles'
  in-model times (reports/benchmarks/energy_transfer_h200.md, notes);
* ``table``: copies up to ``L2_DEFEAT_BYTES`` with no cap, 20 replays: every GEMM reads its weight from HBM;

then, with ``--tables``, measures the whole GEMM tables the uncapped way (without anchors), so that
``benchmarks/build_gpu_profile.py`` can refit the shipped profile on them and the transfer be compared.

    python benchmarks/studies/gemm_table_check.py --out check.json [--tables tables.json]
    python benchmarks/studies/gemm_table_check.py --out check.json --render   # its Markdown, no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.energy.profiling import REFERENCE_SHAPES  # noqa: E402
from advisor.formats import Format  # noqa: E402

ROWS = (1, 16, 64, 512)


def render(d: dict) -> str:
    lines = ["# GEMM tables against in-model GEMM times", "",
             f"Measured on **{d['gpu']}**, driver {d.get('driver', '?')}, {d['date']}, torch {d['torch']}; command "
             f"`{d['command']}`. Each row: "
             "the range over the row counts "
             f"{tuple(d['rows_m'])} of a table timing over the per-model profile's in-model timing, minus 1.", "",
             "| shape | group | format | shipped tables (<= 16 copies, 10 replays) | uncapped copies, 20 replays |",
             "|---|---|---|---:|---:|"]
    for r in d["checks"]:
        cells = []
        for key in ("table_capped", "table"):
            rel = [t / i - 1 for t, i in zip(r[key], r["in_model"], strict=True)]
            cells.append(f"{min(rel) * 100:+.1f}..{max(rel) * 100:+.1f}%")
        lines.append(f"| {r['shape']} | {r['kind']} | {r['format']} | {cells[0]} | {cells[1]} |")
    if d.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="SmolLM2-135M,Qwen2.5-0.5B,Llama-3.1-8B")
    ap.add_argument("--tables", type=Path, help="also measure the whole GEMM tables (no anchors) into this file")
    ap.add_argument("--render", action="store_true", help="write --out's Markdown beside it (no GPU)")
    ap.add_argument("--notes", type=Path, help="with --render: a JSON list of notes to store and print")
    args = ap.parse_args(argv)
    if args.render:
        d = json.loads(args.out.read_text())
        if args.notes:
            d["notes"] = json.loads(args.notes.read_text())
            args.out.write_text(json.dumps(d, indent=1))
        args.out.with_suffix(".md").write_text(render(d))
        return 0
    import torch

    from advisor.energy.measure import Bench, uniform_formats
    from advisor.energy.meter import open_meter
    from advisor.energy.profiling import gemm_row_ms, layer_gemm_ms, measure_gpu_profile
    from advisor.energy.runtime import release_cuda_memory

    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    state = open_meter(0).counter.state()
    out: dict = {"gpu": state.name, "gpu_uuid": state.uuid, "driver": state.driver,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "torch": torch.__version__, "command": command, "rows_m": list(ROWS), "checks": []}
    for name in args.shapes.split(","):
        ref = REFERENCE_SHAPES[name]
        dims = ref.dims(None)
        bench = Bench.create(dims, max_pos=4096)
        runtimes = [bench.runtime(uniform_formats(dims, f)) for f in (Format.BF16, Format.FP8)]  # fill linear_cache
        for kind, (n, k) in ref.gemm_nk().items():
            if kind == "lm_head":
                continue
            for fmt in (Format.BF16, Format.FP8):
                row = {"shape": name, "kind": kind, "n": n, "k": k, "format": fmt.value,
                       "in_model": [layer_gemm_ms(bench, kind, fmt, m) for m in ROWS],
                       "table_capped": gemm_row_ms(n, k, fmt, ROWS),
                       "table": gemm_row_ms(n, k, fmt, ROWS, max_copies=None, iters=20)}
                out["checks"].append(row)
                ratio = " ".join(f"{t / i - 1:+.1%}/{c / i - 1:+.1%}"
                                 for t, c, i in zip(row["table"], row["table_capped"], row["in_model"], strict=True))
                print(f"{name:13s} {kind:8s} {fmt.value:4s} table/capped vs in-model at m={ROWS}: {ratio}", flush=True)
        del runtimes, bench
        release_cuda_memory()
        args.out.write_text(json.dumps(out, indent=1))
    if args.tables is not None:
        tables = measure_gpu_profile(command, anchors=(), max_copies=None, iters=20)
        args.tables.write_text(json.dumps(tables, indent=1))
        print(f"tables written to {args.tables}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
