"""A MoE decoder of a real model's shapes on the measurement runtime: grouped-GEMM experts, measured vs predicted.

    PYTHONPATH=. python benchmarks/studies/moe_gpu.py --out $OUT/moe_gpu.json [--layers N] [--batches 1,16,64,256]
        [--extra-batches 32] [--plans bf16,fp8,...] [--context 512] [--profile-contexts 256,768]
        [--warmup-s 1 --window-s 2 --ticks 20 --repeats 3]
    python benchmarks/studies/moe_gpu.py --out reports/benchmarks/moe_gpu.json --replay PROFILE.json   # no GPU

Random weights of ``--model``'s published shapes on the GPU: Qwen3-30B-A3B (hidden 2048, 32/4
heads x 128 with q/k norms, 128 experts of 768, top-8 renormalized, vocab 151936) or
Qwen1.5-MoE-A2.7B (Qwen2-MoE: 60 experts of 1408, top-4, and a shared expert of 5632);
``--layers`` of its layers, or as many as hold BF16 and FP8 copies at once (said in the output).

1. Checks: the profiler's kernel names of one eager decode step (grouped GEMMs), and the
   grouped experts against a loop over experts (float32) on the GPU, BF16 and FP8.
2. Routing: the runtime's router choices on one decode step of the largest batch give each
   layer's per-expert load (:mod:`advisor.energy.prediction`), used by both predictions.
3. The per-model profile (what ``advisor profile --model`` measures) at ``--batches`` and
   ``--profile-contexts``, written beside the output as ``<out>.profile.json``.
4. Per plan (all-BF16, all-FP8, FP8 experts only, FP8 attention only, FP8 first half; routers
   and lm_head BF16 in all) and batch (``--batches`` and the unprofiled ``--extra-batches``):
   one CUDA-graph decode step at ``--context`` under the NVML meter (ms/step, J/token);
   ``floor_ms`` = the bytes the step actually reads (attention weights, routers, lm_head,
   the distinct experts its tokens chose - counted on the same step run eagerly -, KV) / the
   copy bandwidth measured here; ``predicted_*``: the per-model profile's cost model (what a
   search on this GPU prices plans with); ``layer_profile_*``: the shipped layer profile's of this
   GPU (what a model without a per-model profile gets); and the datasheet roofline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from advisor.energy.measure import Bench, measure_step, uniform_formats
from advisor.energy.meter import MeterConfig, open_meter
from advisor.energy.profiling import measurement_header
from advisor.energy.runtime import CapturedStep, DecoderDims, copy_bandwidth_gb_s, kernel_names
from advisor.formats import GPU, Format, gpu_from_device_name

FORMATS = {"bf16": Format.BF16, "fp8": Format.FP8}
PLANS = ("bf16", "fp8", "experts-fp8", "attention-fp8", "first-half-fp8")
CONFIG = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
              num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
              num_experts_per_tok=8, norm_topk_prob=True, rope_theta=1e6, rms_norm_eps=1e-6,
              max_position_embeddings=40960, tie_word_embeddings=False)
#: --model: (title, transformers config class, published config fields)
MODELS = {
    "qwen3-30b-a3b": ("Qwen3-30B-A3B", "Qwen3MoeConfig", CONFIG),
    # 60 routed experts of 1408 (top-4, not renormalized) and a shared expert of 5632 in each of 24 layers
    "qwen1.5-moe-a2.7b": ("Qwen1.5-MoE-A2.7B", "Qwen2MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, norm_topk_prob=False, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=8192, tie_word_embeddings=False)),
}
MEMORY_MARGIN = 8 << 30


def layers_that_fit(dims: DecoderDims, batch: int, context: int) -> int:
    """Most layers whose BF16 and FP8 weights and the KV cache of the largest batch fit the free memory."""
    la = dims.layers[0]
    a, m = la.attention, la.moe
    per_layer = ((a.heads + 2 * a.kv_heads) * a.head_dim * dims.hidden + a.heads * a.head_dim * dims.hidden
                 + (m.num_experts * m.intermediate + la.shared_intermediate) * 3 * dims.hidden) * 3  # BF16 + FP8
    per_layer += 4 * batch * a.kv_heads * a.head_dim * (context + 1)  # K and V, BF16
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(dims.num_layers, int((free - MEMORY_MARGIN - 2 * dims.vocab * dims.hidden * 2) // per_layer)))


def model_config(model: str, layers: int | None = None):
    _, cls, fields = MODELS[model]
    return getattr(transformers, cls)(**{**fields, **({"num_hidden_layers": layers} if layers else {})})


def model_shape_of(layers: int, model: str = "qwen3-30b-a3b"):
    from advisor.models.groups import model_shape

    with torch.device("meta"):
        return model_shape(transformers.AutoModelForCausalLM.from_config(model_config(model, layers)))


def experts_check(rt) -> dict[str, float]:
    """Grouped experts of layer 0 vs the same experts as a float32 loop, on 64 tokens."""
    e = rt.experts[0]
    x = (torch.randn(64, rt.dims.hidden, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
         ).to(torch.bfloat16)
    with torch.no_grad():
        grouped = e(x).float()
        e.loop = True
        loop = e(x).float()
        e.loop = False
    return {"rel_err_vs_loop": ((grouped - loop).norm() / loop.norm()).item()}


def routing_load(rt, batch: int, length: int, start: int = 0) -> dict[int, tuple[float, ...]]:
    """Per-expert load of every layer's router on random tokens: a prefill (start 0, length > 1) or
    a decode step of ``batch`` sequences at context ``start`` (length 1, over the random cache)."""
    rt.allocate_cache(batch, start + length)
    tokens = torch.randint(0, rt.dims.vocab, (batch, length), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(7))
    for e in rt.experts.values():
        e.track, e.load[:], e.tokens_seen = True, 0, 0
    with torch.no_grad():
        rt.forward(tokens, start)
    out = {i: tuple((e.load / e.tokens_seen).tolist()) for i, e in rt.experts.items()}
    for e in rt.experts.values():
        e.track = False
    rt.free()
    return out


def step_with_routing(rt, batch: int, context: int) -> tuple[CapturedStep, list[int]]:
    """The captured decode step, and the distinct experts per layer it touches (same step, eager)."""
    rt.allocate_cache(batch, context + 1)
    gen = torch.Generator("cuda").manual_seed(0)
    tokens = torch.randint(0, rt.dims.vocab, (batch, 1), device="cuda", generator=gen)
    for e in rt.experts.values():
        e.track, e.touched = True, []
    with torch.no_grad():
        rt.forward(tokens, context)
    touched = [rt.experts[i].touched[-1] for i in sorted(rt.experts)]
    for e in rt.experts.values():
        e.track = False
    return rt.capture(tokens, context), touched


def bytes_read(rt, touched: list[int], batch: int, context: int) -> dict[str, float]:
    attn = sum(lin.weight_bytes for lin in rt.lin.values())
    routers = sum(rt.w.t[f"{i}.router"].numel() * 2 for i in rt.experts)
    experts = sum(n * rt.experts[i].expert_bytes() for i, n in zip(sorted(rt.experts), touched, strict=True))
    kv = rt.dims.kv_bytes(batch, context + 1)
    return {"attention": attn, "routers_lm_head": routers + rt.w.t["lm_head"].numel() * 2, "experts": experts,
            "kv": kv}


def plan_formats(shape, name: str) -> dict[str, Format]:
    """The benchmark's plans: all-BF16, all-FP8, FP8 experts only, FP8 attention only, FP8 first half."""
    half = shape.num_layers // 2

    def fmt(group: str) -> Format:
        fp8 = {"bf16": False, "fp8": True, "experts-fp8": group.endswith(".experts"),
               "attention-fp8": group.endswith((".qkv", ".o")),
               "first-half-fp8": int(group.split(".")[1]) < half}[name]
        return Format.FP8 if fp8 else Format.BF16

    return {g.name: fmt(g.name) for g in shape.groups}


def predictions(shape, plan, batch: int, context: int, model_profile: dict | None, gpu) -> dict[str, Any]:
    from advisor.energy.prediction import ModelProfileCostModel, ProfileCostModel, decode_step_cost
    from advisor.energy.profiling import shipped_profile
    from advisor.formats import GPU_SPECS

    out: dict[str, Any] = {}
    if model_profile is not None:  # the step at context c attends c + 1 tokens, as the profile's
        per_model = ModelProfileCostModel(model_profile, shape)
        ms, j = per_model.decode_step(plan, batch, context)
        out.update(predicted_ms=ms, predicted_j_per_token=j / batch, predicted_label=per_model.label)
    model = ProfileCostModel(shipped_profile(gpu), shape)
    ms, j = model.decode_step(plan, batch, context + 1)
    step = decode_step_cost(shape, plan, batch, context + 1)
    spec = GPU_SPECS[gpu]
    return {**out, "layer_profile_ms": ms, "layer_profile_j_per_token": j / batch,
            "layer_profile_label": model.label,
            "roofline_ms": step.time_s(spec) * 1e3, "roofline_j_per_token": step.energy_j(spec) / batch}


def _err(r: dict, key: str) -> str:
    return f"{r[key]:+.1f}%" if key in r else "-"


def render(d: dict) -> str:
    m = d["meter"]
    prof = d.get("model_profile")
    lines = [
        f"# {MODELS[d.get('model', 'qwen3-30b-a3b')][0]}-shaped MoE on the measurement runtime "
        "(grouped-GEMM experts)", "",
        f"Measured on **{d['gpu']}**, driver {d['driver']}, power limit {d['power_limit_w']:.0f} W (idle "
        f"{d['idle_power_w']:.0f} W), {d['date']}; copy bandwidth {d['copy_bandwidth_gb_s']:.0f} GB/s; torch "
        f"{d['torch']}. Command: `{d['command']}`.", "",
        f"Model: {d['shape']}. Decode steps at context {d['context']}, CUDA graphs; meter warm-up {m['warmup_s']} s, "
        f"windows >= {m['min_window_s']} s and >= {m['min_ticks']} ticks, {m['repeats']} repeats, median. "
        "floor = bytes the step reads (attention weights, routers, lm_head, the distinct experts its tokens chose, "
        "KV) / copy bandwidth. Plans: all-BF16, all-FP8 (attention and experts; routers and lm_head BF16 in every "
        "plan), FP8 experts only, FP8 attention only, FP8 in the first half of the layers.", "",
    ]
    if prof:
        lines += [
            f"**Per-model profile** (`advisor profile`'s measurement, {prof['seconds']:.0f} s, before the plans, "
            f"its own shorter meter windows): all-BF16 and all-FP8 decode steps at batches {prof['batches']} and "
            f"contexts {prof['contexts']}, each group's GEMMs (a MoE layer's routed experts: its grouped GEMMs "
            "for that many routed random tokens), prefill at 512. Its cost model predicts every row below: "
            f"the mixed plans, batch{'es' if len(d.get('unprofiled_batches', [])) != 1 else ''} "
            f"{', '.join(str(b) for b in d.get('unprofiled_batches', [])) or '-'} (not profiled) and context "
            f"{d['context']} (between the profiled ones) are predictions from it; all-BF16 and all-FP8 at the "
            "profiled batches it measured itself (in other meter windows, earlier). Routing: measured on a "
            "decode step's tokens. Shipped: the shipped layer profile's cost model of this GPU (the model "
            "without a per-model profile)."
            + (f" Per-model predictions recomputed after the run (no GPU): `{prof['replayed_by']}`."
               if prof.get("replayed_by") else ""), ""]
    lines += [
        "| plan | batch | experts touched / layer | ms/step | floor ms | x floor | J/token (measured) | "
        "per-model J/token | error | shipped J/token | error | roofline J/token | cv |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        if r.get("error"):
            lines.append(f"| {r['format']} | {r['batch']} | {r['error']} |||||||||||")
            continue
        pm = f"{r['predicted_j_per_token']:.4f}" if "predicted_j_per_token" in r else "-"
        lines.append(
            f"| {r['format']} | {r['batch']}{'' if r.get('profiled', True) else ' (not profiled)'} | "
            f"{r['experts_touched_mean']:.1f} (expected {r['experts_expected']:.1f}) | {r['ms_per_step']:.3f} | "
            f"{r['floor_ms']:.3f} | {r['ms_per_step'] / r['floor_ms']:.2f} | {r['j_per_token']:.4f} | {pm} | "
            f"{_err(r, 'prediction_error_pct')} | {r['layer_profile_j_per_token']:.4f} | "
            f"{r['layer_profile_error_pct']:+.1f}% | {r['roofline_j_per_token']:.4f} | {r['cv']:.4f} |")
    ok = [r for r in d["rows"] if not r.get("error")]
    pm = [r for r in ok if "prediction_error_pct" in r]
    if pm:
        within = [r for r in pm if abs(r["prediction_error_pct"]) <= 5]
        worst = max(pm, key=lambda r: abs(r["prediction_error_pct"]))
        lines += ["", f"**Per-model profile within 5% of the measured J/token at {len(within)} of {len(pm)} points**; "
                  f"worst {worst['prediction_error_pct']:+.1f}% ({worst['format']}, batch {worst['batch']})."]
    if ok:
        within = [r for r in ok if abs(r["layer_profile_error_pct"]) <= 5]
        worst = max(ok, key=lambda r: abs(r["layer_profile_error_pct"]))
        lines += ["", f"Shipped layer profile within 5% at {len(within)} of {len(ok)} points; worst "
                  f"{worst['layer_profile_error_pct']:+.1f}% ({worst['format']}, batch {worst['batch']}): its "
                  "non-GEMM time is the profiled dense Llama layer's (8 kernels), while a MoE layer here also runs "
                  "the router GEMV, top-k, a sort, gathers and scatters and the grouped-GEMM setup (about 25 small "
                  "kernels, listed below), a fixed cost per layer that dominates at small batch; its expert GEMMs "
                  "are the dense profile's scaled by weight count. The per-model profile measures both."]
    lines += ["", "## Checks (GPU)", ""]
    for f, c in d.get("checks", {}).items():
        lines.append(f"- {f}: grouped experts vs a float32 loop over experts, rel. L2 {c['rel_err_vs_loop']:.4f}")
    for f, rows in d.get("kernels", {}).items():
        top = ", ".join(f"`{r['name'][:70]}` x{r['count']}" for r in rows[:6])
        lines.append(f"- {f} decode step, batch 16 (eager, profiler), heaviest kernels: {top}")
    labels = next((r for r in ok if r.get("layer_profile_label")), None)
    if labels:
        lines += ["", f"Shipped cost model label: {labels['layer_profile_label']}"]
        if labels.get("predicted_label"):
            lines += ["", f"Per-model cost model label: {labels['predicted_label']}"]
    return "\n".join(lines) + "\n"


def measure_plan(meter, bench, shape, name: str, batches: list[int], context: int, bw: float,
                 model_profile: dict | None, profiled: set[int], gpu, log,
                 shape_name: str = "qwen3-30b-a3b") -> list[dict[str, Any]]:
    """Each batch of one plan: the metered decode step, its floor, and both cost models' predictions."""
    from advisor.energy.prediction import layer_experts_touched
    from advisor.plan import Plan

    formats = plan_formats(shape, name)
    rt = bench.runtime(formats)
    rows = []
    for b in batches:
        row: dict[str, Any] = {"shape": shape_name, "format": name, "batch": b, "layers": shape.num_layers,
                               "profiled": b in profiled}
        rows.append(row)
        try:
            step, touched = step_with_routing(rt, b, context)
            r = measure_step(meter, step, f"moe {name} b{b}")
            del step
            rt.free()
            parts = bytes_read(rt, touched, b, context)
            row.update(ms_per_step=r["ms_per_step"], j_per_token=r["j_per_token"],
                       floor_ms=sum(parts.values()) / (bw * 1e9) * 1e3, bytes=parts, power_w=r["power_w"],
                       cv=r["cv"], unstable=r["unstable"], ms_per_step_events=r["ms_per_step_events"],
                       experts_touched=touched, experts_touched_mean=sum(touched) / len(touched),
                       experts_expected=sum(layer_experts_touched(g, b) for g in shape.layers) / shape.num_layers,
                       **predictions(shape, Plan(formats), b, context, model_profile, gpu))
            row["layer_profile_error_pct"] = (row["layer_profile_j_per_token"] / row["j_per_token"] - 1) * 100
            if "predicted_j_per_token" in row:
                row["prediction_error_pct"] = (row["predicted_j_per_token"] / row["j_per_token"] - 1) * 100
            log(f"  {name} b{b:<3d} {row['ms_per_step']:8.3f} ms floor {row['floor_ms']:7.3f} "
                f"{row['j_per_token']:.4f} J/tok (per-model {row.get('predicted_j_per_token', 0):.4f}, "
                f"shipped {row['layer_profile_j_per_token']:.4f}) experts {row['experts_touched_mean']:.1f}")
        except Exception as exc:  # a point failing must not end the run
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            log(f"  {name} b{b}: {row['error']}")
            rt.free()
    del rt
    torch.cuda.empty_cache()
    return rows


def replay(path: Path, profile_path: Path, command: str) -> None:
    """Recompute the per-model predictions of a finished run (its JSON) with the cost model here (no GPU)."""
    from advisor.energy.prediction import ModelProfileCostModel
    from advisor.plan import Plan

    d = json.loads(path.read_text())
    prof = json.loads(profile_path.read_text())
    shape = model_shape_of(d["layers"], d.get("model", "qwen3-30b-a3b")).with_expert_load({int(i): tuple(q) for i, q in
                                                          d["routing_load_decode"].items()})
    model = ModelProfileCostModel(prof, shape)
    for r in d["rows"]:
        if r.get("error"):
            continue
        ms, j = model.decode_step(Plan(plan_formats(shape, r["format"])), r["batch"], d["context"])
        r.update(predicted_ms=ms, predicted_j_per_token=j / r["batch"], predicted_label=model.label,
                 prediction_error_pct=(j / r["batch"] / r["j_per_token"] - 1) * 100)
    d["model_profile"]["replayed_by"] = command
    path.write_text(json.dumps(d, indent=1))
    path.with_suffix(".md").write_text(render(d))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/moe_gpu.json"))
    ap.add_argument("--replay", type=Path, help="the per-model profile of the run in --out: recompute its "
                    "per-model predictions with this cost model (no GPU) and rewrite --out and its .md")
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batches", default="1,16,64,256", help="profiled (when --profile-contexts) and measured")
    ap.add_argument("--extra-batches", default="32", help="measured, not profiled")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--profile-contexts", default="256,768", help="the per-model profile's contexts ('' = none)")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    if args.replay:
        replay(args.out, args.replay, command)
        return 0
    batches = [int(x) for x in args.batches.split(",") if x]
    extra = [int(x) for x in args.extra_batches.split(",") if x]
    pctx = tuple(int(x) for x in args.profile_contexts.split(",") if x)
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    start = time.time()
    mcfg = MeterConfig(warmup_s=args.warmup_s, min_window_s=args.window_s, min_ticks=args.ticks,
                       repeats=args.repeats, idle_s=0.5)
    meter = open_meter(torch.cuda.current_device(), mcfg)
    state, idle_w, bw = meter.counter.state(), meter.idle_power_w(), copy_bandwidth_gb_s()
    gpu = gpu_from_device_name(state.name) or GPU.H100
    torch.cuda.empty_cache()
    title = MODELS[args.model][0]
    full = DecoderDims.from_config(model_config(args.model))
    layers = args.layers or layers_that_fit(full, max(batches + extra), max((args.context, *pctx)))
    dims = full.with_layers(layers)
    out: dict[str, Any] = {**measurement_header(state, idle_w, bw, command, torch.__version__),
                           "meter": dataclasses.asdict(mcfg), "context": args.context, "layers": layers, "rows": [],
                           "unprofiled_batches": extra if pctx else [],
                           "model": args.model,
                           "shape": f"{title} shapes, {layers} of its {full.num_layers} layers"
                           + ("" if layers == full.num_layers else
                              " (GPU memory: BF16 and FP8 weights held at once, and the largest batch's KV cache)")}
    log(f"{state.name}, driver {state.driver}, idle {idle_w:.0f} W, copy {bw:.0f} GB/s; {out['shape']}")
    bench = Bench.create(dims, max_pos=max((args.context, *pctx)) + 2)
    rts = {f: bench.runtime(uniform_formats(dims, fmt)) for f, fmt in FORMATS.items()}
    log(f"weights ready in {time.time() - start:.0f} s")
    out["checks"] = {f: experts_check(rt) for f, rt in rts.items()}
    out["kernels"] = {}
    for f, rt in rts.items():
        rt.allocate_cache(16, args.context + 1)
        tok = torch.zeros(16, 1, dtype=torch.long, device="cuda")
        with torch.no_grad():
            rt.forward(tok, args.context)
            out["kernels"][f] = kernel_names(lambda rt=rt, tok=tok: rt.forward(tok, args.context))
        rt.free()
    log(f"checks: {out['checks']}")
    # Random weights have no meaningful routing: a prefill of random tokens routes far more
    # skewed than a decode step over the random cache (measured in the first run: 43 expected vs 82
    # touched at batch 16). The prediction uses the decode steps' own routing (256 tokens, seed 7),
    # i.e. routing measured on tokens of the state it predicts.
    load = routing_load(rts["bf16"], max(batches + extra), 1, args.context)
    del rts
    out["routing_load_decode"] = {str(i): q for i, q in load.items()}
    shape = model_shape_of(layers, args.model).with_expert_load(load)
    model_profile = None
    if pctx:
        from advisor.energy.meter import EnergyMeter
        from advisor.energy.profiling import measure_model_profile, profile_meter_config

        t0 = time.time()
        model_profile = measure_model_profile(dims, batches=tuple(batches), contexts=pctx, prefill_lengths=(512,),
                                              meter=EnergyMeter(meter.counter, profile_meter_config()), bench=bench,
                                              command=command + " (per-model profile)", log=log)
        out["model_profile"] = {"seconds": time.time() - t0, "batches": batches, "contexts": list(pctx),
                                "file": args.out.with_suffix(".profile.json").name}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".profile.json").write_text(json.dumps(model_profile, indent=1))
        log(f"per-model profile in {out['model_profile']['seconds']:.0f} s")
    for name in [p for p in args.plans.split(",") if p]:
        out["rows"] += measure_plan(meter, bench, shape, name, batches + extra, args.context, bw, model_profile,
                                    set(batches) if pctx else set(), gpu, log, args.model)
        out["elapsed_s"] = time.time() - start
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
        args.out.with_suffix(".md").write_text(render(out))
    log(f"wrote {args.out} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
