"""Each dense family's measurement runtime on this GPU: logits against HF, decode ms/step and J/token.

    PYTHONPATH=. python benchmarks/studies/families_gpu.py --out $OUT/families_gpu.json [--quick]
        [--families qwen3-8b,mistral-7b,...] [--batches 1,16,64] [--contexts 512,4096]
        [--warmup-s 0.3 --window-s 0.5 --ticks 5 --repeats 3] [--budget-s 450]

Configs are built here from the published numbers of each model (random weights on the
GPU; nothing is downloaded). Per family:

1. logits: a ``--check-layers``-layer HF model of the real widths and vocab (eager attention,
   float32 reference) against the runtime on the same weights, BF16 and FP8 (prefill of
   all tokens but the last, then a graph-captured decode step; the sequence outruns the
   smallest sliding window so windows and ring caches are exercised):
   ``logits_rel_err`` = max relative L2 error of the two last-token logits; FP8 rows
   compare with the BF16 HF model, so they include FP8's own error;
2. energy: the model at its full depth (fewer layers where the GPU's memory needs it:
   ``layers`` in each row and the note say so), all-BF16 and all-FP8, a decode step at
   every batch x context under the NVML meter (short windows, stated in the output):
   ms/step and J/token; ``floor_ms`` = (weight bytes in their format + BF16 lm_head + the
   KV bytes the step reads, sliding windows capped) / the copy bandwidth measured here.

The JSON is rewritten after every family (partial results survive); a family or a point
that fails records its error and the script goes on. Past ``--budget-s`` the remaining
points are recorded as skipped. ``--quick``: the first family, batch 16, context 512.
Writes families_gpu.json and families_gpu.md side by side.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import transformers

from advisor.energy.measure import Bench, decode_step, measure_step, uniform_formats
from advisor.energy.meter import MeterConfig, open_meter
from advisor.energy.profiling import measurement_header
from advisor.energy.runtime import DecoderDims, copy_bandwidth_gb_s
from advisor.formats import Format

# published shapes (config.json of each model); text towers only
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-8b": ("Qwen3Config", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                     head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960,
                                     tie_word_embeddings=False)),
    "mistral-7b-v0.1": ("MistralConfig", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                              num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                              sliding_window=4096, rope_theta=1e4, rms_norm_eps=1e-5,
                                              max_position_embeddings=32768)),
    "gemma-3-4b-text": ("Gemma3TextConfig", dict(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, sliding_window=1024, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
        max_position_embeddings=131072, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "phi-3-mini-4k": ("Phi3Config", dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                                         sliding_window=2047, rope_theta=1e4, rms_norm_eps=1e-5,
                                         max_position_embeddings=4096, pad_token_id=32000)),
    "llama-3.1-8b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                         rope_theta=5e5, rms_norm_eps=1e-5, max_position_embeddings=131072,
                                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192})),
    "qwen2.5-7b": ("Qwen2Config", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                                       rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
                                       tie_word_embeddings=False)),
    "gemma-2-9b": ("Gemma2Config", dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336,
                                        num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                                        head_dim=256, sliding_window=4096, query_pre_attn_scalar=256,
                                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                        rms_norm_eps=1e-6, max_position_embeddings=8192)),
}
FORMATS = {"bf16": Format.BF16, "fp8": Format.FP8}
DEVICE = "cuda"
MEMORY_MARGIN = 6 << 30  # graph pools, activations, allocator slack


def make_config(name: str) -> Any:
    cls, kw = FAMILIES[name]
    return getattr(transformers, cls)(**kw)


def describe(name: str, dims: DecoderDims) -> str:
    windows = sorted({la.attention.sliding_window for la in dims.layers if la.attention.sliding_window})
    n_win = sum(1 for la in dims.layers if la.attention.sliding_window)
    win = f"window {windows[0]} on {n_win}/{dims.num_layers} layers" if windows else "no window"
    return (f"{name} ({dims.family}; {dims.num_layers} layers, hidden {dims.hidden}, {dims.heads}/{dims.kv_heads} "
            f"heads x {dims.head_dim}, MLP {dims.intermediate}, vocab {dims.vocab}, {win})")


def layers_that_fit(dims: DecoderDims, batch: int, context: int) -> int:
    """Most layers whose BF16 weights, their FP8 copies and the largest KV cache fit the free memory."""
    free, _ = torch.cuda.mem_get_info()
    la = dims.layers[0]
    a = la.attention
    params = (a.heads + 2 * a.kv_heads) * a.head_dim * dims.hidden + a.heads * a.head_dim * dims.hidden
    per_layer_w = (params + 3 * dims.hidden * la.intermediate) * 3  # 2 bytes BF16 + 1 byte FP8
    per_layer_kv = max(4 * batch * x.attention.kv_heads * x.attention.head_dim * x.attention.kv_tokens(context + 1)
                       for x in dims.layers)  # K and V, BF16; a sliding layer holds its window
    tables = 1 + (not dims.tied_embeddings) + (dims.embed_scale != 1.0)  # embedding, lm_head, scaled embedding
    room = free - MEMORY_MARGIN - tables * dims.vocab * dims.hidden * 2
    return max(1, min(dims.num_layers, int(room // (per_layer_w + per_layer_kv))))


def check_config(config: Any, layers: int) -> Any:
    """The config cut to ``layers``, keeping a full-attention layer where the model has one."""
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = layers
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        cut = list(types)[:layers]
        if "full_attention" in types and "full_attention" not in cut:
            cut[-1] = "full_attention"
        cfg.layer_types = cut
    return cfg


def logits_check(config: Any, layers: int, log) -> dict[str, Any]:
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights, calibrate

    cfg = check_config(config, layers)
    dims = DecoderDims.from_config(cfg)
    windows = [la.attention.sliding_window for la in dims.layers if la.attention.sliding_window]
    seq = min(min(windows) + 64, 4160) if windows else 512
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.bfloat16)
    model.eval()
    tokens = torch.randint(3, dims.vocab, (2, seq), device=DEVICE)
    with torch.no_grad():  # float32 reference; logits of the last two positions only
        ref = copy.deepcopy(model).float()(tokens, logits_to_keep=2).logits.float()
    torch.cuda.empty_cache()
    w = DecoderWeights.from_hf(model, max_pos=seq + 8, device=DEVICE, dims=dims)
    out: dict[str, Any] = {"layers": layers, "tokens": seq, "batch": 2}
    amax = calibrate(w, batch=2, length=256)
    for fmt_name, fmt in FORMATS.items():
        rt = DecoderRuntime(w, uniform_formats(dims, fmt), amax)
        rt.allocate_cache(2, seq + 8)
        with torch.no_grad():
            pre = rt.forward(tokens[:, :-1], 0)
        step = rt.capture(tokens[:, -1:], seq - 1)
        step.graph.replay()
        torch.cuda.synchronize()
        errs = [_rel(pre, ref[:, 0]), _rel(step.logits, ref[:, 1])]
        out[fmt_name] = {"prefill": errs[0], "decode": errs[1], "max": max(errs)}
        del step
        rt.free()
    log(f"  logits vs HF ({layers} layers, {seq} tokens): bf16 {out['bf16']['max']:.4f}, fp8 {out['fp8']['max']:.4f}")
    del model, w
    torch.cuda.empty_cache()
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_family(name: str, args, meter, bw: float, deadline: float, rows: list, info: dict, log) -> None:
    config = make_config(name)
    full = DecoderDims.from_config(config)
    check = logits_check(config, args.check_layers, log)
    info["logits_check"] = check
    layers = layers_that_fit(full, max(args.batches), max(args.contexts))
    layers = min(layers, args.max_layers or layers)
    dims = full if layers == full.num_layers else full.with_layers(layers)
    info.update(shape=describe(name, full), layers_full=full.num_layers, layers_run=layers, dims=dims.summary())
    if layers < full.num_layers:
        info["note"] = f"{layers} of {full.num_layers} layers (memory for batch {max(args.batches)} x context " \
                       f"{max(args.contexts)} or --max-layers)"
        log(f"  {info['note']}")
    bench = Bench.create(dims, max_pos=max(args.contexts) + 2)
    rts = {f: bench.runtime(uniform_formats(dims, fmt)) for f, fmt in FORMATS.items()}
    wbytes = {f: rt.weight_bytes() for f, rt in rts.items()}
    info["weight_bytes"] = wbytes
    for ctx in args.contexts:
        for b in args.batches:
            for f, rt in rts.items():
                row = empty_row(name, info["shape"], f, b, ctx, layers=layers)
                row["logits_rel_err"] = check[f]["max"]
                rows.append(row)
                if time.time() > deadline:
                    row["error"] = "skipped: time budget (--budget-s) spent"
                    continue
                try:
                    if f != "bf16":
                        rt.share_cache(rts["bf16"])  # same shapes: no second cache
                    step = decode_step(rt, b, ctx)
                    r = measure_step(meter, step, f"{name} {f} b{b} c{ctx}")
                    del step
                    kv = dims.kv_bytes(b, ctx + 1)
                    floor_ms = (wbytes[f] + kv) / (bw * 1e9) * 1e3
                    row.update(ms_per_step=r["ms_per_step"], j_per_token=r["j_per_token"], floor_ms=floor_ms,
                               time_over_floor=r["ms_per_step"] / floor_ms, power_w=r["power_w"], cv=r["cv"],
                               unstable=r["unstable"], kv_bytes=kv, weight_bytes=wbytes[f],
                               floor_ratio=(wbytes[f] + kv) / (wbytes["bf16"] + kv))
                    log(f"  {f:4s} b{b:<3d} c{ctx:<5d} {row['ms_per_step']:8.3f} ms  floor {floor_ms:7.3f} "
                        f"(x{row['time_over_floor']:.2f})  {row['j_per_token']:.4f} J/tok  cv {row['cv']:.4f}")
                except Exception as exc:  # one point failing (e.g. out of memory) must not end the run
                    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
                    log(f"  {f} b{b} c{ctx}: {row['error']}")
            for rt in rts.values():
                rt.free()
    del rts, bench
    torch.cuda.empty_cache()


def empty_row(name: str, shape: str, fmt: str | None, batch: int | None, context: int | None, **extra) -> dict:
    return {"family": name, "shape": shape, "format": fmt, "batch": batch, "context": context, "ms_per_step": None,
            "j_per_token": None, "floor_ms": None, "logits_rel_err": None, **extra}


def add_ratios(rows: list[dict]) -> None:
    ok = [r for r in rows if not r.get("error")]
    by = {(r["family"], r["format"], r["batch"], r["context"]): r for r in ok}
    for r in ok:
        base = by.get((r["family"], "bf16", r["batch"], r["context"]))
        if r["format"] != "bf16" and base and r.get("j_per_token") and base.get("j_per_token"):
            r["j_ratio_vs_bf16"] = r["j_per_token"] / base["j_per_token"]
            r["j_ratio_over_floor_ratio"] = r["j_ratio_vs_bf16"] / r["floor_ratio"]


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(d: dict) -> str:
    m = d["meter"]
    lines = [
        "# Each dense family on the measurement runtime (random weights)", "",
        f"Measured on **{d['gpu']}**, driver {d['driver']}, power limit {d['power_limit_w']:.0f} W (idle "
        f"{d['idle_power_w']:.0f} W), {d['date']}; copy bandwidth {d['copy_bandwidth_gb_s']:.0f} GB/s; torch "
        f"{d['torch']}. Command: `{d['command']}`.", "",
        f"Meter windows (shortened to fit the run): warm-up {m['warmup_s']} s, windows >= {m['min_window_s']} s "
        f"and >= {m['min_ticks']} counter ticks, {m['repeats']} repeats, median. Decode steps, CUDA graphs; "
        "floor = (weight bytes + KV bytes read, windows capped) / copy bandwidth; logits error: runtime vs HF "
        "(float32) on the same random weights with the layers given below (FP8 includes its quantization error).",
        "", "| family | layers | format | batch | context | ms/step | floor ms | x floor | J/token | J vs BF16 "
        "| / floor ratio | cv | logits err |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in d["rows"]:
        if r.get("error"):
            cells = [r.get(k) for k in ("layers", "format", "batch", "context")]
            lines.append(f"| {r['family']} | " + " | ".join("-" if c is None else str(c) for c in cells)
                         + f" | {r['error']} |||||||")
            continue
        lines.append(
            f"| {r['family']} | {r['layers']} | {r['format']} | {r['batch']} | {r['context']} | "
            f"{r['ms_per_step']:.3f} | {r['floor_ms']:.3f} | {r['time_over_floor']:.2f} | {r['j_per_token']:.4f} | "
            f"{_f(r.get('j_ratio_vs_bf16'))} | {_f(r.get('j_ratio_over_floor_ratio'))} | {r['cv']:.4f} | "
            f"{_f(r['logits_rel_err'], '{:.4f}')} |")
    lines += ["", "## Families", ""]
    for name, info in d["families"].items():
        chk = info.get("logits_check", {})
        lines.append(f"- {info.get('shape', name)}: ran {info.get('layers_run', '-')} layers"
                     + (f" ({info['note']})" if info.get("note") else "")
                     + (f"; logits checked on {chk['layers']} layers, {chk['tokens']} tokens" if chk else "")
                     + (f"; **failed**: {info['error']}" if info.get("error") else ""))
    ok = [r for r in d["rows"] if not r.get("error")]
    bf = [r for r in ok if r["format"] == "bf16"]
    fp = [r for r in ok if r["format"] == "fp8" and r["batch"] >= 16 and r.get("j_ratio_over_floor_ratio")]
    lines += ["", "## Targets (as for Llama)", ""]
    if bf:
        worst = max(bf, key=lambda r: r["time_over_floor"])
        missed = [r for r in bf if r["time_over_floor"] > 1.3]
        lines.append(f"- BF16 within 1.3x of the floor: worst {worst['time_over_floor']:.2f}x ({worst['family']} "
                     f"b{worst['batch']} c{worst['context']}); missed at {len(missed)} of {len(bf)} points")
    if fp:
        worst = max(fp, key=lambda r: r["j_ratio_over_floor_ratio"])
        missed = [r for r in fp if r["j_ratio_over_floor_ratio"] > 1.1]
        lines.append(f"- FP8 J/token at batch >= 16 within 1.1x of the floor ratio: worst "
                     f"{worst['j_ratio_over_floor_ratio']:.3f}x ({worst['family']} b{worst['batch']} "
                     f"c{worst['context']}); missed at {len(missed)} of {len(fp)} points")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks/families_gpu.json"))
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"from {', '.join(FAMILIES)}")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--check-layers", type=int, default=2)
    ap.add_argument("--max-layers", type=int, default=None, help="cap the layers of every family")
    ap.add_argument("--warmup-s", type=float, default=0.3)
    ap.add_argument("--window-s", type=float, default=0.5)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop measuring after this long")
    ap.add_argument("--quick", action="store_true", help="the first family, batch 16, context 512")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    args.batches, args.contexts = ints(args.batches), ints(args.contexts)
    if args.quick:
        names, args.batches, args.contexts = names[:1], [16], [512]
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    start = time.time()
    deadline = start + args.budget_s
    mcfg = MeterConfig(warmup_s=args.warmup_s, min_window_s=args.window_s, min_ticks=args.ticks,
                       repeats=args.repeats, idle_s=0.5)
    meter = open_meter(torch.cuda.current_device(), mcfg)
    state = meter.counter.state()
    idle_w = meter.idle_power_w()
    bw = copy_bandwidth_gb_s()
    torch.cuda.empty_cache()
    log(f"{state.name}, driver {state.driver}, idle {idle_w:.0f} W, copy {bw:.0f} GB/s; meter {mcfg}")
    out: dict[str, Any] = {**measurement_header(state, idle_w, bw, command, torch.__version__),
                           "meter": dataclasses.asdict(mcfg), "quick": args.quick, "families": {}, "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        log(f"{name}:")
        info: dict[str, Any] = {}
        out["families"][name] = info
        if time.time() > deadline - 30:  # not even the setup of one more family fits
            info["error"] = "skipped: time budget (--budget-s) spent"
            out["rows"].append(empty_row(name, name, None, None, None, error=info["error"]))
            log(f"  {info['error']}")
        else:
            try:
                run_family(name, args, meter, bw, deadline, out["rows"], info, log)
            except Exception as exc:  # a family failing must not end the run
                info["error"] = f"{type(exc).__name__}: {exc}"[:500]
                info["traceback"] = traceback.format_exc()[-3000:]
                out["rows"].append(empty_row(name, info.get("shape", name), None, None, None, error=info["error"]))
                log(f"  failed: {info['error']}")
                torch.cuda.empty_cache()
        add_ratios(out["rows"])
        out["elapsed_s"] = time.time() - start
        args.out.write_text(json.dumps(out, indent=1))
        args.out.with_suffix(".md").write_text(render(out))
    log(f"wrote {args.out} and {args.out.with_suffix('.md')} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
