"""Is a mixed plan's energy additive over layers and group kinds? Complementary FP8 subsets, metered.

A per-model profile meters all-BF16 and all-FP8 and prices a mixed plan by sharing out all-FP8's
saving (``advisor.energy.prediction``). On H100s Qwen2.5-0.5B's middle-half-FP8 plan saved
0.41-0.51 of all-FP8's decode energy on six units (``energy_transfer.md``), where its weights
are 0.50. This benchmark meters, on one shape, complementary pairs of FP8 subsets whose savings
would add up to all-FP8's if energy were additive:

* by position: middle half / outer quarters, first half / second half, even / odd layers;
* by kind: MLP (gate_up, down) / attention (qkv, o);

each at prefill (512 tokens) and decode batch 1, 16, 64 (context 640), with the per-model profile
first (so every plan is also a prediction) and all-BF16 and all-FP8 metered again last (drift).
Every point records the GPU's temperature before and after it.

``--probe`` meters, after a 30 s soak, what the pairs cannot tell apart: single layers in FP8 (first,
middle, last), the same kernels on different data (weights drawn with std 0.005 and 0.08 instead of
0.02), and the middle / outer pair twice more, interleaved (order and drift).

    python benchmarks/studies/layer_additivity.py --out raw.json [--shapes Qwen2.5-0.5B] [--deadline-s 540]
    python benchmarks/studies/layer_additivity.py --out probe.json --probe [--shapes Qwen2.5-0.5B]
    python benchmarks/studies/layer_additivity.py --render raw.json [--render raw2.json] \\
        [--notes notes.json] --md out.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from energy_transfer_collect import (  # noqa: E402
    BENCH_METER,
    PROFILE_METER,
    measure_plans,
    meter_point,
    search_regime,
)

from advisor.formats import Format  # noqa: E402
from advisor.plan import DENSE_GROUP_KINDS  # noqa: E402

#: complementary pairs: (name, name of its complement)
PAIRS = (("middle", "outer"), ("first", "second"), ("even", "odd"), ("mlp", "attn"))


def subset_plans(num_layers: int) -> dict[str, dict[str, Format]]:
    """all-BF16, all-FP8, each subset of :data:`PAIRS` in FP8 (the rest BF16), then all-BF16 and all-FP8 again."""
    q, half = max(1, num_layers // 4), num_layers // 2
    fp8_if = {
        "bf16": lambda i, k: False,
        "fp8": lambda i, k: True,
        "middle": lambda i, k: q <= i < num_layers - q,
        "outer": lambda i, k: not q <= i < num_layers - q,
        "first": lambda i, k: i < half,
        "second": lambda i, k: i >= half,
        "even": lambda i, k: i % 2 == 0,
        "odd": lambda i, k: i % 2 == 1,
        "mlp": lambda i, k: k in ("gate_up", "down"),
        "attn": lambda i, k: k in ("qkv", "o"),
        "bf16-again": lambda i, k: False,
        "fp8-again": lambda i, k: True,
    }
    return {name: {f"layers.{i}.{k}": Format.FP8 if rule(i, k) else Format.BF16
                   for i in range(num_layers) for k in DENSE_GROUP_KINDS}
            for name, rule in fp8_if.items()}


def collect(args) -> int:
    import torch

    from advisor.energy.measure import Bench
    from advisor.energy.meter import open_meter
    from advisor.energy.profiling import REFERENCE_SHAPES, measure_model_profile
    from advisor.energy.runtime import release_cuda_memory

    t_start = time.perf_counter()
    command = "python " + " ".join(sys.argv)

    def log(*a) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s]", *a, flush=True)

    bench_meter, profile_meter = open_meter(0, BENCH_METER), open_meter(0, PROFILE_METER)
    state = bench_meter.counter.state()
    out = {"gpu": state.name, "gpu_uuid": state.uuid, "driver": state.driver, "power_limit_w": state.power_limit_w,
           "idle_power_w": bench_meter.idle_power_w(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": command, "torch": torch.__version__, "shapes": {}}
    for name in filter(None, args.shapes.split(",")):
        if time.perf_counter() - t_start > args.deadline_s:
            log(f"deadline: {name} not run")
            break
        dims = REFERENCE_SHAPES[name].dims(None)
        if args.probe:
            def bench_for(std: float, d=dims) -> Bench:
                return Bench.create(d, max_pos=4096, std=std)

            out["shapes"][name] = {"num_layers": dims.num_layers, "probe": probe(bench_for, dims, bench_meter, log)}
            args.out.write_text(json.dumps(out, indent=1))
            release_cuda_memory()
            continue
        bench = Bench.create(dims, max_pos=4096)
        prof = measure_model_profile(dims, **search_regime(), meter=profile_meter, bench=bench, command=command,
                                     log=log)
        rows = measure_plans(bench, bench_meter, log, subset_plans(dims.num_layers))
        out["shapes"][name] = {"num_layers": dims.num_layers, "profile": prof, "rows": rows}
        args.out.write_text(json.dumps(out, indent=1))
        del bench, prof
        release_cuda_memory()
    log("done")
    return 0


PROBE_POINTS = (("prefill", 1), ("decode", 1), ("decode", 64))


def _meter_point(bench, meter, fmts: dict[str, Format], plan: str, phase: str, b: int, **extra) -> dict:
    return {**meter_point(bench.runtime(fmts), meter, plan, phase, b), **extra}


def probe(bench_for, dims, meter, log) -> list[dict]:
    """Single FP8 layers, other weight data, and the middle / outer pair interleaved (see the module doc)."""
    from advisor.energy.measure import decode_step, uniform_formats

    plans = subset_plans(dims.num_layers)
    n = dims.num_layers
    single = {f"layer{i}": {g: Format.FP8 if g.startswith(f"layers.{i}.") else Format.BF16 for g in plans["bf16"]}
              for i in (0, n // 2, n - 1)}
    rows: list[dict] = []

    def point(bench, fmts, plan, phase, b, **extra) -> None:
        r = _meter_point(bench, meter, fmts, plan, phase, b, **extra)
        rows.append(r)
        log(f"  {plan:10s} {phase:7s} b{b:<3d} {r['ms_per_step_events']:8.3f} ms  {r['measured_j_per_step']:.5f} J  "
            f"{r['power_w']:.0f} W  cv {r['cv']:.4f}  {r['temperature_before_c']}->{r['temperature_c']} C")

    bench = bench_for(0.02)
    rt = bench.runtime(uniform_formats(dims, Format.BF16))
    step = decode_step(rt, 64, 1280)
    soak = meter.soak(step.launch, 30.0)
    log(f"soak {soak}")
    del step
    rt.free()
    for phase, b in PROBE_POINTS:
        for plan in ("bf16", "fp8", *single, "bf16"):
            point(bench, plans.get(plan) or single[plan], plan, phase, b, std=0.02)
        for plan in ("middle", "outer", "middle", "outer"):
            point(bench, plans[plan], plan, phase, b, std=0.02)
    del bench
    for std in (0.005, 0.08):
        bench = bench_for(std)
        for phase, b in PROBE_POINTS:
            for plan in ("bf16", "fp8"):
                point(bench, plans[plan], plan, phase, b, std=std)
        del bench
    return rows


def saving_shares(rows: list[dict]) -> dict[tuple[str, int], dict[str, float]]:
    """Per (phase, batch): each subset's energy saving as a share of all-FP8's (mean of both all-BF16 and both
    all-FP8 measurements), and each pair's sum (1.0 if additive)."""
    by = {(r["plan"], r["phase"], r["batch"]): r["measured_j_per_step"] for r in rows}
    out = {}
    for phase, b in sorted({(r["phase"], r["batch"]) for r in rows}):
        j0 = (by[("bf16", phase, b)] + by[("bf16-again", phase, b)]) / 2
        j1 = (by[("fp8", phase, b)] + by[("fp8-again", phase, b)]) / 2
        shares = {p: (j0 - by[(p, phase, b)]) / (j0 - j1) for pair in PAIRS for p in pair}
        shares |= {f"{a}+{c}": shares[a] + shares[c] for a, c in PAIRS}
        shares["bf16 drift"] = by[("bf16-again", phase, b)] / by[("bf16", phase, b)] - 1
        shares["fp8 saving"] = 1 - j1 / j0
        out[(phase, b)] = shares
    return out


def render(paths: list[Path], notes: list[str] = ()) -> str:
    lines = ["# Is a mixed plan's energy additive over layers and group kinds?", "",
             "Each cell: the subset's measured energy saving as a share of all-FP8's (same phase and batch). "
             "A pair's sum is 1.00 if energy is additive; a subset holding half the weights saves 0.50 under the "
             "per-model profile's rule. Generated by `benchmarks/studies/layer_additivity.py --render`.", ""]
    if notes:
        lines += ["## Findings", "", *[f"- {n}" for n in notes], ""]
    for path in paths:
        d = json.loads(path.read_text())
        if any("probe" in s for s in d["shapes"].values()):
            lines += render_probe(d)
            continue
        for name, s in d["shapes"].items():
            lines += [f"## {name} on {d['gpu']} ({d['gpu_uuid'][-12:]}), driver {d['driver']}, {d['date']}", "",
                      f"`{d['command']}`", ""]
            table = saving_shares(s["rows"])
            cols = [c for a, b in PAIRS for c in (a, b, f"{a}+{b}")] + ["fp8 saving", "bf16 drift"]
            lines += ["| point | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
            for (phase, b), v in table.items():
                cells = [f"{v[c]:+.1%}" if c in ("fp8 saving", "bf16 drift") else f"{v[c]:.2f}" for c in cols]
                lines.append(f"| {phase} b{b} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def render_probe(d: dict) -> list[str]:
    """The probe's points per phase: each plan's J/step and its saving as a share of all-FP8's (mean of the
    repeated all-BF16 points), and the same kernels on other weight data."""
    lines = []
    for name, s in d["shapes"].items():
        lines += [f"## Probe: {name} on {d['gpu']} ({d['gpu_uuid'][-12:]}), driver {d['driver']}, {d['date']}", "",
                  f"`{d['command']}`", "",
                  "| point | plan | weights std | J/step | W | ms (events) | GPU C | saving / all-FP8's |",
                  "|---|---|---:|---:|---:|---:|---|---:|"]
        for phase, b in PROBE_POINTS:
            rows = [r for r in s["probe"] if (r["phase"], r["batch"]) == (phase, b)]
            for std in sorted({r["std"] for r in rows}, key=lambda v: (v != 0.02, v)):
                these = [r for r in rows if r["std"] == std]
                j = {p: [r["measured_j_per_step"] for r in these if r["plan"] == p] for p in ("bf16", "fp8")}
                j0, j1 = (sum(v) / len(v) for v in (j["bf16"], j["fp8"]))
                for r in these:
                    share = (j0 - r["measured_j_per_step"]) / (j0 - j1)
                    lines.append(f"| {phase} b{b} | {r['plan']} | {std} | {r['measured_j_per_step']:.5f} | "
                                 f"{r['power_w']:.0f} | {r['ms_per_step_events']:.3f} | "
                                 f"{r['temperature_before_c']}->{r['temperature_c']} | {share:.2f} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default="Qwen2.5-0.5B")
    ap.add_argument("--deadline-s", type=float, default=540.0, help="stop starting new shapes after this")
    ap.add_argument("--probe", action="store_true", help="single layers, other weight data, order (see above)")
    ap.add_argument("--render", type=Path, action="append", default=[], help="a collected JSON (no GPU needed)")
    ap.add_argument("--md", type=Path, help="where --render writes its Markdown")
    ap.add_argument("--notes", type=Path, help="a JSON list of findings for --render's Markdown")
    args = ap.parse_args(argv)
    if args.render:
        text = render(args.render, json.loads(args.notes.read_text()) if args.notes else [])
        if args.md:
            args.md.write_text(text + "\n")
        else:
            print(text)
        return 0
    if args.out is None:
        ap.error("--out is required to collect")
    return collect(args)


if __name__ == "__main__":
    raise SystemExit(main())
