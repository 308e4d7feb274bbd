"""The memory plan from a config alone: Llama-3.1-70B and Qwen3-235B-A22B on 1-8 H100s and H200s against
bytes computed by hand here, and `advisor search --dry-run` on a folder that holds only a config."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.models.memory_plan import (
    BUILD_BYTES_PER_WEIGHT,
    GIB,
    RESERVED_PER_DEVICE,
    RunSizes,
    bank_entry_bytes,
    compact,
    gpus,
    plan_memory,
)

# The published config.json values (meta-llama/Llama-3.1-70B, Qwen/Qwen3-235B-A22B).
LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 94, "mlp_only_layers": [], "moe_intermediate_size": 1536,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 94, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}
# The default recipe's token counts, all three formats (the worst case), no lm-eval tasks.
SIZES = RunSizes(("bf16", "fp8", "nvfp4"), calibration_samples=16, calibration_seq=128, heldout_samples=8,
                 heldout_seq=128, sensitivity_samples=4, lm_eval=False)
H100, H200 = 80 * GIB, 141 * GIB

# ---- Llama-3.1-70B by hand
# per layer: q 8192x8192 + k, v 8192x1024 + o 8192x8192 + gate, up, down 8192x28672
L_LINEARS = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672
assert L_LINEARS == 855_638_016
L_LAYER_BF16 = 2 * (L_LINEARS + 2 * 8192)  # two RMSNorms of 8192
L_EMBED = 2 * 128256 * 8192  # embed_tokens; lm_head (untied) is as large
L_WEIGHTS = 80 * L_LAYER_BF16 + 2 * L_EMBED + 2 * 8192  # + the final norm
assert L_WEIGHTS == 141_107_412_992  # 70.55B parameters
L_FP8 = 80 * (L_LINEARS + 7 * 256 * 2)  # a byte a weight + 256 BF16 values per linear (7 a layer)
L_NVFP4 = 80 * (L_LINEARS // 2 + L_LINEARS // 16 + 7 * 4)  # half a byte + an FP8 scale per 16 + a float32 per linear
assert (L_FP8, L_NVFP4) == (68_451_328_000, 38_503_712_960)
L_PROXY_LOGITS = 4 * 128 * 128256 * (2 + 4 + 4)  # 4 held-out rows of 128 tokens: BF16 logits, float32, log-softmax
# the largest linear: its own copy, NVFP4's pre-fold copy, the decoded check (BF16 each) and the check's mask; then
# its float32 fold and packing, one view (a linear's whole weight) at a time
L_BUILD = 8192 * 28672 * (3 * 2 + 1) + 8192 * 28672 * BUILD_BYTES_PER_WEIGHT

# ---- Qwen3-235B-A22B by hand
Q_ATTN = 4096 * 8192 + 2 * 4096 * 512 + 8192 * 4096  # q (64 heads x 128), k, v (4 x 128), o
Q_EXPERTS = 128 * 3 * 4096 * 1536  # gate, up, down of 128 experts
Q_LINEARS = Q_ATTN + Q_EXPERTS
assert Q_LINEARS == 2_487_222_272
Q_LAYER_BF16 = 2 * (Q_LINEARS + 2 * 4096 + 2 * 128 + 128 * 4096)  # norms, q/k norms, router
Q_WEIGHTS = 94 * Q_LAYER_BF16 + 2 * 2 * 151936 * 4096 + 2 * 4096
assert Q_WEIGHTS == 470_187_269_120  # 235.09B parameters
Q_VIEWS = 4 + 2 * 128  # q, k, v, o; each expert's slice of gate_up and of down
Q_FP8 = 94 * (Q_LINEARS + Q_VIEWS * 512)
Q_NVFP4 = 94 * (Q_LINEARS // 2 + Q_LINEARS // 16 + Q_VIEWS * 4)
assert (Q_FP8, Q_NVFP4) == (233_811_406_848, 131_511_975_392)
# the largest member is the 128 experts' fused gate_up (copied, checked and masked whole); fold and packing take
# whole views, at least PACK_CHUNK_WEIGHTS weights a time, here the q_proj's 4096 x 8192 (an expert's is 4096 x 3072)
Q_BUILD = 128 * 4096 * 3072 * (3 * 2 + 1) + 4096 * 8192 * BUILD_BYTES_PER_WEIGHT


def _config(values: dict) -> SimpleNamespace:
    return SimpleNamespace(**values)


def test_bank_entry_widths():
    assert bank_entry_bytes("bf16", 1024, 1) == 0
    assert bank_entry_bytes("fp8", 1024, 1) == 1024 + 512
    assert bank_entry_bytes("nvfp4", 1024, 2) == 512 + 64 + 8


def test_llama_70b_totals_by_hand():
    plan = plan_memory(_config(LLAMA_70B), SIZES, gpus(4, H100), "llama-70b")
    assert plan.totals["weights (BF16)"] == L_WEIGHTS
    assert plan.totals["bank entry fp8"] == L_FP8
    assert plan.totals["bank entry nvfp4"] == L_NVFP4
    assert plan.totals["proxy logits (BF16 + 2x float32)"] == L_PROXY_LOGITS
    assert plan.totals["bank build (largest weight)"] == L_BUILD
    assert plan.cpu_bytes == {"proxy reference log-probs (float32)": (8 + 4) * 128 * 128256 * 4}
    gguf = plan_memory(_config(LLAMA_70B), RunSizes(**{**SIZES.__dict__, "whole_cpu_copy": True}), gpus(4, H100))
    assert gguf.cpu_bytes["loading (whole BF16 model, read then moved)"] == L_WEIGHTS


def test_qwen3_235b_totals_by_hand():
    plan = plan_memory(_config(QWEN3_235B), SIZES, gpus(8, H200), "qwen3-235b")
    assert plan.totals["weights (BF16)"] == Q_WEIGHTS
    assert plan.totals["bank entry fp8"] == Q_FP8
    assert plan.totals["bank entry nvfp4"] == Q_NVFP4
    assert plan.totals["bank build (largest weight)"] == Q_BUILD


def _fewest_by_capacity(total_items: int, workspace: int, memory: int) -> int:
    """The fewest GPUs by bytes alone (every device loses its reserve and workspace); whole layers can need one
    more."""
    usable = memory - RESERVED_PER_DEVICE - workspace
    return -(-total_items // usable)


@pytest.mark.parametrize(("config", "memory", "fits", "fewest"), [
    # Llama-3.1-70B: items = weights 131.4 + FP8 63.8 + NVFP4 35.9 GiB (+ 0.6 records); every device loses
    # 2 GiB reserve + 6.78 GiB bank build: an H100 keeps 71.2 GiB (3 hold 213.7 < 232.3), an H200 132.2 (2: 264.4)
    (LLAMA_70B, H100, {1: False, 2: False, 4: True, 8: True}, 4),
    (LLAMA_70B, H200, {1: False, 2: True, 4: True, 8: True}, 2),
    # Qwen3-235B-A22B: 437.9 + 217.8 + 122.5 GiB; per layer 8.26 GiB; every device loses 2 GiB reserve + 11.3 GiB
    # bank build (the experts' fused gate_up): an H100 keeps 66.7 GiB (8 layers: 94 layers need 12), an H200 127.7
    # (15 layers: 7)
    (QWEN3_235B, H100, {1: False, 2: False, 4: False, 8: False}, 12),
    (QWEN3_235B, H200, {1: False, 2: False, 4: False, 8: True}, 7),
])
def test_fit_on_1_2_4_8_gpus(config, memory, fits, fewest):
    for count, expected in fits.items():
        plan = plan_memory(_config(config), SIZES, gpus(count, memory))
        assert plan.fits is expected, count
        assert plan.smallest_gpus == fewest
        for p in plan.placements:
            assert p.used_bytes <= memory
        placed = [name for p in plan.placements for name in p.items] + plan.overflow
        assert placed[0] == "embeddings" and placed[-1] == "final norm + lm_head"
        assert len(placed) == config["num_hidden_layers"] + 2  # every layer once, in order
        if expected:
            holder = next(p for p in plan.placements if "final norm + lm_head" in p.items)
            assert holder.logits_bytes == max(v for k, v in plan.totals.items() if "logits" in k or "KV" in k)
    total = sum(plan.totals[k] for k in ("weights (BF16)", "bank entry fp8", "bank entry nvfp4",
                                         "sensitivity records"))
    workspace = plan.placements[0].workspace_bytes
    assert _fewest_by_capacity(total, workspace, memory) <= fewest <= _fewest_by_capacity(total, workspace, memory) + 1


def test_balanced_spread_and_compact_names():
    plan = plan_memory(_config(LLAMA_70B), SIZES, gpus(4, H100))
    holds = [compact(p.items) for p in plan.placements]
    assert holds[0][0] == "embeddings" and holds[-1][-1] == "final norm + lm_head"
    loads = [p.weights_bytes + p.bank_bytes for p in plan.placements]
    assert max(loads) - min(loads) < 6 * GIB  # about a quarter each, not the first devices filled up


def test_lm_eval_batches_count_when_tasks_are_given():
    with_tasks = RunSizes(**{**SIZES.__dict__, "lm_eval": True})
    plan = plan_memory(_config(LLAMA_70B), with_tasks, gpus(4, H100))
    assert plan.totals["lm-eval logits (BF16 x2)"] == 16 * 1024 * 128256 * 2 * 2


# ---- advisor search --dry-run

runner = CliRunner()


@pytest.fixture
def config_only(tmp_path):
    folder = tmp_path / "llama-70b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    return folder


@pytest.mark.parametrize(("count", "memory", "code", "verdict"), [
    (1, 80, 0, "streamed from CPU memory"), (2, 80, 0, "streamed from CPU memory"), (4, 80, 0, "fits"),
    # 8 GiB: the reserve, the embeddings and the bank build's workspace alone are more
    (1, 8, 3, "does not fit"),
])
def test_dry_run_on_h100s(config_only, tmp_path, count, memory, code, verdict):
    res = runner.invoke(app, ["search", "--model", str(config_only), "--target", "b200", "--formats",
                              "bf16,fp8,nvfp4", "--out", str(tmp_path / "runs"), "--dry-run", "--gpus", str(count),
                              "--gpu-memory", str(memory)])
    assert res.exit_code == code, res.output
    assert "weights (BF16)" in res.stdout and "131.42" in res.stdout
    assert verdict in res.stdout
    if code:
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "not even with layers streamed" in errors[0]
    else:
        assert "Error" not in res.stderr
    if memory == 80 and count < 4:
        assert "the fewest such GPUs that hold it: 4" in res.stdout
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_dry_run_json(config_only):
    res = runner.invoke(app, ["search", "--model", str(config_only), "--target", "b200", "--formats", "bf16,fp8",
                              "--dry-run", "--gpus", "2", "--gpu-memory", "141", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["fits"] and data["totals_bytes"]["weights (BF16)"] == L_WEIGHTS
    assert [d["device"] for d in data["devices"]] == ["cuda:0", "cuda:1"]


@pytest.mark.parametrize("args", [["--gpus", "2", "--gpu-memory", "80"], ["--dry-run", "--gpus", "2"]])
def test_dry_run_flags_misused(config_only, args):
    res = runner.invoke(app, ["search", "--model", str(config_only), "--target", "b200", *args])
    assert res.exit_code == 2
    assert res.stderr.count("Error:") == 1


# ---- streaming from CPU memory: Qwen2.5-14B (published config values) on one GPU capped at 24 GiB
QWEN25_14B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120,
              "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
              "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
              "tie_word_embeddings": False}


def test_streaming_plan_keeps_the_head_and_streams_the_layers_that_do_not_fit():
    config = _config(QWEN25_14B)
    on_80 = plan_memory(config, SIZES, gpus(1, H100), stream=True)
    assert on_80.fits and not on_80.streaming  # packed, the 14B search holds on one H100
    plan = plan_memory(config, SIZES, gpus(1, 24 * GIB), stream=True)
    assert not plan.fits and plan.streaming and plan.runs
    (gpu,) = plan.placements
    assert gpu.items[0] == "embeddings" and gpu.items[-1] == "final norm + lm_head"
    resident = [int(n.split()[1]) for n in gpu.items if n.startswith("layer ")]
    streamed = [int(n.split()[1]) for n in plan.overflow]
    assert resident + streamed == list(range(48)) and streamed  # the first layers stay, the others stream
    assert gpu.used_bytes <= 24 * GIB
    # by hand: q 5120x5120 (+bias 5120), k, v 5120x1024 (+bias 1024 each), o 5120x5120, gate, up, down 5120x13824
    linears = 2 * 5120 * 5120 + 2 * 5120 * 1024 + 3 * 5120 * 13824
    layer_bf16 = 2 * (linears + 2 * 5120 + 5120 + 2 * 1024)
    layer_bank = bank_entry_bytes("fp8", linears, 7) + bank_entry_bytes("nvfp4", linears, 7)
    assert gpu.stream_buffer_bytes == layer_bf16 + layer_bank
    assert plan.overflow_bytes == len(streamed) * (layer_bf16 + layer_bank)
    assert plan.cpu_bytes["streamed layers (BF16 weights and bank entries)"] == plan.overflow_bytes
    assert plan.to_dict()["streaming"] and plan.smallest_gpus > 1  # the fewest 24 GiB GPUs that hold it all
    assert plan_memory(config, SIZES, gpus(plan.smallest_gpus, 24 * GIB)).fits
    # too little for the embeddings, lm_head, logits and one streamed layer: no plan runs
    assert not plan_memory(config, SIZES, gpus(1, 8 * GIB), stream=True).runs


def test_a_streaming_plan_needs_its_cpu_side_here(monkeypatch):
    import psutil

    from advisor.errors import SetupError
    from advisor.workflows.memory import check_cpu_memory

    plan = plan_memory(_config(QWEN25_14B), SIZES, gpus(1, 24 * GIB), stream=True)
    need = sum(plan.cpu_bytes.values())
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=need - 1))
    with pytest.raises(SetupError, match="streams layers .* from CPU memory"):
        check_cpu_memory(plan)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=need))
    check_cpu_memory(plan)


def test_gpu_memory_cap_with_device_cpu_is_one_error(config_only):
    res = runner.invoke(app, ["search", "--model", str(config_only), "--target", "b200", "--device", "cpu",
                              "--gpu-memory", "24"])
    assert res.exit_code == 2
    assert res.stderr.count("Error:") == 1 and "gpu_memory_gib" in res.stderr


def _header_only_weights(folder) -> None:
    """model.safetensors of the folder's config: the header of every tensor transformers would load, the data a
    sparse hole (141 GB that take no disk: the checks read headers and sizes, never the data)."""
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    header, offset = {}, 0
    for name, tensor in skeleton.state_dict().items():
        end = offset + 2 * tensor.numel()
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def test_a_cpu_search_that_cannot_fit_here_is_refused_before_anything_is_made(config_only, tmp_path, monkeypatch):
    import psutil

    _header_only_weights(config_only)  # the files are present, and agree with the config
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * GIB))
    res = runner.invoke(app, ["search", "--model", str(config_only), "--target", "b200", "--formats", "bf16,fp8",
                              "--device", "cpu", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 3, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "on this CPU" in errors[0] and "64.0 GiB are available" in errors[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("bf16_matmul", "scale"), [(True, 1), (False, 2)])
def test_the_cpu_checks_count_the_weights_in_the_arithmetic_the_cpu_scores_in(tmp_path, monkeypatch, bf16_matmul,
                                                                              scale):
    import psutil

    import advisor.models.arithmetic as arithmetic
    from advisor.errors import SetupError
    from advisor.recipe.schema import ModelSpec, Recipe
    from advisor.workflows.memory import check_cpu_export, check_cpu_search

    folder = tmp_path / "small"  # a 1.1B-parameter Llama: float32 fits a 1 TiB machine's 40% share
    folder.mkdir()
    small = {**LLAMA_70B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
             "num_attention_heads": 32, "vocab_size": 32000}
    (folder / "config.json").write_text(json.dumps(small))
    monkeypatch.setattr(arithmetic, "cpu_has_bf16_matmul", lambda: bf16_matmul)
    monkeypatch.setattr(arithmetic, "physical_memory_bytes", lambda: 1024 * GIB)
    recipe = Recipe(model=ModelSpec(source=str(folder)), device="cpu")
    weights = plan_memory(_config(small), RunSizes.from_recipe(recipe), gpus(1, 2**62)).totals["weights (BF16)"]
    export_need = 2 * weights * scale  # the model and its quantized copy
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=export_need))
    check_cpu_export(recipe)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=export_need - 1))
    with pytest.raises(SetupError, match="exporting .* needs about"):
        check_cpu_export(recipe)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=weights * scale))
    with pytest.raises(SetupError, match="the search of .* on this CPU"):  # the weights alone are not enough
        check_cpu_search(recipe)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=4 * weights * scale))
    check_cpu_search(recipe)
