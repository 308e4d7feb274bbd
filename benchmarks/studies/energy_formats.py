"""Energy per token of BF16, FP8 and mixed plans of a Llama-3.1-8B-shaped model on this GPU.

Writes reports/benchmarks/energy_formats.json (+ .md): GPU, driver, power limit,
date, command, and rows of {format, phase, batch, seq_len, ms_per_step,
j_per_token, floor_ms, floor_ratio, cv, ...}. floor_ms = bytes the step must read
(weights in their format + BF16 lm_head + the KV cache; prefill: weights only) over
the device-to-device copy bandwidth measured here; floor_ratio = this format's
floor over BF16's. With --profile, each measured row also gets the cost model's
prediction from that profile.

    python benchmarks/studies/energy_formats.py [--quick] [--profile advisor/profiles/h100_....json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from advisor.energy.measure import Bench, decode_step, measure_step, prefill_step, uniform_formats
from advisor.energy.meter import MeterConfig, open_meter
from advisor.energy.profiling import measurement_header
from advisor.energy.runtime import DecoderDims, copy_bandwidth_gb_s, kernel_names  # noqa: E402
from advisor.formats import Format
from advisor.plan import Plan


def plans(dims: DecoderDims) -> dict[str, dict[str, Format]]:
    bf16 = uniform_formats(dims, Format.BF16)
    mlp = {k: (Format.FP8 if k.endswith(("gate_up", "down")) else Format.BF16) for k in bf16}
    edge = {0, 1, 2, 3, dims.num_layers - 4, dims.num_layers - 3, dims.num_layers - 2, dims.num_layers - 1}
    ends = {k: (Format.BF16 if int(k.split(".")[1]) in edge else Format.FP8) for k in bf16}
    return {
        "bf16": bf16,
        "fp8": uniform_formats(dims, Format.FP8),
        "mixed-mlp-fp8": mlp,
        "mixed-fp8-except-8-edge-layers": ends,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/energy_formats.json"))
    ap.add_argument("--batches", default="1,8,16,32,64,128")
    ap.add_argument("--energy-batches", default="1,16,64,128")
    ap.add_argument("--mixed-batches", default="16,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--prefill-lengths", default="512,2048")
    ap.add_argument("--attention", default="triton", choices=["triton", "sdpa", "bmm"])
    ap.add_argument("--profile", type=Path, default=None, help="profile JSON for cost-model predictions")
    ap.add_argument("--quick", action="store_true", help="timings only, one energy measurement (smoke test)")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    batches, ebatches, mbatches = ints(args.batches), ints(args.energy_batches), ints(args.mixed_batches)
    lengths = ints(args.prefill_lengths)
    ctx = args.context
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    log = lambda *a: print(*a, flush=True)  # noqa: E731

    meter = open_meter(torch.cuda.current_device(), MeterConfig())
    state = meter.counter.state()
    idle_w = meter.idle_power_w()
    bw = copy_bandwidth_gb_s()
    log(f"{state.name}, driver {state.driver}, limit {state.power_limit_w} W, idle {idle_w:.0f} W, copy {bw:.0f} GB/s")
    dims = DecoderDims.llama31_8b()
    bench = Bench.create(dims)
    kv_token = 2 * dims.num_layers * dims.kv_heads * dims.head_dim * 2
    plan_map = plans(dims)
    rts = {name: bench.runtime(f, key=name) for name, f in plan_map.items()}
    for rt in rts.values():
        rt.decode_attention = args.attention
    wbytes = {name: rt.weight_bytes() for name, rt in rts.items()}

    extra: dict = {"kernels": {}, "attention_variants": []}
    # kernel names of one eager step (what actually runs: FP8 GEMMs must be FP8 kernels)
    for name in ("bf16", "fp8"):
        rt = rts[name]
        rt.allocate_cache(16, ctx + 1)
        tok = torch.randint(0, dims.vocab, (16, 1), device="cuda")
        with torch.no_grad():
            rt.forward(tok, ctx)
            extra["kernels"][f"decode b16 {name}"] = kernel_names(lambda rt=rt, tok=tok: rt.forward(tok, ctx))
        rt.allocate_cache(1, 512)
        tok = torch.randint(0, dims.vocab, (1, 512), device="cuda")
        with torch.no_grad():
            rt.forward(tok, 0)
            extra["kernels"][f"prefill L512 {name}"] = kernel_names(lambda rt=rt, tok=tok: rt.forward(tok, 0))
        rt.k_cache = rt.v_cache = None
    torch.cuda.empty_cache()
    if args.quick:
        for variant in ("triton", "sdpa"):
            for b in (1, 16, 64):
                for name in ("bf16", "fp8"):
                    rt = rts[name]
                    rt.decode_attention = variant
                    ms = decode_step(rt, b, ctx).time_ms()
                    extra["attention_variants"].append({"attention": variant, "batch": b, "format": name, "ms": ms})
                    log(f"attention {variant} b{b} {name}: {ms:.3f} ms")
                    rt.k_cache = rt.v_cache = None
            torch.cuda.empty_cache()
        for rt in rts.values():
            rt.decode_attention = args.attention

    # sustained CUDA-event timing (no meter): does a long run match the meter's step time?
    step = decode_step(rts["bf16"], 16, ctx)
    extra["sustained_events_ms_bf16_b16"] = {"short_20": step.time_ms(), "long_1000": step.time_ms(iters=1000)}
    log(f"bf16 b16 events: {extra['sustained_events_ms_bf16_b16']}")
    del step
    rts["bf16"].k_cache = rts["bf16"].v_cache = None

    rows = []

    def add(name, phase, b, seq, r, floor_bytes, bf16_floor_bytes):
        floor_ms = floor_bytes / (bw * 1e9) * 1e3
        row = {
            "format": name,
            "plan_id": Plan(plan_map[name]).id,
            "phase": phase,
            "batch": b,
            "seq_len": seq,
            "ms_per_step": r["ms_per_step"],
            "ms_per_step_events": r["ms_per_step_events"],
            "j_per_token": r.get("j_per_token"),
            "j_per_step": r.get("j_per_step"),
            "power_w": r.get("power_w"),
            "tokens_per_s": r["tokens_per_step"] / (r["ms_per_step"] / 1e3),
            "tokens_per_s_per_w": r.get("tokens_per_s_per_w"),
            "floor_ms": floor_ms,
            "time_over_floor": r["ms_per_step"] / floor_ms,
            "floor_ratio": floor_bytes / bf16_floor_bytes,
            "cv": r.get("cv"),
            "unstable": r.get("unstable"),
            "sm_clock_mhz": r.get("sm_clock_mhz"),
            "temperature_c": r.get("temperature_c"),
        }
        rows.append(row)
        jt = row["j_per_token"]
        log(
            f"{phase:7s} {name:32s} b{b:<4d} L{seq:<5d} {row['ms_per_step']:8.3f} ms  floor {floor_ms:7.3f} "
            f"(x{row['time_over_floor']:.2f})  "
            + (f"{jt:.4f} J/tok  {row['power_w']:.0f} W  cv {row['cv']:.4f}" if jt is not None else "")
        )

    first_energy = True
    for b in batches:
        kv = b * (ctx + 1) * kv_token
        for name, rt in rts.items():
            mixed = name.startswith("mixed")
            if mixed and b not in mbatches:
                continue
            want = (b in mbatches) if mixed else (b in ebatches)
            if args.quick:
                want = first_energy and name == "bf16" and b == 16
            step = decode_step(rt, b, ctx)
            r = measure_step(meter if want else None, step, f"decode {name} b{b}")
            if want:
                first_energy = False
            add(name, "decode", b, ctx, r, wbytes[name] + kv, wbytes["bf16"] + kv)
            del step
        for rt in rts.values():
            rt.k_cache = rt.v_cache = None
        torch.cuda.empty_cache()
    for length in lengths:
        for name in ("bf16", "fp8"):
            rt = rts[name]
            step = prefill_step(rt, length)
            r = measure_step(None if args.quick else meter, step, f"prefill {name} L{length}")
            add(name, "prefill", 1, length, r, wbytes[name], wbytes["bf16"])
            del step
            rt.k_cache = rt.v_cache = None
        torch.cuda.empty_cache()

    # ratios the issue asks for
    by = {(r["format"], r["phase"], r["batch"], r["seq_len"]): r for r in rows}
    for r in rows:
        base = by.get(("bf16", r["phase"], r["batch"], r["seq_len"]))
        if base and r["j_per_token"] and base["j_per_token"]:
            r["j_ratio_vs_bf16"] = r["j_per_token"] / base["j_per_token"]
            r["j_ratio_over_floor_ratio"] = r["j_ratio_vs_bf16"] / r["floor_ratio"]

    # a request: prefill of its input + its output tokens decoded at the batch (decode at --context)
    requests = []
    for b in ebatches:
        for name in ("bf16", "fp8"):
            pre = by.get((name, "prefill", 1, 512))
            dec = by.get((name, "decode", b, ctx))
            if pre and dec and pre["j_per_token"] and dec["j_per_token"]:
                j_req = pre["j_per_token"] * 512 + 256 * dec["j_per_token"]
                requests.append(
                    {
                        "format": name,
                        "batch": b,
                        "input_tokens": 512,
                        "output_tokens": 256,
                        "j_per_request": j_req,
                        "j_per_output_token": j_req / 256,
                    }
                )

    predictions = []
    if args.profile is not None:
        from advisor.energy.prediction import ProfileCostModel
        from advisor.energy.profiling import load_profile
        from advisor.models.shape import llama_shape

        shape = llama_shape(
            "model.layers",
            dims.num_layers,
            dims.hidden,
            dims.intermediate,
            dims.heads,
            dims.kv_heads,
            dims.vocab,
            dims.head_dim,
        )
        cm = ProfileCostModel(load_profile(args.profile), shape)
        for r in rows:
            if r["j_per_step"] is None:
                continue
            plan = Plan(plan_map[r["format"]])
            if r["phase"] == "decode":
                ms, j = cm.decode_step(plan, r["batch"], r["seq_len"])
            else:
                ms, j = cm.prefill(plan, r["seq_len"])
            predictions.append(
                {
                    "format": r["format"],
                    "phase": r["phase"],
                    "batch": r["batch"],
                    "seq_len": r["seq_len"],
                    "measured_j_per_step": r["j_per_step"],
                    "predicted_j_per_step": j,
                    "error": j / r["j_per_step"] - 1,
                    "measured_ms": r["ms_per_step"],
                    "predicted_ms": ms,
                }
            )
            log(
                f"predict {r['phase']} {r['format']} b{r['batch']}: {j:.3f} J vs {r['j_per_step']:.3f} "
                f"({(j / r['j_per_step'] - 1) * 100:+.1f}%)"
            )

    prof_uuid = None
    if args.profile is not None:
        prof_uuid = json.loads(args.profile.read_text()).get("gpu_uuid")
    out = {
        **measurement_header(state, idle_w, bw, command, torch.__version__),
        "profile": str(args.profile) if args.profile else None,
        "profile_same_gpu": prof_uuid == state.uuid if prof_uuid else None,
        "quick": args.quick,
        "model": {"name": "Llama-3.1-8B shape, random weights (std 0.02)", **dims.summary()},
        "weight_bytes": wbytes,
        "kv_bytes_per_token": kv_token,
        "decode_attention": args.attention,
        "meter": MeterConfig().__dict__,
        "plans": {k: Plan(v).label() for k, v in plan_map.items()},
        "rows": rows,
        "requests": requests,
        "predictions": predictions,
        **extra,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
