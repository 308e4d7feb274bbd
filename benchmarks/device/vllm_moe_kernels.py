"""vLLM's fused MoE as it serves a ModelOpt export on Hopper, one MoE layer at M tokens a step: the router's GEMM and
top-k (``fused_topk``) and the routed experts (``fused_experts``: vLLM's Triton kernel, the backend the advisor serves
FP8 experts with, and vLLM's own for BF16 experts there), BF16 and FP8 (per-tensor static activation scale, one
weight scale per expert, as ModelOpt exports), with the tile config vLLM picks (its tuned file for the geometry and
GPU where it has one, else its default: both are recorded). Time from a CUDA graph of several layers' copies in turn,
so that one layer's experts are not read from L2 at the next call; energy from NVML's counter over a replay loop.

Why: the Qwen3-30B-A3B MoE's all-FP8, served by vLLM on an H200, ran 1.5-2x faster than the built-in runtime's
per-model profile prices its experts and routing (reports/benchmarks/vllm_step_check_h200_moe_before_table.md);
the vLLM step model prices the routed experts from these rows instead (a profile's ``moe_kernels``, written by
``benchmarks/engine_true/vllm_step_fit.py --moe-kernels``; reports/benchmarks/vllm_moe_kernels_h200.md). Needs a GPU
and vLLM on the path to measure; ``--render`` needs neither.

    python3 benchmarks/device/vllm_moe_kernels.py --out moe_kernels.json
    python3 benchmarks/device/vllm_moe_kernels.py --render a.json b.json --report r.md   # no GPU needed
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from advisor.energy.runtime import capture  # noqa: E402  (its side-stream run compiles Triton's tile configs)

#: (experts, top-k, hidden, expert intermediate) of published MoE configs (their config.json files)
GEOMETRIES = {
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "qwen3-235b-a22b": (128, 8, 4096, 1536),
    "qwen1.5-moe-a2.7b": (60, 4, 2048, 1408),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}
TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)
L2_BYTES = 50 * 2**20  # Hopper's L2 (H100 SXM 50 MB, H200 the same die)
ENERGY_WINDOW_S = 1.5


def layer_weights(experts: int, hidden: int, inter: int, fp8: bool) -> dict[str, torch.Tensor]:
    """One layer's experts: w1 [E, 2I, hidden] (gate and up), w2 [E, hidden, I]; FP8 with one scale per expert and
    static per-tensor activation scales."""
    w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / math.sqrt(hidden)
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / math.sqrt(inter)
    router = torch.randn(hidden, experts, device="cuda", dtype=torch.bfloat16) / math.sqrt(hidden)
    if not fp8:
        return {"w1": w1, "w2": w2, "router": router}
    out = {"router": router}
    for name, w in (("w1", w1), ("w2", w2)):
        scale = w.abs().amax(dim=(1, 2)).float() / 448.0
        out[name] = (w / scale[:, None, None].to(w.dtype)).to(torch.float8_e4m3fn)
        out[f"{name}_scale"] = scale
    out["a1_scale"] = torch.tensor(4.0 / 448.0, device="cuda")
    out["a2_scale"] = torch.tensor(4.0 / 448.0, device="cuda")
    return out


def copies_for(experts: int, top_k: int, hidden: int, inter: int, fp8: bool) -> int:
    """Layer copies a graph cycles through: at one token their touched experts exceed L2 four times over."""
    touched = min(top_k, experts) * 3 * hidden * inter * (1 if fp8 else 2)
    return max(4, min(16, math.ceil(4 * L2_BYTES / touched)))


def moe_call(layers: list[dict[str, torch.Tensor]], x: torch.Tensor, gating: torch.Tensor, top_k: int, fp8: bool):
    from vllm.model_executor.layers.fused_moe import fused_experts, fused_topk
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

    configs = [fp8_w8a8_moe_quant_config(w1_scale=w["w1_scale"], w2_scale=w["w2_scale"], a1_scale=w["a1_scale"],
                                         a2_scale=w["a2_scale"]) if fp8 else None for w in layers]

    def run() -> None:
        h = x
        for w, config in zip(layers, configs, strict=True):
            torch.mm(h, w["router"])  # the router's BF16 GEMM, as vLLM runs it; the top-k reads the fixed random
            # gating instead, so that routing stays uniform as a random-weight model's is, layer after layer
            weights, ids, _ = fused_topk(h, gating, top_k, renormalize=True)
            h = fused_experts(h, w["w1"], w["w2"], weights, ids, quant_config=config)
    return run


def timed(graph: torch.cuda.CUDAGraph, nvml_handle) -> tuple[float, float, float]:
    """(ms a replay from CUDA events, J a replay from NVML's energy counter, mean W) over a loop of at least
    ENERGY_WINDOW_S seconds."""
    import pynvml

    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    reps = max(20, int(ENERGY_WINDOW_S / max(time.perf_counter() - t0, 1e-5)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml_handle)
    w0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - w0
    joules = (pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml_handle) - e0) / 1e3
    return start.elapsed_time(end) / reps, joules / reps, joules / wall


def chosen_config(experts: int, top_k: int, hidden: int, inter: int, fp8: bool, m: int) -> tuple[dict, str]:
    """The tile config vLLM's Triton MoE takes at ``m`` tokens, and whether a tuned file or its default gave it."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_moe_configs, try_get_optimal_moe_config

    dtype = "fp8_w8a8" if fp8 else None
    config = try_get_optimal_moe_config((experts, 2 * inter, hidden), (experts, hidden, inter), top_k, dtype, m)
    return config, "tuned" if get_moe_configs(experts, inter, dtype) else "default"


def render(records: list[tuple[str, dict]]) -> str:
    """Runs (path, record) as a Markdown report: the first run of each geometry is its table; a later run of the same
    geometry is a repeat, shown as its spread from the first."""
    lines = ["# vLLM's fused MoE a layer, BF16 and FP8, as the advisor serves MoE experts on Hopper", ""]
    for path, rec in records:
        geometries = sorted({r["geometry"] for r in rec["rows"]})
        lines.append(f"- `{path}`: {rec['gpu_smi']}; vLLM {rec['vllm_version']}, torch {rec['torch']}; {rec['date']}; "
                     f"{', '.join(geometries)}. Command: `{rec['command']}`.")
    lines += ["", "Per layer: the router's BF16 GEMM, `fused_topk` over uniform random gating, `fused_experts` "
              "(Triton; FP8 per-tensor as ModelOpt exports). Time from CUDA events over a loop of CUDA-graph "
              "replays of several layer copies; energy from NVML's counter over the same loop (at least 1.5 s). "
              "Tiles: vLLM's tuned file for the geometry and GPU, else its default.", ""]
    first: dict[tuple[str, str, int], dict] = {}
    repeats: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _, rec in records:
        for r in rec["rows"]:
            key = (r["geometry"], r["format"], r["tokens"])
            if key in first:
                was = first[key]
                repeats.setdefault(key[:2], []).append((r["ms_per_layer"] / was["ms_per_layer"] - 1,
                                                        r["j_per_layer"] / was["j_per_layer"] - 1))
            else:
                first[key] = r
    for name in dict.fromkeys(k[0] for k in first):
        e, k, h, i = GEOMETRIES[name]
        lines += [f"## {name}: {e} experts, top-{k}, hidden {h}, expert intermediate {i}", "",
                  "| tokens | BF16 us | BF16 mJ | BF16 tiles | FP8 us | FP8 mJ | FP8 tiles | FP8 / BF16 time |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in sorted({k[2] for k in first if k[0] == name}):
            b, f = first.get((name, "bf16", m)), first.get((name, "fp8", m))
            cells = [f"{r['ms_per_layer'] * 1e3:.1f} | {r['j_per_layer'] * 1e3:.1f} | {r['tile_config_source']}"
                     if r else "- | - | -" for r in (b, f)]
            ratio = f"{f['ms_per_layer'] / b['ms_per_layer']:.2f}" if b and f else "-"
            lines.append(f"| {m} | {cells[0]} | {cells[1]} | {ratio} |")
        lines.append("")
    if repeats:
        lines += ["## Repeats (a later run against the first, the same rows)", "",
                  "| geometry | format | rows | time, largest difference | energy, largest difference |",
                  "|---|---|---|---|---|"]
        for (name, fmt), diffs in repeats.items():
            lines.append(f"| {name} | {fmt} | {len(diffs)} | {max(abs(d[0]) for d in diffs) * 100:.1f}% | "
                         f"{max(abs(d[1]) for d in diffs) * 100:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--geometries", nargs="+", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--formats", nargs="+", default=["bf16", "fp8"], choices=["bf16", "fp8"])
    ap.add_argument("--out", help="where the measured record (JSON) goes")
    ap.add_argument("--render", nargs="+", help="records written before: render them as Markdown, measure nothing")
    ap.add_argument("--report", help="where --render's Markdown goes")
    args = ap.parse_args()
    if args.render:
        Path(args.report).write_text(render([(p, json.loads(Path(p).read_text())) for p in args.render]))
        return
    if not args.out:
        ap.error("--out is required to measure")
    import pynvml
    import vllm

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    out = {"gpu_smi": smi, "date": datetime.date.today().isoformat(), "vllm_version": vllm.__version__,
           "torch": torch.__version__, "host": platform.node(), "command": "python3 " + " ".join(sys.argv),
           "idle_power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3, "rows": []}
    try:  # vLLM's ops may read the current config: a default one, where it builds without a model
        from vllm.config import VllmConfig, set_current_vllm_config

        context = set_current_vllm_config(VllmConfig())
    except Exception as exc:  # noqa: BLE001
        print(f"no default VllmConfig ({exc}); the ops run without one", flush=True)
        context = contextlib.nullcontext()
    with context:
        for name in args.geometries:
            experts, top_k, hidden, inter = GEOMETRIES[name]
            for fmt in args.formats:
                fp8 = fmt == "fp8"
                n = copies_for(experts, top_k, hidden, inter, fp8)
                layers = [layer_weights(experts, hidden, inter, fp8) for _ in range(n)]
                for m in args.tokens:
                    x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
                    gating = torch.randn(m, experts, device="cuda", dtype=torch.bfloat16)  # as the router gives it
                    ms, joules, watts = timed(capture(moe_call(layers, x, gating, top_k, fp8)), handle)
                    config, source = chosen_config(experts, top_k, hidden, inter, fp8, m)
                    row = {"geometry": name, "experts": experts, "top_k": top_k, "hidden": hidden,
                           "intermediate": inter, "format": fmt, "tokens": m, "layers_in_graph": n,
                           "ms_per_layer": ms / n, "j_per_layer": joules / n, "power_w": watts,
                           "tile_config": config, "tile_config_source": source}
                    out["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    with open(args.out, "w") as f:
                        json.dump(out, f, indent=1)
                del layers
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
