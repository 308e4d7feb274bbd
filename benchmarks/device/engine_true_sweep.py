"""vLLM as it serves shapes outside the step model's fit (GPU): random-weight checkpoints of real shapes exported by
the advisor (all-BF16, all-FP8), each served once by vLLM in a process of its own (the advisor's serving: prefix
caching off, the export's options, the fast meter) and metered at a sweep of batches (512 tokens in, 256 out): J per
output token, TPOT and TTFT (p50, p90) and tokens/s per batch. In the same engine, each TPOT objective (8, 12 and
20 ms) is searched as ``advisor verify`` searches it: from the largest batch the vLLM step model predicts on this
GPU, smaller batches after a miss, a larger one after a batch that met with room to spare. The rows are the served
side of reports/benchmarks/engine_true.md's section on shapes outside the fit; the predicted side is priced on the
CPU from the same shapes.

    python3 benchmarks/device/engine_true_sweep.py --shapes qwen2.5-7b --work /tmp/s44/et --out et.json
    # then, on the CPU, every row and objective against the shipped step profile of that GPU kind:
    python benchmarks/engine_true/vllm_step_fit.py --gpu h200 --input et.json \
        --check advisor/energy/profiles/vllm/h200.json --report reports/benchmarks/engine_true_heldout_h200
    # and that check's JSON added to benchmarks/engine_true/heldout_served.py's CHECKS, which sums them up there

The MoE (``qwen3-30b-a3b``, an H200) is 61 GB in BF16 and 31 GB in FP8 against a lent machine's 64 GB disk: sweep
one plan a call (``--plans all-fp8``, then ``--plans all-bf16 --work /dev/shm/et``), each call's checkpoint removed
after it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCHES = (16, 32, 64, 128, 192, 256)
OBJECTIVES_MS = (8.0, 12.0, 20.0)
MAX_CONCURRENCY = 1024  # the service's bound on each objective's batch (benchmarks/device/verify_time_8b.yaml's)


def objective_searches(shape: Any, config: Any, plan: Any, kind: str, margin: float | None = None) -> list[Any]:
    """Per TPOT objective, the batch search ``advisor verify`` runs, from the operating point the vLLM step model
    (the shipped profile of GPU kind ``kind``) predicts for ``plan`` (``margin``: another TPOT margin than the
    model's own, to see what it would have predicted)."""
    from advisor.energy.prediction import as_served, make_predicted_model
    from advisor.formats import GPU, GPU_SPECS
    from advisor.recipe.schema import Workload
    from advisor.search.measured import BatchSearch, step_up_ceiling
    from advisor.search.operating import operating_point

    gpu = GPU(kind)
    model = as_served(make_predicted_model(shape, gpu, model_config=config), shape, gpu, "vllm")
    if margin is not None:
        model.tpot_margin = margin
    out = []
    for ms in OBJECTIVES_MS:
        w = Workload(name=f"tpot{ms:g}", batch_size=1, input_tokens=512, output_tokens=256, tpot_ms=ms,
                     max_concurrency=MAX_CONCURRENCY)
        op = operating_point(model, shape, GPU_SPECS[gpu], plan, w, "predicted (vLLM step model)")
        out.append(BatchSearch(w, op.state.batch, op.curve, predicted=op.to_dict(),
                               step_up_to=step_up_ceiling(op.state.batch)))
    return out


@cache
def shape_and_plans(name: str) -> tuple[Any, Any, dict[str, Any]]:
    """(config, the advisor's shape of it, the standard plans) of the named published shape."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm_verify import standard_plans

    from advisor.models.groups import model_shape

    config = shape_config(name)
    with torch.device("meta"):
        shape = model_shape(AutoModelForCausalLM.from_config(config))
    return config, shape, standard_plans(shape.groups, [g.name for g in shape.groups])


def predicted_batches(name: str, plan_name: str, kind: str, margin: float | None = None) -> dict[str, int]:
    """Per TPOT objective, the operating batch this code's vLLM step model predicts for the shape and plan (CPU)."""
    config, shape, plans = shape_and_plans(name)
    return {s.workload.name: s.predicted_batch
            for s in objective_searches(shape, config, plans[plan_name], kind, margin)}


def serve_and_search(path: Path, vocab: int, plan: Any, batches: list[int], searches: list[Any]) -> dict[str, Any]:
    """One engine for ``path``: the fixed ``batches`` (workloads ``b{N}``) and each search's rounds."""
    from advisor.deploy.vllm import STEADY_LOAD_METER, ServeJob, VllmEnergyModel
    from advisor.recipe.schema import Workload
    from advisor.search.measured import search_batches

    fixed = [Workload(name=f"b{b}", batch_size=b, input_tokens=512, output_tokens=256) for b in batches]
    # sized as verify sizes a plan's engine: a step up stays under the largest batch served anyway (an FP8 8B engine
    # sized 300 served batches 80-240 6-11% slower than one sized 240: reports/benchmarks/verify_time.md, round 3)
    ceiling = max([*batches, *(s.predicted_batch for s in searches)])
    searches = [replace(s, step_up_to=min(s.step_up_to, ceiling)) for s in searches]
    job = ServeJob(str(path), vocab_size=vocab, workloads=tuple(w.model_dump() for w in [*fixed, *(s.first() for s in
                   searches)]), formats=False, prefill=False, meter=asdict(STEADY_LOAD_METER), max_batch=ceiling,
                   llm_options={"skip_tokenizer_init": True})  # the random checkpoints carry no tokenizer
    tier = VllmEnergyModel(lambda _plan: path, [], vocab, meter=STEADY_LOAD_METER)
    tier.open_with(plan, job)
    found = search_batches(tier, plan, searches)
    return {**tier.served(plan), "max_num_seqs": ceiling,
            "searches": {s.workload.name: f for s, f in zip(searches, found, strict=True)}}


def batch_rows(energy: dict[str, Any]) -> dict[str, Any]:
    """Every metered batch once, as ``b{N}`` (a search's batch the sweep also metered is kept as the sweep's)."""
    out: dict[str, Any] = {}
    for name, r in energy.items():
        if r.get("same_load_as"):
            continue
        key = name if name.startswith("b") and name[1:].isdigit() else f"b{name.rsplit(' at batch ', 1)[-1]}"
        if key not in out:
            out[key] = {k: r.get(k) for k in ("j_per_token", "tokens_per_s", "tpot_ms_p50", "tpot_ms_p90",
                                              "ttft_ms_p50", "ttft_ms_p90", "batch_full", "gpu_busy_pct",
                                              "other_gpus_busy_pct")} | {
                "cv": r["measurement"]["cv"], "unstable": r["measurement"]["unstable"],
                "starved_windows": r["measurement"].get("starved_windows", 0)}
    return out




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
    if name == "qwen3-4b":  # issue 57's 4B-class case (verify_time.sh, step Q)
        from transformers import Qwen3Config

        return Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                           max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                           architectures=["Qwen3ForCausalLM"])
    if name == "mistral-7b-v0.3":
        return MistralConfig(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=None,
                             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5,
                             architectures=["MistralForCausalLM"])
    if name == "gemma-2-9b":  # google/gemma-2-9b-it's config.json: 256-wide heads, soft-capping, a 256k vocabulary
        from transformers import Gemma2Config

        return Gemma2Config(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                            attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rope_theta=10000.0,
                            rms_norm_eps=1e-6, architectures=["Gemma2ForCausalLM"])
    if name == "phi-3-mini":  # microsoft/Phi-3-mini-4k-instruct's config.json: 32 key-value heads (no GQA), fused qkv
        from transformers import Phi3Config

        return Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                          original_max_position_embeddings=4096, sliding_window=2047, rope_theta=10000.0,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000,
                          pad_token_id=32000, architectures=["Phi3ForCausalLM"])
    published = {"qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3MoeForCausalLM"),  # the MoE held out
                 "qwen3-8b": ("Qwen/Qwen3-8B", "Qwen3ForCausalLM")}  # ML.ENERGY's held-out Qwen3-8B, served here
    if name in published:  # their published values, kept in one place
        import transformers

        here = str(Path(__file__).resolve().parents[1] / "engine_true")  # whatever sys.path held when imported
        if here not in sys.path:
            sys.path.insert(0, here)
        from mlenergy_shapes import MODELS

        model_id, architecture = published[name]
        spec = MODELS[model_id]
        assert spec is not None
        cls, values = spec
        return getattr(transformers, cls)(**{**values, "max_position_embeddings": 40960,
                                             "architectures": [architecture]})
    raise SystemExit(f"unknown shape {name}")


def build_shape(name: str, plan_names: list[str], root: Path, device: str) -> dict[str, Path]:
    """The shape's checkpoints (:func:`main` builds them on a GPU in a process of its own)."""
    from vllm_verify import build_checkpoints

    config, _, plans = shape_and_plans(name)
    return build_checkpoints(config, {k: plans[k] for k in plan_names}, root, device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", required=True)
    ap.add_argument("--plans", nargs="+", default=["all-bf16", "all-fp8"])
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="where the random checkpoints are built")
    args = ap.parse_args()
    from advisor.deploy.vllm import STEADY_LOAD_METER
    from advisor.energy.prediction import gpu_here

    kind, gpu_name = gpu_here()
    if kind is None:
        raise SystemExit(f"no GPU the step model has a profile for here ({gpu_name})")
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu_name, "gpu_kind": kind.value,
                           "meter": asdict(STEADY_LOAD_METER), "rows": []}
    for name in args.shapes:
        config, shape, plans = shape_and_plans(name)
        root = Path(args.work) / name
        t = time.perf_counter()
        if args.device == "cuda":  # the GPU memory the build held goes back when its process exits (the MoE's
            # quantized model left 31 GB in this process's caching allocator, and vLLM would not start: 2026-11-30)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                paths = pool.submit(build_shape, name, args.plans, root, args.device).result()
        else:
            paths = build_shape(name, args.plans, root, args.device)
        print(f"{name}: exported in {time.perf_counter() - t:.0f} s", flush=True)
        for plan_name, path in paths.items():
            t = time.perf_counter()
            try:
                searches = objective_searches(shape, config, plans[plan_name], kind.value)
                answer = serve_and_search(path, config.vocab_size, plans[plan_name], args.batches, searches)
            except Exception as exc:  # noqa: BLE001 (a shape vLLM cannot serve is a finding)
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            row = {"shape": name, "plan": plan_name, "wall_s": time.perf_counter() - t,
                   "vllm_version": answer.get("vllm_version"), "llm_options": answer.get("llm_options"),
                   "max_num_seqs": answer.get("max_num_seqs"),
                   "timings_s": answer.get("timings_s"), "error": answer.get("error"),
                   "batches": batch_rows(answer.get("energy") or {}),
                   "objectives": {k: {"predicted_batch": f["predicted_batch"], "batch": f["batch"], "meets": f["meets"],
                                      "tpot_ms": f["tpot_ms"], "j_per_token": f["j_per_token"],
                                      "prediction_error_pct": f.get("prediction_error_pct"), "search": f["search"],
                                      "trail": f["trail"]}
                                  for k, f in (answer.get("searches") or {}).items()}}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            Path(args.out).write_text(json.dumps(out, indent=2))
        shutil.rmtree(root, ignore_errors=True)  # the disk holds a few 7B checkpoints at most


if __name__ == "__main__":
    main()
