"""advisor export: the files, the per-layer quant config, and the round trip on the tiny model."""

from __future__ import annotations

import json

import pytest
import typer
import yaml
from conftest import TINY_MODEL, need
from typer.testing import CliRunner

from advisor.cli.deploy import export
from advisor.deploy.checkpoint import (
    ROUNDTRIP_KL_ABS_TOL,
    export_plan,
    layer_formats_from_quant_config,
    weight_formats_from_quant_config,
)
from advisor.formats import Format
from advisor.plan import Plan

runner = CliRunner()
WORKLOADS = [{"name": "chat", "batch_size": 16, "input_tokens": 256, "output_tokens": 128}]


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(export)
    app.command("noop")(lambda: None)
    return app


@pytest.fixture(scope="module")
def tiny():
    from advisor.calibration.tokens import build_token_sets
    from advisor.models.loading import load_model
    from advisor.recipe.schema import CalibrationSpec, ModelSpec

    loaded = load_model(ModelSpec(source=str(need(TINY_MODEL))), "cpu")
    spec = CalibrationSpec(num_samples=4, seq_len=32, heldout_samples=4, heldout_seq_len=32)
    return loaded, build_token_sets(loaded.model, loaded.tokenizer, spec)


def _assert_fused_scales_equal(out, plan, groups) -> int:
    """q/k/v and gate/up of every quantized fused group carry one input and one weight scale in the
    exported safetensors (for NVFP4 the global ``weight_scale_2``); returns how many groups were read."""
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as st:
        names = set(st.keys())
        read = 0
        for g in groups:
            fmt = plan.format_of(g.name)
            if fmt == Format.BF16 or len(g.members) < 2:
                continue
            for scale in ("input_scale", "weight_scale_2" if fmt == Format.NVFP4 else "weight_scale"):
                values = [st.get_tensor(f"{m}.{scale}") for m in g.members]
                assert all(f"{m}.{scale}" in names for m in g.members)
                assert all(v.equal(values[0]) for v in values), (g.name, scale, values)
            read += 1
    return read


def _expected(plan, groups):
    return {m: plan.format_of(g.name) for g in groups for m in g.members}


def test_mixed_plan_exports_mixed_precision_per_layer(tiny, tmp_path):
    loaded, tokens = tiny
    groups = loaded.shape.groups
    cycle = [Format.FP8, Format.NVFP4, Format.BF16]
    plan = Plan({g.name: cycle[i % 3] for i, g in enumerate(groups)})
    res = export_plan(loaded, plan, tokens, tmp_path / "ckpt", WORKLOADS, target="b200")
    out = tmp_path / "ckpt"
    for name in ("model.safetensors", "config.json", "hf_quant_config.json", "tokenizer.json",
                 "llm_api_options.yaml", "README.md", "export.json"):
        assert (out / name).is_file(), name
    q = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert q["quant_algo"] == "MIXED_PRECISION" and res.quant_algo == "MIXED_PRECISION"
    layers = q["quantized_layers"]
    for member, fmt in _expected(plan, groups).items():
        if fmt == Format.BF16:
            assert member not in layers
        else:
            assert layers[member]["quant_algo"] == {Format.FP8: "FP8", Format.NVFP4: "NVFP4"}[fmt]
    assert "lm_head" not in layers
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt"
    assert res.roundtrip["passed"]
    readme = (out / "README.md").read_text()
    assert any(w.startswith("vLLM: NGC's vLLM 26.02") and "issues/37854" in w for w in res.warnings)
    assert any(w.startswith("SGLang:") and "pull/32740" in w for w in res.warnings)
    assert res.engines["vLLM"]["verdict"] == "may fail" and res.engines["TensorRT-LLM"]["verdict"] != "may fail"
    assert "## Serving engines" in readme and "| SGLang | **may fail** |" in readme
    assert _assert_fused_scales_equal(out, plan, groups) >= 2
    opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    assert opts["max_batch_size"] == 16 and opts["max_seq_len"] == 384
    assert "dtype" not in opts["kv_cache_config"] and q.get("kv_cache_quant_algo") is None  # BF16 KV
    readme = (out / "README.md").read_text()
    assert "trtllm-serve" in readme and "--extra_llm_api_options llm_api_options.yaml" in readme
    served = yaml.safe_load((out / "vllm_config.yaml").read_text())
    assert served["max-num-seqs"] == 16 and served["max-model-len"] == 384 and "kv-cache-dtype" not in served
    assert "linear-backend" not in served  # B200: vLLM's own FP8 kernel choice stands (not measured here)
    # a step where one 256-token prefill joins 16 decodes is captured (vLLM's default bound would be 32)
    assert served["compilation-config"]["max_cudagraph_capture_size"] == 272
    assert "vllm serve <this folder> --config vllm_config.yaml" in readme
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        assert res.smoke_test == "not run: tensorrt_llm not installed"


def test_fp8_plan_lists_bf16_groups_in_exclude_modules(tiny, tmp_path):
    loaded, tokens = tiny
    groups = loaded.shape.groups
    plan = Plan({g.name: Format.BF16 if g.name.endswith((".o", ".down")) else Format.FP8 for g in groups})
    res = export_plan(loaded, plan, tokens, tmp_path / "ckpt", WORKLOADS, target="h100")
    q = res.hf_quant_config["quantization"]
    assert q["quant_algo"] == "FP8"
    bf16 = sorted(m for m, f in _expected(plan, groups).items() if f == Format.BF16)
    assert set(bf16) <= set(q["exclude_modules"]) and "lm_head" in q["exclude_modules"]
    assert layer_formats_from_quant_config(res.hf_quant_config, list(_expected(plan, groups))) == \
        _expected(plan, groups)
    rt = res.roundtrip
    assert rt["passed"] and rt["kl_abs_diff"] <= rt["tolerance_kl"]
    # FP8 weights are scored as the export rounds them: the served weights are the scored ones
    assert rt["weights"]["differing"] == 0 and rt["kl_abs_diff"] <= ROUNDTRIP_KL_ABS_TOL
    # the one warning is vLLM's measured caveat for FP8 operating batches (advisor.serving)
    assert [w for w in res.warnings if "reports/benchmarks/verify_time.md" not in w] == []
    assert _assert_fused_scales_equal(tmp_path / "ckpt", plan, groups) == 4  # qkv and gate_up of 2 layers
    # the search scores these shared scales already: export's own fusion step changes nothing
    assert rt["kl_in_memory_plan"] == rt["kl_in_memory"]
    # served on Hopper, vLLM's FP8 GEMMs run with cuBLASLt, not its CUTLASS kernel (deploy/checkpoint/_vllm_config.py)
    served = (tmp_path / "ckpt" / "vllm_config.yaml").read_text()
    assert yaml.safe_load(served)["linear-backend"] == "torch" and "# linear-backend: torch runs" in served
    assert "an older vLLM refuses it" in served


def test_an_fp8_moe_s_vllm_config_names_the_triton_experts_on_hopper():
    import yaml

    from advisor.deploy.checkpoint import vllm_options, vllm_options_yaml

    for gpu, moe, fmt, expected in (("h200", True, Format.FP8, "triton"), ("h100", True, Format.FP8, "triton"),
                                    ("b200", True, Format.FP8, None), ("h200", False, Format.FP8, None),
                                    ("h200", True, Format.BF16, None)):
        options = vllm_options(WORKLOADS, formats=[fmt], gpu=gpu, moe=moe)
        text = vllm_options_yaml(options, WORKLOADS)
        assert yaml.safe_load(text).get("moe-backend") == expected
        assert ("flashinfer-jit-cache" in text) == (expected is not None)


def test_nvfp4_round_trip_is_exact(tiny, tmp_path):
    loaded, tokens = tiny
    plan = Plan.uniform(loaded.shape.groups, Format.NVFP4)
    res = export_plan(loaded, plan, tokens, tmp_path / "ckpt", WORKLOADS, target="h200")
    assert res.roundtrip["weights"]["differing"] == 0
    assert res.roundtrip["kl_abs_diff"] <= ROUNDTRIP_KL_ABS_TOL
    assert any("Blackwell" in w for w in res.warnings)
    # vLLM has no 'torch' linear backend for NVFP4 layers: the export leaves vLLM's own choice
    assert "linear-backend" not in yaml.safe_load((tmp_path / "ckpt" / "vllm_config.yaml").read_text())


def test_fp8_kv_cache_exports_kv_cache_quant_algo_scales_and_the_trtllm_dtype(tiny, tmp_path):
    from safetensors import safe_open

    from advisor.deploy.checkpoint import kv_cache_format_from_quant_config

    loaded, tokens = tiny
    groups = loaded.shape.groups
    plan = Plan({g.name: Format.FP8 if g.name.endswith(".qkv") else Format.BF16 for g in groups}, Format.FP8)
    res = export_plan(loaded, plan, tokens, tmp_path / "ckpt", WORKLOADS, target="h100")
    out = tmp_path / "ckpt"
    q = res.hf_quant_config["quantization"]
    assert q["kv_cache_quant_algo"] == "FP8" and q["quant_algo"] == "FP8"
    assert kv_cache_format_from_quant_config(res.hf_quant_config) == Format.FP8
    with safe_open(str(out / "model.safetensors"), "pt") as st:
        for i in range(2):
            for kv in "kv":
                scale = float(st.get_tensor(f"model.layers.{i}.self_attn.{kv}_proj.{kv}_scale"))
                assert 0 < scale < 1  # amax / 448 of the calibrated keys or values
    opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    assert opts["kv_cache_config"]["dtype"] == "fp8"
    assert yaml.safe_load((out / "vllm_config.yaml").read_text())["kv-cache-dtype"] == "fp8"
    assert "kv_cache_config.dtype: fp8" in (out / "README.md").read_text()
    assert res.roundtrip["passed"]  # the reader inserts the k/v quantizers from k_scale / v_scale
    kv_only = export_plan(loaded, Plan.uniform(groups, Format.BF16, Format.FP8), tokens, tmp_path / "kv",
                          WORKLOADS, target="h100", smoke=False)
    assert kv_only.roundtrip["kl_abs_diff"] == 0.0 and kv_only.roundtrip["kl_in_memory"] > 0  # KV scales exact
    assert not any("all-BF16" in w for w in kv_only.warnings)  # its KV cache is FP8
    assert any(w.startswith("vLLM: with the Flash Attention 3 backend") for w in kv_only.warnings)


def test_quant_config_reader():
    mods = ["m.a", "m.b"]
    assert layer_formats_from_quant_config(None, mods) == {"m.a": Format.BF16, "m.b": Format.BF16}
    cfg = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "m.b"]}}
    assert layer_formats_from_quant_config(cfg, mods) == {"m.a": Format.NVFP4, "m.b": Format.BF16}
    assert weight_formats_from_quant_config(cfg) == {Format.NVFP4} and weight_formats_from_quant_config(None) == set()
    mixed = {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "m.a": {"quant_algo": "FP8"}, "m.b": {"quant_algo": "NVFP4"}}}}
    assert weight_formats_from_quant_config(mixed) == {Format.FP8, Format.NVFP4}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from advisor.recipe.schema import validate_recipe
    from advisor.workflows.search import run

    recipe = validate_recipe({
        "name": "tiny", "model": {"source": str(need(TINY_MODEL))}, "target": "b200", "workloads": WORKLOADS,
        "calibration": {"num_samples": 4, "seq_len": 32, "heldout_samples": 4, "heldout_seq_len": 32},
        "search": {"trials": 3, "seed": 0}, "out": str(tmp_path_factory.mktemp("runs")), "device": "cpu",
    })
    run(recipe)
    return recipe.run_dir


def test_cli_exports_the_recommendation(run_dir, tmp_path):
    res = runner.invoke(_app(), ["export", str(run_dir), "--out", str(tmp_path / "ckpt")])
    assert res.exit_code == 0, res.output
    summary = json.loads((run_dir / "summary.json").read_text())
    data = json.loads((tmp_path / "ckpt" / "export.json").read_text())
    assert data["plan_id"] == summary["recommendation"]["plan_id"]
    # The run's own tokens are reused: the in-memory plan scores what the search stored.
    assert data["roundtrip"]["kl_in_memory_plan"] == pytest.approx(summary["recommendation"]["kl"], abs=1e-6)
    assert "round trip" in res.output and "trtllm-serve" in res.output
    assert "engines: TensorRT-LLM " in res.output and "SGLang" in res.output


def test_cli_export_refuses_a_non_empty_folder(run_dir, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "x").write_text("")
    res = runner.invoke(_app(), ["export", str(run_dir), "--out", str(tmp_path / "ckpt")])
    assert res.exit_code == 2 and "not empty" in res.output


def test_cli_export_unknown_plan_and_missing_run(run_dir, tmp_path):
    res = runner.invoke(_app(), ["export", str(run_dir), "--plan", "nope", "--out", str(tmp_path / "a")])
    assert res.exit_code == 2 and "no plan 'nope'" in res.output
    res = runner.invoke(_app(), ["export", str(tmp_path / "missing"), "--out", str(tmp_path / "b")])
    assert res.exit_code == 2 and "not a directory" in res.output


def test_the_quantized_copy_holds_no_weights_once_written(tiny, tmp_path, monkeypatch):
    """On a GPU something in ModelOpt's quantize keeps the copy referenced after the export (an H100, 2026-11-27):
    its tensors are emptied once the checkpoint is written, so what keeps it holds no GPU memory."""
    import copy

    import torch

    loaded, tokens = tiny
    copies = []
    deepcopy = copy.deepcopy

    def keep(obj, *args, **kwargs):  # what the leak does: the copy stays referenced
        out = deepcopy(obj, *args, **kwargs)
        if isinstance(out, torch.nn.Module):
            copies.append(out)
        return out

    monkeypatch.setattr(copy, "deepcopy", keep)
    plan = Plan.uniform(loaded.shape.groups, Format.FP8)
    res = export_plan(loaded, plan, tokens, tmp_path / "ckpt", WORKLOADS, target="h100")
    assert res.roundtrip["passed"] and len(copies) == 1
    tensors = [*copies[0].parameters(), *copies[0].buffers()]
    assert tensors and all(t.numel() == 0 and t.device.type == "cpu" for t in tensors)
    assert all(p.numel() > 0 for p in loaded.model.parameters())  # the model itself is untouched
