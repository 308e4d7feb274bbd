"""Time one Llama-3.1-8B decoder layer's four linears at M tokens a step in BF16 and in FP8 as vLLM serves a ModelOpt
FP8 export on Hopper (vLLM's static per-tensor activation quant, then cuBLASLt through torch._scaled_mm, the
linear backend the advisor serves with; vLLM's CUTLASS scaled_mm beside it), each
captured in a CUDA graph so launch time is out. Answers whether FP8's served tokens/s stops growing with the batch
because its GEMMs do (reports/benchmarks/fp8_gemm_scaling_*.md). Needs a GPU and vLLM on the path.

    python benchmarks/device/fp8_gemm_scaling.py --out fp8_gemm.json
    python benchmarks/device/fp8_gemm_scaling.py --render fp8_gemm.json --report report.md   # no GPU needed
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess

import torch

# (name, in features, out features) of one Llama-3.1-8B layer: qkv, o, gate_up, down
LAYER = (("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096))
TOKENS = (16, 48, 64, 128, 256, 384, 512, 720, 1024, 1536, 2048, 4096)
REPS_IN_GRAPH = 8


def _bf16_chain(m: int) -> tuple[list, list]:
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, k, _ in LAYER]
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _, k, n in LAYER]
    return xs, ws


def _fp8_weights(ws: list) -> list:
    # vLLM keeps a ModelOpt FP8 weight transposed, column-major (K, N): w.t() of an (N, K) row-major tensor
    return [w.to(torch.float8_e4m3fn).t() for w in ws]


def _timed(fn, iters: int = 20) -> float:
    """Milliseconds for one call of fn's chain, from a CUDA graph of REPS_IN_GRAPH calls replayed iters times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS_IN_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (iters * REPS_IN_GRAPH)


def measure(m: int, ops) -> dict:
    xs, ws = _bf16_chain(m)
    w8 = _fp8_weights(ws)
    one = torch.ones(1, device="cuda", dtype=torch.float32)
    scales = [one.clone() for _ in LAYER]

    def bf16() -> None:
        for x, w in zip(xs, ws, strict=True):
            torch.nn.functional.linear(x, w)

    def fp8_vllm() -> None:
        for x, w, s in zip(xs, w8, scales, strict=True):
            q, qs = ops.scaled_fp8_quant(x, s)
            ops.cutlass_scaled_mm(q, w, qs, s, torch.bfloat16)

    def fp8_torch() -> None:
        for x, w, s in zip(xs, w8, scales, strict=True):
            q = ops.scaled_fp8_quant(x, s)[0] if ops is not None else (x / s).to(torch.float8_e4m3fn)
            torch._scaled_mm(q, w, scale_a=s, scale_b=s, out_dtype=torch.bfloat16)

    flops = 2 * m * sum(k * n for _, k, n in LAYER)
    row: dict = {"tokens": m}
    for name, fn in (("bf16", bf16), ("fp8_cutlass", fp8_vllm), ("fp8_torch_scaled_mm", fp8_torch)):
        if fn is fp8_vllm and ops is None:
            continue
        ms = _timed(fn)
        row[f"{name}_ms"] = round(ms, 5)
        row[f"{name}_tflops"] = round(flops / ms / 1e9, 1)
    row["served_fp8_over_bf16"] = round(row["fp8_torch_scaled_mm_ms"] / row["bf16_ms"], 3)
    return row


def render(record: dict, source: str) -> str:
    """The record as a Markdown report."""
    lines = [
        "# One Llama-3.1-8B layer's linears, BF16 against FP8 as vLLM serves it on Hopper",
        "",
        f"GPU: {record['gpu']}; torch {record['torch']} (CUDA {record['cuda']}); {record['date']}. "
        f"Command: `{record['command']}`; data: `{source}`.",
        "",
        "Per step of M tokens, the qkv, o, gate_up and down projections (in x out: "
        + ", ".join(f"{n} {k}x{o}" for n, k, o in record["layer"])
        + f"), captured {record['reps_in_graph']} times in one CUDA graph and replayed. FP8 served: vLLM's static "
        "per-tensor activation quant, then cuBLASLt through torch._scaled_mm (the linear backend the advisor "
        "serves with); CUTLASS: vLLM's own scaled_mm after the same quant.",
        "",
        "| tokens | BF16 ms | BF16 TFLOPS | FP8 served ms | FP8 served TFLOPS | FP8 / BF16 | CUTLASS ms "
        "| CUTLASS TFLOPS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lines.append(
            f"| {r['tokens']} | {r['bf16_ms']:.4f} | {r['bf16_tflops']:.0f} | {r['fp8_torch_scaled_mm_ms']:.4f} | "
            f"{r['fp8_torch_scaled_mm_tflops']:.0f} | {r['served_fp8_over_bf16']:.2f} | "
            f"{r.get('fp8_cutlass_ms', float('nan')):.4f} | {r.get('fp8_cutlass_tflops', float('nan')):.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the measured record (JSON) goes")
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--render", help="a record written before: render it as Markdown, measure nothing")
    parser.add_argument("--report", help="where --render's Markdown goes")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            text = render(json.load(f), args.render)
        with open(args.report, "w") as f:
            f.write(text)
        return
    try:
        from vllm import _custom_ops as ops
    except ImportError:
        ops = None
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,power.limit,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    rows = []
    for m in args.tokens:
        rows.append(measure(m, ops))
        print(json.dumps(rows[-1]), flush=True)
    record = {
        "gpu": smi,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/device/fp8_gemm_scaling.py --out " + args.out,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "vllm_ops": ops is not None,
        "layer": [list(x) for x in LAYER],
        "reps_in_graph": REPS_IN_GRAPH,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
