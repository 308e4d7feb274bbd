"""GPU half of the energy-transfer benchmark: per-model profiles and end-to-end measurements.

For each shape (random weights, the project's runtime, the NVML meter): the per-model profile
(:func:`advisor.energy.profiling.measure_model_profile`, its wall time recorded), then each
plan (all-BF16, all-FP8, three mixed: :func:`plan_formats`) measured end to end: prefill of one 512-token request and
decode at the workload's mean context (512 + 256 / 2) at batch 1, 16 and 64. ``--tables`` also
measures the shipped GPU profile (:mod:`advisor.energy.profiling`: GEMM tables and anchor
models). Results are written after every shape, so a run cut short keeps what it measured.
The CPU half (``benchmarks/energy_transfer.py``) predicts and renders.

    python benchmarks/energy_transfer_collect.py --out raw.json [--tables tables.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import command_line, dump_json  # noqa: E402

from advisor.energy.meter import MeterConfig  # noqa: E402
from advisor.energy.profiling import REFERENCE_SHAPES  # noqa: E402
from advisor.formats import Format  # noqa: E402
from advisor.plan import DENSE_GROUP_KINDS  # noqa: E402

#: (reference shape, layers run: None = all); the 70B runs 10 of its 80 layers to fit time and memory
SHAPES = (("SmolLM2-135M", None), ("Qwen2.5-0.5B", None), ("Llama-3.1-8B", None), ("Llama-3.1-70B", 10))
BATCHES = (1, 16, 64)
INPUT, OUTPUT = 512, 256
DECODE_CONTEXT = INPUT + OUTPUT // 2
# Shorter windows than the project's default (5 s x 3): 96 meter points must fit one 600 s call.
BENCH_METER = MeterConfig(warmup_s=1.0, min_window_s=0.8, min_ticks=8, repeats=3)
PROFILE_METER = MeterConfig(warmup_s=0.8, min_window_s=0.6, min_ticks=6, repeats=3)


def parse_models(text: str) -> list[tuple[str, int | None]]:
    """``name[:layers],...`` -> [(reference shape, layers or None)]."""
    out = []
    for item in filter(None, text.split(",")):
        name, _, layers = item.partition(":")
        out.append((name, int(layers) if layers else dict(SHAPES).get(name)))
    return out


def plan_formats(num_layers: int) -> dict[str, dict[str, Format]]:
    """The six plans, as runtime group formats: all-BF16, all-FP8, MLP-only FP8, the middle half of the layers
    FP8 (first and last quarter BF16, as sensitivity often leaves them), attention FP8 in every layer with the
    MLP FP8 in the first half of the layers, and the first and last quarter FP8 (the middle half BF16). Since
    per-model profiles meter the kind corner (MLP-only FP8, 2026-11-22), MLP-only FP8 is one of their points;
    the last three are mixed plans they predict. Runs before 2026-11-23 07:30 UTC measured the first five."""
    q = max(1, num_layers // 4)
    names = ("bf16", "fp8", "mlp-fp8", "middle-fp8", "attn+half-mlp-fp8", "outer-fp8")
    out: dict[str, dict[str, Format]] = {n: {} for n in names}
    for i in range(num_layers):
        for k in DENSE_GROUP_KINDS:
            g = f"layers.{i}.{k}"
            mlp = k in ("gate_up", "down")
            out["bf16"][g] = Format.BF16
            out["fp8"][g] = Format.FP8
            out["mlp-fp8"][g] = Format.FP8 if mlp else Format.BF16
            out["middle-fp8"][g] = Format.FP8 if q <= i < num_layers - q else Format.BF16
            out["attn+half-mlp-fp8"][g] = Format.FP8 if not mlp or i < num_layers // 2 else Format.BF16
            out["outer-fp8"][g] = Format.BF16 if q <= i < num_layers - q else Format.FP8
    return out


#: points a trial meters beside the profile's (``--extra-points``), each stored in the profile under its name
#: (the cost model reads none of them): the middle half of the layers in FP8, both kinds, a contiguous mixing
#: point like the plans searches keep (first and last layers BF16)
EXTRA_POINTS = {"middle_fp8": lambda num_layers: plan_formats(num_layers)["middle-fp8"]}


def meter_extra_points(bench, names: list[str], regime: dict, meter, log) -> dict[str, tuple[dict, dict]]:
    """Each extra point's (decode, prefill) records, metered as the profile meters its own points."""
    from functools import partial

    from advisor.energy.profiling import measure_plan, metered_step

    energy = partial(metered_step, meter)
    out = {}
    for name in names:
        rt = bench.runtime(EXTRA_POINTS[name](bench.dims.num_layers))
        out[name] = measure_plan(rt, name, regime["batches"], regime["contexts"], regime["prefill_lengths"],
                                  energy, log, bench.dims.family)
        rt.free()
    return out


def search_regime() -> dict[str, tuple[int, ...]]:
    """What a search profiles for these rows' workloads (profile_select.profile_regime): their batches, the
    prompt length, and the contexts the decode steps visit (512 to 768). Runs before 2026-11-22 15:10 UTC
    profiled contexts 512 and 2048, which a small model's step is not linear between; runs from then to run 28
    (2026-11-23 06:46 UTC) the mean context bracketed at half and twice (320 and 1280 for 640), whose chord
    overshot a step energy convex in the context (reports/benchmarks/energy_transfer.md, notes;
    profile_point_trials.md); runs 11-13 (H100) and 8-9 (H200) of 19:25-19:59 UTC ran a trial profile that also
    metered 640 and a last-layer corner (not kept: notes)."""
    from advisor.energy.profiling import profile_regime
    from advisor.recipe.schema import Workload

    return profile_regime([Workload(name=f"b{b}", batch_size=b, input_tokens=INPUT, output_tokens=OUTPUT)
                           for b in BATCHES])


def meter_point(rt, meter, name: str, phase: str, b: int) -> dict:
    """One plan's prefill (one ``INPUT``-token request) or decode step of ``b`` sequences at ``DECODE_CONTEXT``:
    its CUDA-event time and its metered energy, as a row."""
    from advisor.energy.measure import decode_step, prefill_step

    step = prefill_step(rt, INPUT) if phase == "prefill" else decode_step(rt, b, DECODE_CONTEXT)
    ms = step.time_ms()
    m = meter.measure(step.launch, f"{name} {phase} b{b}", step.tokens_per_step)
    del step
    rt.free()
    return {"plan": name, "phase": phase, "batch": b, "tokens_per_step": m.tokens_per_step,
            "context": DECODE_CONTEXT if phase == "decode" else INPUT,
            "measured_j_per_step": m.j_per_step, "measured_j_per_token": m.j_per_token,
            "ms_per_step_events": ms, "ms_per_step_meter": m.s_per_step * 1e3,
            "power_w": m.power_w, "cv": m.cv, "temperature_c": m.gpu_after.temperature_c,
            "temperature_before_c": m.gpu_before.temperature_c, "sm_clock_mhz": m.gpu_after.sm_clock_mhz}


def measure_plans(bench, meter, log, plans: dict[str, dict[str, Format]] | None = None) -> list[dict]:
    """Each plan (default :func:`plan_formats`) metered end to end: prefill, then decode at each of ``BATCHES``."""
    rows = []
    for name, fmts in (plans or plan_formats(bench.dims.num_layers)).items():
        rt = bench.runtime(fmts)
        for phase, b in [("prefill", 1)] + [("decode", b) for b in BATCHES]:
            r = meter_point(rt, meter, name, phase, b)
            rows.append(r)
            log(f"  {name:10s} {phase:7s} b{b:<3d} {r['ms_per_step_events']:8.3f} ms  "
                f"{r['measured_j_per_token']:.6f} J/tok  {r['power_w']:.0f} W cv {r['cv']:.4f}")
        del rt
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tables", type=Path, help="also measure the shipped GPU profile into this file")
    ap.add_argument("--shapes", default=",".join(s for s, _ in SHAPES), help="name[:layers],... profiled and measured")
    ap.add_argument("--anchors", default="", help="name[:layers],... only profiled (the shipped profile's anchors)")
    ap.add_argument("--bench-window-s", type=float, default=BENCH_METER.min_window_s)
    ap.add_argument("--profile-window-s", type=float, default=PROFILE_METER.min_window_s)
    ap.add_argument("--repeats", type=int, default=BENCH_METER.repeats, help="windows per meter point (both meters)")
    ap.add_argument("--contexts", help="c,c,... decode contexts the profiles meter instead of a search's (to compare "
                    "context brackets on one GPU: benchmarks/studies/profile_point_trials.py --contexts reads subsets)")
    ap.add_argument("--extra-points", default="", help=f"name,... of points to meter beside each profile's "
                    f"(trials; {', '.join(EXTRA_POINTS)}), read back by "
                    "benchmarks/studies/profile_point_trials.py --point")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="stop starting new work after this")
    args = ap.parse_args(argv)
    unknown = sorted({p for p in args.extra_points.split(",") if p} - set(EXTRA_POINTS))
    if unknown:
        ap.error(f"--extra-points: unknown {', '.join(unknown)}; known: {', '.join(EXTRA_POINTS)}")
    import torch

    from advisor.energy.measure import Bench
    from advisor.energy.meter import open_meter
    from advisor.energy.profiling import measure_model_profile
    from advisor.energy.runtime import release_cuda_memory

    t_start = time.perf_counter()
    command = command_line(argv)

    def log(*a) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s]", *a, flush=True)

    from dataclasses import replace

    bench_config = replace(BENCH_METER, min_window_s=args.bench_window_s, min_ticks=round(10 * args.bench_window_s),
                           repeats=args.repeats)
    profile_config = replace(PROFILE_METER, min_window_s=args.profile_window_s,
                             min_ticks=round(10 * args.profile_window_s), repeats=args.repeats)
    bench_meter = open_meter(0, bench_config)
    profile_meter = open_meter(0, profile_config)
    state = bench_meter.counter.state()
    out = {"gpu": state.name, "gpu_uuid": state.uuid, "driver": state.driver, "power_limit_w": state.power_limit_w,
           "idle_power_w": bench_meter.idle_power_w(), "date": time.strftime("%Y-%m-%d"), "command": command,
           "torch": torch.__version__, "bench_meter": bench_config.__dict__, "profile_meter": profile_config.__dict__,
           "shapes": {}, "anchors": {}}
    for name, layers in parse_models(args.shapes):
        if time.perf_counter() - t_start > args.deadline_s:
            log(f"deadline: {name} not run")
            break
        ref = REFERENCE_SHAPES[name]
        dims = ref.dims(layers)
        log(f"{name}: {dims.num_layers} layers")
        t0 = time.perf_counter()
        bench = Bench.create(dims, max_pos=4096)
        t_bench = time.perf_counter() - t0
        regime = search_regime()
        if args.contexts:
            regime["contexts"] = tuple(int(c) for c in args.contexts.split(","))
        prof = measure_model_profile(dims, **regime, meter=profile_meter, bench=bench, command=command, log=log)
        log(f"{name}: profile {prof['profile_seconds']:.1f} s (+{t_bench:.1f} s weights and calibration)")
        extra = [p for p in args.extra_points.split(",") if p]
        for point, (dec, pre) in meter_extra_points(bench, extra, regime, profile_meter, log).items():
            prof["decode"][point], prof["prefill"][point] = dec, pre
        rows = measure_plans(bench, bench_meter, log)
        out["shapes"][name] = {"num_layers": dims.num_layers, "full_layers": ref.num_layers,
                               "params_b": ref.params_b, "profile": prof, "bench_create_s": t_bench, "rows": rows}
        dump_json(args.out, out)
        del bench, prof
        release_cuda_memory()
    for name, layers in parse_models(args.anchors):
        if time.perf_counter() - t_start > args.deadline_s:
            log(f"deadline: anchor {name} not run")
            break
        dims = REFERENCE_SHAPES[name].dims(layers)
        bench = Bench.create(dims, max_pos=4096)
        prof = measure_model_profile(dims, batches=BATCHES, prefill_lengths=(512, 2048), meter=profile_meter,
                                     bench=bench, command=command, log=log)
        out["anchors"][name] = prof
        dump_json(args.out, out)
        del bench, prof
        release_cuda_memory()
    if args.tables is not None and time.perf_counter() - t_start < args.deadline_s:
        from advisor.energy.profiling import measure_gpu_profile

        data = measure_gpu_profile(command, deadline_s=args.deadline_s - (time.perf_counter() - t_start), log=log,
                                   gemm_energy_s=600.0)
        dump_json(args.tables, data)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
