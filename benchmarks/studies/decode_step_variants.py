"""Decode step time of the runtime's variants on this GPU (CUDA events, no meter).

Llama-3.1-8B shape, random weights, context 512: BF16 and all-FP8 at several
batches, with programmatic dependent launch (PDL) off and on, and with the
attention's split policy against a forced single split. Each step is a CUDA graph
replayed ``--iters`` times after warm-up; floor = (weight + KV bytes) / copy
bandwidth. Chooses nothing itself: it shows which defaults the runtime should use.

    python benchmarks/studies/decode_step_variants.py --out reports/benchmarks/decode_step_variants.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from advisor.energy.measure import Bench, decode_step, uniform_formats
from advisor.energy.meter import open_meter
from advisor.energy.profiling import measurement_header
from advisor.energy.runtime import DecoderDims, copy_bandwidth_gb_s, kernel_names  # noqa: E402
from advisor.energy.runtime.kernels import decode_splits
from advisor.formats import Format


def render(d: dict) -> str:
    """Markdown beside the JSON: one line per (format, batch), the variants side by side."""
    lines = [
        "# Decode step time by runtime variant: Llama-3.1-8B shape, context 512",
        "",
        f"Measured on **{d['gpu']}** ({d['sms']} SMs), driver {d['driver']}, {d['date']}; copy bandwidth "
        f"{d['copy_bandwidth_gb_s']:.0f} GB/s; torch {d['torch']}. Command: `{d['command']}`.",
        "CUDA-graph replays timed with CUDA events (no meter). `pdl`: programmatic dependent launch of the "
        "Triton kernels; `splits`: programs per sequence in decode attention (1 = no reduction kernel).",
        "",
        "| format | batch | variant | ms/step | x floor |",
        "|---|---:|---|---:|---:|",
    ]
    for r in d["rows"]:
        lines.append(
            f"| {r['format']} | {r['batch']} | pdl={'on' if r['pdl'] else 'off'}, splits={r['splits']} | "
            f"{r['ms_per_step']:.3f} | {r['time_over_floor']:.3f} |"
        )
    lines += ["", "Kernel launches of one eager decode step at batch 16: "]
    lines[-1] += ", ".join(f"{k} {v['launches']}" for k, v in d["decode_b16_kernels"].items()) + "."
    if d.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/decode_step_variants.json"))
    ap.add_argument("--batches", default="1,8,16,32,64,128")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--render-only", action="store_true", help="only rewrite the .md beside --out (no GPU)")
    args = ap.parse_args(argv)
    if args.render_only:
        args.out.with_suffix(".md").write_text(render(json.loads(args.out.read_text())))
        return 0
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    batches = [int(x) for x in args.batches.split(",") if x]
    ctx = args.context
    dims = DecoderDims.llama31_8b()
    meter = open_meter(torch.cuda.current_device())
    state, idle_w = meter.counter.state(), meter.idle_power_w()
    bw = copy_bandwidth_gb_s()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bench = Bench.create(dims)
    rts = {f.value: bench.runtime(uniform_formats(dims, f), key=f.value) for f in (Format.BF16, Format.FP8)}
    kv_token = 2 * dims.num_layers * dims.kv_heads * dims.head_dim * 2
    print(f"{torch.cuda.get_device_name()}, {sms} SMs, copy {bw:.0f} GB/s", flush=True)

    kernels = {}
    for name, rt in rts.items():
        rt.allocate_cache(16, ctx + 1)
        tok = torch.randint(0, dims.vocab, (16, 1), device="cuda")
        with torch.no_grad():
            rt.forward(tok, ctx)
            rows = kernel_names(lambda rt=rt, tok=tok: rt.forward(tok, ctx))
        kernels[name] = {"launches": sum(r["count"] for r in rows), "kernels": rows}
        rt.k_cache = rt.v_cache = None

    rows = []
    for b in batches:
        auto = decode_splits(b * dims.kv_heads, ctx, sms)
        for name, rt in rts.items():
            floor_ms = (rt.weight_bytes() + b * (ctx + 1) * kv_token) / (bw * 1e9) * 1e3
            for pdl in (False, True):
                for splits in sorted({auto, 1}):
                    rt.pdl, rt.attention_splits = pdl, splits
                    step = decode_step(rt, b, ctx)
                    ms = step.time_ms(iters=args.iters, warmup=10)
                    del step
                    row = {
                        "format": name,
                        "batch": b,
                        "seq_len": ctx,
                        "pdl": pdl,
                        "splits": splits,
                        "splits_is_default": splits == auto,
                        "ms_per_step": ms,
                        "floor_ms": floor_ms,
                        "time_over_floor": ms / floor_ms,
                    }
                    rows.append(row)
                    print(
                        f"{name:5s} b{b:<4d} pdl={pdl!s:5s} splits={splits:<3d} {ms:7.3f} ms  "
                        f"floor {floor_ms:6.3f}  x{ms / floor_ms:.3f}",
                        flush=True,
                    )
            rt.k_cache = rt.v_cache = None
            rt.pdl, rt.attention_splits = False, None
        torch.cuda.empty_cache()
    out = {
        **measurement_header(state, idle_w, bw, command, torch.__version__),
        "sms": sms,
        "rows": rows,
        "decode_b16_kernels": kernels,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    args.out.with_suffix(".md").write_text(render(out))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
