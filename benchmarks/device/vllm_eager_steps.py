"""A prompt's step in vLLM 0.26 with its CUDA graph and without it, at several depths of one width (``--layers``).

vLLM runs a step whose token count exceeds its largest captured CUDA-graph size without a graph (the compiled code,
launched kernel by kernel). The vLLM step model prices that as launches per layer added to the device's time
(``eager_us_per_layer``, 312 us fitted on three H100 rows of the 8B). Added, a 70B's 80 layers cost 25 ms on every
step a prompt joins under vLLM's default graph bound, and ML.ENERGY's 70B and 405B rows over several GPUs come out
slower the larger the batch (reports/benchmarks/engine_true.md). Overlapped (the host launches while the GPU works),
a long step hides them. This measures which: the time of ``generate`` of one prompt of L tokens and one output token
(one prefill step, and the request's own overhead), median of several, in an engine that captures graphs up to
4096 tokens (the step runs PIECEWISE) and in one that captures up to 32 (it runs without a graph), with the same
random weights' shape (vLLM's ``dummy`` load). Per layer, the difference is what running without a graph costs:

* constant in L and proportional to the layers: launches added to the device's time;
* shrinking to nothing as L grows: launches hidden under the device's work;
* growing with L: the uncaptured pass's own device cost (unfused kernels).

``--prompts N ...`` times N prompts of 512 tokens in one step instead; ``--served IN_FLIGHT`` serves 320 requests
by continuous batching with the prompt steps captured and not, and times the whole.

    python3 benchmarks/device/vllm_eager_steps.py --out eager_steps.json      # GPU and vLLM on the path
    python3 benchmarks/device/vllm_eager_steps.py --render eager_steps.json --report reports/benchmarks/x  # no GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Llama-3.1-8B's width; the depth is what varies
WIDTH = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
             hidden_act="silu", tie_word_embeddings=False, torch_dtype="bfloat16", architectures=["LlamaForCausalLM"],
             model_type="llama")
LAYERS = (32, 64)
LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
#: ``--prompts``: N prompts of this many tokens in one step (a wave of requests admitted together)
WAVE_LENGTH = 512
GRAPHS = {"captured": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
          "uncaptured": [1, 2, 4, 8, 16, 32]}


def engine_run(layers: int, mode: str, reps: int, prompts: tuple[int, ...] = ()) -> dict[str, Any]:
    """In this process: one engine; each case (one prompt of each of :data:`LENGTHS`, or ``prompts`` prompts of
    :data:`WAVE_LENGTH` together) timed ``reps`` times after two warm-ups."""
    from vllm import LLM, SamplingParams

    cases = [(n, WAVE_LENGTH) for n in prompts] or [(1, n) for n in LENGTHS]
    tokens = max(n * length for n, length in cases)
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps({**WIDTH, "num_hidden_layers": layers}))
    started = time.perf_counter()
    sizes = [s for s in GRAPHS[mode] if s <= tokens]
    llm = LLM(model=str(folder), load_format="dummy", skip_tokenizer_init=True, max_num_seqs=16,
              max_num_batched_tokens=tokens, max_model_len=max(length for _, length in cases) + 16,
              enable_prefix_caching=False, gpu_memory_utilization=0.85,
              compilation_config={"cudagraph_capture_sizes": sizes})
    start_s = time.perf_counter() - started
    params = SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False)
    out = {}
    for count, length in cases:
        batch = [{"prompt_token_ids": [(7 * i + 13 * j + length) % 32000 + 1 for i in range(length)]}
                 for j in range(count)]
        times = []
        for k in range(reps + 2):
            t = time.perf_counter()
            llm.generate(batch, params, use_tqdm=False)
            if k >= 2:
                times.append(1e3 * (time.perf_counter() - t))
        key = str(length) if not prompts else f"{count}x{length}"
        out[key] = {"median_ms": statistics.median(times), "min_ms": min(times), "ms": times}
    return {"layers": layers, "mode": mode, "capture_sizes": sizes, "engine_start_s": start_s, "lengths": out}


#: ``--served``: requests in flight, requests in all, and the graph sizes of its two engines (vLLM's default bound
#: for 64 in flight, min(2 x 64, 512) = 128, leaves a prompt's step uncaptured; the other captures up to the budget)
SERVED_REQUESTS = 320
SERVED_BUDGET = 2048
SERVED_GRAPHS = {"captured": [1, 2, 4, *range(8, 256, 8), *range(256, SERVED_BUDGET + 1, 256)],
                 "uncaptured": [1, 2, 4, *range(8, 129, 8)]}


def served_run(layers: int, mode: str, in_flight: int) -> dict[str, Any]:
    """In this process: continuous batching of :data:`SERVED_REQUESTS` prompts of 512 tokens with 128-384 output
    tokens (spread, so that prompts join running decodes a few at a time), ``in_flight`` at most; output tokens/s
    over the whole run, after a warm-up run."""
    from vllm import LLM, SamplingParams

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps({**WIDTH, "num_hidden_layers": layers}))
    started = time.perf_counter()
    llm = LLM(model=str(folder), load_format="dummy", skip_tokenizer_init=True, max_num_seqs=in_flight,
              max_num_batched_tokens=SERVED_BUDGET, max_model_len=1024, enable_prefix_caching=False,
              gpu_memory_utilization=0.85, compilation_config={"cudagraph_capture_sizes": SERVED_GRAPHS[mode]})
    start_s = time.perf_counter() - started
    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 32000 + 1 for i in range(WAVE_LENGTH)]}
               for j in range(SERVED_REQUESTS)]
    params = [SamplingParams(max_tokens=128 + (97 * j) % 257, ignore_eos=True, detokenize=False)
              for j in range(SERVED_REQUESTS)]
    llm.generate(prompts[:in_flight], params[:in_flight], use_tqdm=False)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    tokens = sum(p.max_tokens for p in params)
    return {"layers": layers, "mode": mode, "capture_sizes": SERVED_GRAPHS[mode], "engine_start_s": start_s,
            "served": {"in_flight": in_flight, "requests": SERVED_REQUESTS, "output_tokens": tokens, "wall_s": wall,
                       "tokens_per_s": tokens / wall}}


def collect(out: Path, reps: int, depths: tuple[int, ...] = LAYERS, prompts: tuple[int, ...] = (),
            served: int = 0) -> None:
    import torch
    import vllm

    rows = []
    for layers in depths:
        for mode in GRAPHS:  # one engine a process: vLLM keeps its memory after the engine is gone
            r = subprocess.run([sys.executable, __file__, "--one", str(layers), mode, "--reps", str(reps),
                                *(["--prompts", *map(str, prompts)] if prompts else []),
                                *(["--served", str(served)] if served else [])],
                               capture_output=True, text=True)
            line = [x for x in r.stdout.splitlines() if x.startswith("{")]
            rows.append(json.loads(line[-1]) if r.returncode == 0 and line
                        else {"layers": layers, "mode": mode, "error": r.stderr[-2000:]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "lengths"}), flush=True)
    gpu = torch.cuda.get_device_name(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()
    out.write_text(json.dumps({"gpu": gpu, "driver": smi[0] if smi else "unknown", "vllm_version": vllm.__version__,
                               "torch": torch.__version__, "date": datetime.datetime.now(datetime.UTC).isoformat(),
                               "command": " ".join(["python3", *sys.argv]), "width": WIDTH, "rows": rows}, indent=1))


def _tokens(key: str) -> int:
    """The prompt tokens of a case's key: "512", or "4x512" (four prompts of 512 in one step)."""
    count, _, length = key.rpartition("x")
    return int(count or 1) * int(length)


def render(paths: list[str], report: Path) -> None:
    """The report: per depth and prompt length, the step with and without its graph, and the difference per layer."""
    data = [json.loads(Path(p).read_text()) for p in paths]
    first = data[0]
    lines = [f"# A prompt's step in vLLM {first['vllm_version']} with its CUDA graph and without ({first['gpu']})", "",
             f"GPU: {first['gpu']}. Driver: {first['driver']}. Date: {first['date'][:10]} (each run's below). vLLM: "
             f"{first['vllm_version']}, torch {first['torch']}.", "",
             f"Command: `python {' '.join(sys.argv)}` (renders the runs below, each measured on the GPU by the command "
             "it names)", "",
             *[para.replace("\n", " ").replace(" * ", "\n* ") + "\n" for para in (__doc__ or "").split("\n\n")[1:3]],
             "Runs: " + "; ".join(f"{i}: {d['date'][:16]} UTC, `{d['command']}`" for i, d in enumerate(data, 1)), "",
             "| run | layers | prompt tokens | with its graph, ms | without, ms | difference, ms | per layer, us |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for i, d in enumerate(data, 1):
        by = {(r["layers"], r["mode"]): r for r in d["rows"] if "lengths" in r}
        for layers in sorted({r["layers"] for r in d["rows"]}):
            cap, unc = by.get((layers, "captured")), by.get((layers, "uncaptured"))
            if not (cap and unc):
                continue
            for n in sorted(cap["lengths"], key=_tokens):
                a, b = cap["lengths"][n]["median_ms"], unc["lengths"][n]["median_ms"]
                summary.setdefault(f"run {i}, {layers} layers", {})[n] = 1e3 * (b - a) / layers
                lines.append(f"| {i} | {layers} | {n} | {a:.2f} | {b:.2f} | {b - a:+.2f} | "
                             f"{1e3 * (b - a) / layers:+.0f} |")
    served = [(i, r) for i, d in enumerate(data, 1) for r in d["rows"] if "served" in r]
    if served:
        lines += ["", "Served (continuous batching in vLLM's `LLM`: the requests in flight decode while new prompts "
                  "join their steps; prompt steps captured, or left to vLLM's default graph bound and run without a "
                  "graph):", "", "| run | layers | graphs | in flight | requests | output tokens | s | tokens/s |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|"]
        for i, r in served:
            v = r["served"]
            lines.append(f"| {i} | {r['layers']} | {r['mode']} (up to {max(r['capture_sizes'])}) | {v['in_flight']} | "
                         f"{v['requests']} | {v['output_tokens']} | {v['wall_s']:.2f} | {v['tokens_per_s']:.0f} |")
    lines += ["", "Each time is the median of `generate` of the prompts and one output token each (one prefill step "
              "and the requests' own overhead, the same in both engines); engine starts: " + ", ".join(
                  f"{r['layers']} layers {r['mode']} {r['engine_start_s']:.0f} s" for d in data for r in d["rows"]
                  if "engine_start_s" in r) + "."]
    report.with_suffix(".md").write_text("\n".join(lines) + "\n")
    report.with_suffix(".json").write_text(json.dumps({"sources": paths, "per_layer_us": summary, "data": data},
                                                      indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--out", type=Path)
    a.add_argument("--reps", type=int, default=8)
    a.add_argument("--layers", type=int, nargs="+", default=list(LAYERS), help="the depths, in the order measured")
    a.add_argument("--prompts", type=int, nargs="+", default=[],
                   help=f"time N prompts of {WAVE_LENGTH} tokens in one step instead of one prompt of each length")
    a.add_argument("--served", type=int, default=0, metavar="IN_FLIGHT",
                   help="serve many requests (continuous batching) and time the whole instead")
    a.add_argument("--one", nargs=2, metavar=("LAYERS", "MODE"), help=argparse.SUPPRESS)
    a.add_argument("--render", nargs="+")
    a.add_argument("--report", type=Path, default=Path("reports/benchmarks/vllm_eager_steps_h200"))
    args = a.parse_args(argv)
    if args.one:
        layers, mode = int(args.one[0]), args.one[1]
        row = (served_run(layers, mode, args.served) if args.served
               else engine_run(layers, mode, args.reps, tuple(args.prompts)))
        print(json.dumps(row), flush=True)
    elif args.render:
        render(args.render, args.report)
    elif args.out:
        collect(args.out, args.reps, tuple(args.layers), tuple(args.prompts), args.served)
    else:
        a.error("--out (measure) or --render")


if __name__ == "__main__":
    main()
