"""vLLM as it serves shapes outside the step model's fit (GPU): random-weight checkpoints of real shapes exported by
the advisor (all-BF16, all-FP8), each served once by vLLM in a process of its own (the advisor's serving: prefix
caching off, the export's options, the fast meter) and metered at a sweep of batches (512 tokens in, 256 out): J per
output token, TPOT and TTFT (p50, p90) and tokens/s per batch. The rows are the served side of
reports/benchmarks/engine_true.md; the predicted side is priced on the CPU from the same shapes.

    python3 benchmarks/device/engine_true_sweep.py --shapes qwen2.5-7b --work /tmp/s44/et --out et.json

The MoE (``qwen3-30b-a3b``, an H200) is 61 GB in BF16 and 31 GB in FP8 against a lent machine's 64 GB disk: sweep
one plan a call (``--plans all-fp8``, then ``--plans all-bf16 --work /dev/shm/et``), each call's checkpoint removed
after it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCHES = (16, 32, 64, 128, 192, 256)


def shape_config(name: str) -> Any:
    """The published configs' geometry (their config.json files), random weights."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    if name == "llama-3.2-3b":
        return LlamaConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                           num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                           max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                           architectures=["LlamaForCausalLM"])
    if name == "qwen2.5-7b":
        return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                           num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                           rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                           architectures=["Qwen2ForCausalLM"])
    if name == "mistral-7b-v0.3":
        return MistralConfig(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=None,
                             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5,
                             architectures=["MistralForCausalLM"])
    if name == "qwen3-30b-a3b":  # the MoE held out of the fit: Qwen3-30B-A3B's published values, kept in one place
        import transformers
        from engine_true.mlenergy_shapes import MODELS

        spec = MODELS["Qwen/Qwen3-30B-A3B-Instruct-2507"]
        assert spec is not None
        cls, values = spec
        return getattr(transformers, cls)(**{**values, "max_position_embeddings": 40960,
                                             "architectures": ["Qwen3MoeForCausalLM"]})
    raise SystemExit(f"unknown shape {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--plans", nargs="+", default=["all-bf16", "all-fp8"])
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from vllm_verify import build_checkpoints, standard_plans

    from advisor.deploy.vllm import STEADY_LOAD_METER, ServeJob, run_in_child
    from advisor.models.groups import model_shape

    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "meter": asdict(STEADY_LOAD_METER), "rows": []}
    for name in args.shapes:
        config = shape_config(name)
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            shape = model_shape(AutoModelForCausalLM.from_config(config))
        plans = standard_plans(shape.groups, [g.name for g in shape.groups])
        root = Path(args.work) / name
        t = time.perf_counter()
        paths = build_checkpoints(config, {k: plans[k] for k in args.plans}, root, "cuda")
        print(f"{name}: exported in {time.perf_counter() - t:.0f} s", flush=True)
        for plan_name, path in paths.items():
            workloads = tuple({"name": f"b{b}", "batch_size": b, "input_tokens": 512, "output_tokens": 256}
                              for b in args.batches)
            job = ServeJob(str(path), vocab_size=config.vocab_size, workloads=workloads, formats=False, prefill=False,
                           meter=asdict(STEADY_LOAD_METER))
            t = time.perf_counter()
            try:
                answer = run_in_child(job)
            except Exception as exc:  # noqa: BLE001 (a shape vLLM cannot serve is a finding)
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            row = {"shape": name, "plan": plan_name, "wall_s": time.perf_counter() - t,
                   "vllm_version": answer.get("vllm_version"), "llm_options": answer.get("llm_options"),
                   "timings_s": answer.get("timings_s"), "error": answer.get("error"),
                   "batches": {w: {k: r.get(k) for k in ("j_per_token", "tokens_per_s", "tpot_ms_p50", "tpot_ms_p90",
                                                         "ttft_ms_p50", "ttft_ms_p90", "batch_full")}
                               | {"cv": r["measurement"]["cv"], "unstable": r["measurement"]["unstable"]}
                               for w, r in (answer.get("energy") or {}).items()}}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
        shutil.rmtree(root, ignore_errors=True)  # the disk holds a few 7B checkpoints at most


if __name__ == "__main__":
    main()
