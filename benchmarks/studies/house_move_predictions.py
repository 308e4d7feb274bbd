"""Predicted J/token of every predicted tier over the shipped shapes (before/after the energy move).

Run in a checkout: PYTHONPATH=$PWD python benchmarks/studies/house_move_predictions.py > out.txt
(issue 37: it finds each name in the new wings or the old flat modules, so it runs on both sides of the move)
With ``--engine vllm`` every model is priced as vLLM serves the plans (issue 56: the vLLM step model over the
same tiers, ``advisor.energy.prediction.as_served``), the predicted tier a search uses when vLLM serves them.
"""
# ruff: noqa: E402  (settings before the imports they affect; old and new module names tried in turn)
import importlib
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
os.environ["ADVISOR_PROFILE_DIR"] = tempfile.mkdtemp()  # no user profile
import logging

logging.disable(logging.CRITICAL)


def imp(name, *modules):
    for m in modules:
        try:
            return getattr(importlib.import_module(m), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"{name} from {modules}")


make_predicted_model = imp("make_predicted_model", "advisor.energy.prediction", "advisor.energy.select")
ModelProfileCostModel = imp("ModelProfileCostModel", "advisor.energy.prediction", "advisor.energy.model_costmodel")
GpuProfileCostModel = imp("GpuProfileCostModel", "advisor.energy.prediction", "advisor.energy.gpu_costmodel")
ProfileCostModel = imp("ProfileCostModel", "advisor.energy.prediction", "advisor.energy.costmodel")
RooflineEnergyModel = imp("RooflineEnergyModel", "advisor.energy.prediction", "advisor.energy.roofline")
REFERENCE_SHAPES = imp("REFERENCE_SHAPES", "advisor.energy.profiling", "advisor.energy.reference_shapes")
shipped_model_profiles = imp("shipped_model_profiles", "advisor.energy.profiling", "advisor.energy.profile_store")
shipped_gpu_profile = imp("shipped_gpu_profile", "advisor.energy.profiling", "advisor.energy.profile_select")
shipped_profile = imp("shipped_profile", "advisor.energy.profiling", "advisor.energy.profile")

import json

from advisor.formats import GPU, Format
from advisor.plan import Plan
from advisor.recipe.schema import Workload

WORKLOADS = [Workload(name="b1", batch_size=1, input_tokens=512, output_tokens=256),
             Workload(name="b16", batch_size=16, input_tokens=512, output_tokens=256),
             Workload(name="b64", batch_size=64, input_tokens=2048, output_tokens=128),
             Workload(name="b128", batch_size=128, input_tokens=512, output_tokens=512)]


def plans(shape):
    names = [g.name for g in shape.groups]
    quarter = shape.num_layers // 4
    out = {f"all-{f.value}": Plan.uniform(names, f) for f in (Format.BF16, Format.FP8, Format.NVFP4)}
    out["mlp-fp8"] = Plan({n: Format.FP8 if n.rsplit(".", 1)[-1] in ("gate_up", "down", "experts") else Format.BF16
                           for n in names})
    out["first-quarter-bf16"] = Plan({n: Format.BF16 if int(n.split("layers.")[1].split(".")[0]) < quarter
                                      else Format.FP8 for n in names})
    out["fp8-kv"] = Plan.uniform(names, Format.FP8, kv_cache=Format.FP8)
    return out


ENGINE = sys.argv[sys.argv.index("--engine") + 1] if "--engine" in sys.argv else "builtin"


def show(tag, model, shape, gpu):
    if ENGINE != "builtin":
        from advisor.energy.prediction import as_served

        model = as_served(model, shape, gpu, ENGINE)
    print(f"## {tag}: {model.label}")
    for pname, plan in plans(shape).items():
        for w in WORKLOADS:
            try:
                e = model.estimate(plan, w)
                print(f"{tag} | {pname} | {w.name} | {e.j_per_token!r} {e.decode_j_per_token!r} "
                      f"{e.prefill_j_per_input_token!r} {e.decode_tokens_per_s!r} | {e.source}")
            except Exception as exc:  # noqa: BLE001
                print(f"{tag} | {pname} | {w.name} | {type(exc).__name__}: {exc}")


# 1. every shipped per-model profile, on its own shape
moe_config = None
for path in sorted(shipped_model_profiles().glob("*/*/*.json")):
    data = json.loads(path.read_text())
    fam = data["model"]["family"]
    if fam in REFERENCE_SHAPES:
        shape = REFERENCE_SHAPES[fam].shape()
    else:
        import torch
        import transformers

        from advisor.models.adapters.geometry import model_shape
        sys.path.insert(0, "tests")
        from test_model_profile_moe import QWEN3_30B_A3B
        moe_config = transformers.Qwen3MoeConfig(**QWEN3_30B_A3B)
        with torch.device("meta"):
            shape = model_shape(transformers.AutoModelForCausalLM.from_config(moe_config))
    show(f"per-model {data['gpu_kind']} {fam}", ModelProfileCostModel({**data, "shipped": True}, shape), shape,
         GPU(data["gpu_kind"]))

# 2. GPU profiles, layer profiles, roofline, and the selection chain, on every reference shape
for gpu in (GPU.H100, GPU.H200, GPU.B200):
    gp = shipped_gpu_profile(gpu)
    lp = shipped_profile(gpu)
    for name, ref in REFERENCE_SHAPES.items():
        shape = ref.shape()
        if gp is not None:
            show(f"gpu-profile {gpu.value} {name}", GpuProfileCostModel(gp, shape), shape, gpu)
        if lp is not None:
            try:
                show(f"layer-profile {gpu.value} {name}", ProfileCostModel(lp, shape), shape, gpu)
            except Exception as exc:  # noqa: BLE001
                print(f"layer-profile {gpu.value} {name}: {type(exc).__name__}: {exc}")
        show(f"roofline {gpu.value} {name}", RooflineEnergyModel(shape, gpu), shape, gpu)
        show(f"selected {gpu.value} {name}", make_predicted_model(shape, gpu), shape, gpu)
        show(f"selected-shape-only {gpu.value} {name}", make_predicted_model(shape, gpu, per_model=False), shape, gpu)

# 3. real family configs through the adapters (selection chain with model_config)
import torch
import transformers

from advisor.models.adapters.geometry import model_shape

CONFIGS = {
    "qwen3-moe": moe_config,
    "gemma3-tiny": transformers.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
                                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                                 vocab_size=262144, sliding_window=512),
    "qwen3-small": transformers.Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                                            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                            vocab_size=151936),
    "phi3-small": transformers.Phi3Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                                          num_attention_heads=16, num_key_value_heads=16, vocab_size=32064),
    "llama-1b": transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                         vocab_size=128256, tie_word_embeddings=True, rope_theta=5e5,
                                         max_position_embeddings=131072, rms_norm_eps=1e-5,
                                         rope_scaling={"factor": 32.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192,
                                                       "rope_type": "llama3"}),
}
for cname, cfg in CONFIGS.items():
    if cfg is None:
        continue
    with torch.device("meta"):
        shape = model_shape(transformers.AutoModelForCausalLM.from_config(cfg))
    for gpu in (GPU.H100, GPU.H200, GPU.B200):
        show(f"config {gpu.value} {cname}", make_predicted_model(shape, gpu, model_config=cfg), shape, gpu)
