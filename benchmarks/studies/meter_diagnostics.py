"""Why a per-model profile and a plan measurement of the same step disagree: meter-loop and thermal tests.

Two questions, each answered by re-measuring one fixed step (random weights, the project's runtime):

* **host-bound windows**: on small models the meter's windows saw 1.2-1.7x the step's CUDA-event time
  (reports/benchmarks/energy_transfer_data/h100_raw*.json), i.e. the GPU idled between steps. The step
  is metered with the meter's queue depth 4 and 32 and its poll interval 1 ms and 5 ms; the NVML
  energy read's own latency is timed;
* **thermal drift**: the profile meters 0.8 s + 3 x 0.6 s per point, a plan's measurement 2 s + 3 x 5 s
  (the project's default). The same step is metered with the profile's windows, then the default ones,
  then the profile's again (hot), then after 10 s idle; GPU temperature and SM clock before and after each.

``--sweep SHAPE:PLAN:PHASE:BATCH,...`` instead meters each given step (a plan of
``energy_transfer_collect.plan_formats``) with windows of 0.2 to 2.4 s, one attempt each, and keeps every
window: whether a point whose windows' CV stays above 1% (small models at batch 1 on an H100) swings with
a period longer than the profile's 0.6 s windows, and what window length steadies it. ``--thermal`` meters
each given step cold, right after a minute of the model's heaviest prefill, and cooled again: how much a
small model's J/step moves with the GPU's temperature.

    python benchmarks/studies/meter_diagnostics.py --out diag.json [--sweep SmolLM2-135M:fp8:decode:1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.energy.meter import MeterConfig  # noqa: E402
from advisor.energy.profiling import REFERENCE_SHAPES  # noqa: E402
from advisor.formats import Format  # noqa: E402

PROFILE = MeterConfig(warmup_s=0.8, min_window_s=0.6, min_ticks=6, repeats=3)
DEFAULT = MeterConfig()


def nvml_read_ms(counter, n: int = 200) -> dict[str, float]:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        counter.energy_mj()
        ts.append((time.perf_counter() - t) * 1e3)
    return {"mean": statistics.fmean(ts), "median": statistics.median(ts), "max": max(ts)}


def metered(meter_factory, step, label: str, config: MeterConfig) -> dict:
    meter = meter_factory(config)
    s0 = meter.counter.state()
    m = meter.measure(step.launch, label, step.tokens_per_step)
    return {"label": label, "config": {k: v for k, v in config.__dict__.items()
                                       if k in ("warmup_s", "min_window_s", "depth", "poll_s")},
            "j_per_step": m.j_per_step, "ms_per_step_meter": m.s_per_step * 1e3, "power_w": m.power_w, "cv": m.cv,
            "windows_j_per_step": [w.j_per_step for w in m.windows], "windows_power_w": [w.power_w for w in m.windows],
            "temp_before_c": s0.temperature_c, "temp_after_c": m.gpu_after.temperature_c,
            "sm_clock_after_mhz": m.gpu_after.sm_clock_mhz, "t": time.perf_counter()}


SWEEP_WINDOWS = ((0.2, 12), (0.6, 5), (1.2, 5), (2.4, 4))  # (window s, windows)
HEAT_S, COOL_S = 60.0, 30.0


def _step_for(item: str):
    """(bench, runtime, step, heater) of ``SHAPE:PLAN:PHASE:BATCH``; the heater is the plan's 2048-token prefill."""
    from energy_transfer_collect import plan_formats

    from advisor.energy.measure import Bench, decode_step, prefill_step

    name, plan, phase, batch = item.split(":")
    dims = REFERENCE_SHAPES[name].dims(None)
    bench = Bench.create(dims, max_pos=4096)
    rt = bench.runtime(plan_formats(dims.num_layers)[plan])
    step = prefill_step(rt, 512) if phase == "prefill" else decode_step(rt, int(batch), 640)
    return bench, rt, step, prefill_step(rt, 2048)


def _point(factory, step, label: str, cfg: MeterConfig, ev_ms: float, log, **extra) -> dict:
    r = {**metered(factory, step, label, cfg), **extra, "ms_per_step_events": ev_ms}
    log(r)
    return r


def window_sweep(factory, item: str, log) -> dict:
    from advisor.energy.runtime import release_cuda_memory

    bench, rt, step, heater = _step_for(item)
    ev = step.time_ms()
    runs = []
    for window_s, n in SWEEP_WINDOWS:
        cfg = replace(PROFILE, min_window_s=window_s, min_ticks=max(2, round(10 * window_s)), repeats=n, attempts=1)
        runs.append(_point(factory, step, f"{item} window {window_s} s x {n}", cfg, ev, log, window_s=window_s))
    del step, heater, rt, bench
    release_cuda_memory()
    return {"step": item, "runs": runs}


def thermal_soak(factory, item: str, log) -> dict:
    """The step metered with the profile's windows: after idling, right after ``HEAT_S`` of the model's
    2048-token prefill back to back (the hottest load it has), four times more as it cools under its own
    load, and after ``COOL_S`` idle again; temperatures before and after each."""
    import torch

    from advisor.energy.runtime import release_cuda_memory

    bench, rt, step, heater = _step_for(item)
    ev = step.time_ms()
    cfg = replace(PROFILE, attempts=1)
    runs = []
    time.sleep(COOL_S)
    runs.append(_point(factory, step, f"{item} after {COOL_S:.0f} s idle", cfg, ev, log, state="cold"))
    t_end = time.perf_counter() + HEAT_S
    while time.perf_counter() < t_end:
        for _ in range(8):
            heater.launch()
        torch.cuda.synchronize()
    for i in range(5):
        runs.append(_point(factory, step, f"{item} hot #{i}", cfg, ev, log, state=f"hot {i}"))
    time.sleep(COOL_S)
    runs.append(_point(factory, step, f"{item} after {COOL_S:.0f} s idle again", cfg, ev, log, state="cooled"))
    del step, heater, rt, bench
    release_cuda_memory()
    return {"step": item, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", default="Qwen2.5-0.5B")
    ap.add_argument("--large", default="Llama-3.1-8B")
    ap.add_argument("--sweep", default="", help="SHAPE:PLAN:PHASE:BATCH,... : window-length sweep only")
    ap.add_argument("--thermal", default="", help="SHAPE:PLAN:PHASE:BATCH,... : cold / hot / cooled only")
    args = ap.parse_args(argv)
    import torch

    from advisor.energy.measure import Bench, decode_step, uniform_formats
    from advisor.energy.meter import EnergyMeter, open_meter
    from advisor.energy.runtime import release_cuda_memory

    base = open_meter(0, PROFILE)
    state = base.counter.state()

    def factory(config: MeterConfig) -> EnergyMeter:
        return EnergyMeter(base.counter, config)

    out: dict = {"gpu": state.name, "driver": state.driver, "power_limit_w": state.power_limit_w,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "torch": torch.__version__,
                 "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                 "nvml_read_ms_idle": nvml_read_ms(base.counter), "idle_power_w": base.idle_power_w(), "runs": []}

    def log(r: dict) -> None:
        print(f"{r['label']:34s} {r['j_per_step']:.5f} J  meter {r['ms_per_step_meter']:.3f} ms  "
              f"ev {r.get('ms_per_step_events', 0):.3f} ms  {r['power_w']:.0f} W  cv {r['cv']:.4f}  "
              f"{r['temp_before_c']}->{r['temp_after_c']} C  {r['sm_clock_after_mhz']} MHz", flush=True)

    if args.sweep or args.thermal:
        out["sweeps"] = [window_sweep(factory, item, log) for item in filter(None, args.sweep.split(","))]
        out["thermal"] = [thermal_soak(factory, item, log) for item in filter(None, args.thermal.split(","))]
        args.out.write_text(json.dumps(out, indent=1))
        return 0
    for name, fmt, b, tests in (
        (args.small, Format.BF16, 1, "loop"), (args.small, Format.FP8, 1, "loop"),
        (args.large, Format.FP8, 1, "loop"), (args.large, Format.BF16, 16, "thermal"),
    ):
        dims = REFERENCE_SHAPES[name].dims(None)
        bench = Bench.create(dims, max_pos=4096)
        rt = bench.runtime(uniform_formats(dims, fmt))
        step = decode_step(rt, b, 640)
        ev = step.time_ms()
        runs = []
        if tests == "loop":
            for rep in range(1):
                for depth, poll in ((4, 0.001), (32, 0.001), (32, 0.005), (4, 0.005)):
                    cfg = replace(PROFILE, depth=depth, poll_s=poll)
                    runs.append(metered(factory, step, f"{name} {fmt.value} b{b} d{depth} p{poll * 1e3:.0f}ms #{rep}",
                                        cfg))
            bgd = {"nvml_read_ms_busy": None}
            # the NVML read's latency while the step runs back to back
            for _ in range(8):
                step.launch()
            bgd["nvml_read_ms_busy"] = nvml_read_ms(base.counter, 50)
            torch.cuda.synchronize()
            out.setdefault("nvml_busy", {})[f"{name} {fmt.value} b{b}"] = bgd["nvml_read_ms_busy"]
        else:
            runs.append(metered(factory, step, f"{name} {fmt.value} b{b} profile-windows #1", PROFILE))
            runs.append(metered(factory, step, f"{name} {fmt.value} b{b} default-windows", DEFAULT))
            runs.append(metered(factory, step, f"{name} {fmt.value} b{b} profile-windows hot", PROFILE))
            runs.append(metered(factory, step, f"{name} {fmt.value} b{b} profile-windows d32 hot",
                                replace(PROFILE, depth=32)))
            time.sleep(10)
            runs.append(metered(factory, step, f"{name} {fmt.value} b{b} profile-windows after 10 s idle",
                                PROFILE))
        for r in runs:
            r["ms_per_step_events"] = ev
            log(r)
        out["runs"] += runs
        args.out.write_text(json.dumps(out, indent=1))
        del step, rt, bench
        release_cuda_memory()
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
