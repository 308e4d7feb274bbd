"""All-BF16 served from the model's own folder where that folder is a BF16 checkpoint already
(advisor.deploy.checkpoint._engine_checkpoint): no export of the same weights, every other plan exported."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from advisor.deploy.checkpoint import bf16_served_as_is, bf16_source, checkpoint_exporter
from advisor.formats import Format
from advisor.plan import Plan


def model_folder(path: Path, dtype: str = "bfloat16", tensors: torch.dtype = torch.bfloat16, **config) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "dtype": dtype, **config}))
    (path / "tokenizer_config.json").write_text("{}")
    save_file({"w": torch.zeros(2, 2, dtype=tensors), "n": torch.ones(2, dtype=tensors)},
              str(path / "model.safetensors"))
    return path


def test_a_bf16_model_folder_is_served_as_it_is(tmp_path):
    assert bf16_source(model_folder(tmp_path / "m")) == tmp_path / "m"
    # transformers 4's key for the dtype, and a multimodal config's text part
    legacy = model_folder(tmp_path / "legacy", dtype=None, torch_dtype="bfloat16")
    assert bf16_source(legacy) == legacy
    nested = model_folder(tmp_path / "nested", dtype=None, text_config={"dtype": "bfloat16"})
    assert bf16_source(nested) == nested


@pytest.mark.parametrize("case", ["f32 tensors", "f32 config", "quantization_config", "hf_quant_config",
                                  "no tokenizer", "no safetensors", "garbled header", "no config"])
def test_anything_else_is_exported(tmp_path, case):
    m = tmp_path / "m"
    if case == "f32 tensors":
        model_folder(m, tensors=torch.float32)
    elif case == "f32 config":
        model_folder(m, dtype="float32")
    elif case == "quantization_config":
        model_folder(m, quantization_config={"quant_method": "fp8"})
    else:
        model_folder(m)
    if case == "hf_quant_config":
        (m / "hf_quant_config.json").write_text("{}")
    elif case == "no tokenizer":
        (m / "tokenizer_config.json").unlink()
    elif case == "no safetensors":
        (m / "model.safetensors").unlink()
    elif case == "garbled header":
        (m / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    elif case == "no config":
        (m / "config.json").unlink()
    assert bf16_source(m) is None


def test_the_exporter_serves_all_bf16_from_the_folder_and_exports_every_other_plan(tmp_path, monkeypatch):
    exported = []

    def export_plan(loaded, plan, tokens, out, workloads, **kw):
        exported.append(plan)
        Path(out).mkdir(parents=True)
        (Path(out) / "export.json").write_text("{}")

    monkeypatch.setattr("advisor.deploy.checkpoint._export.export_plan", export_plan)
    source = model_folder(tmp_path / "model")
    recipe = SimpleNamespace(model=SimpleNamespace(source=str(source), gguf_file=None), run_dir=tmp_path / "run",
                             workloads=[], target=SimpleNamespace(value="h100"))
    assert bf16_served_as_is(recipe) == source
    checkpoint_for = checkpoint_exporter(recipe, loaded=None, tokens=None)
    groups = ["a", "b"]
    bf16, fp8 = Plan.uniform(groups, Format.BF16), Plan.uniform(groups, Format.FP8)
    fp8_kv = bf16.with_kv_cache(Format.FP8)
    assert checkpoint_for(bf16) == source and exported == []
    assert checkpoint_for(fp8) == tmp_path / "run" / "engine_checkpoints" / fp8.id
    assert checkpoint_for(fp8_kv) == tmp_path / "run" / "engine_checkpoints" / fp8_kv.id  # the KV cache differs
    assert exported == [fp8, fp8_kv]
    # a hub id or a GGUF file: every plan exported
    for model in (SimpleNamespace(source="org/model", gguf_file=None),
                  SimpleNamespace(source=str(source), gguf_file="m.gguf")):
        assert bf16_served_as_is(SimpleNamespace(model=model)) is None


def test_verify_serves_all_bf16_of_a_bf16_model_from_its_folder(tmp_path, monkeypatch):
    import sys

    from conftest import TINY_MODEL, need
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from advisor.cli import app
    from advisor.deploy.vllm import serve
    from advisor.recipe.schema import validate_recipe
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm
    from advisor.workflows import verify as verify_module
    from advisor.workflows.search import run

    source = tmp_path / "tiny-bf16"  # the tiny model saved in BF16: a folder vLLM can serve as it is
    AutoModelForCausalLM.from_pretrained(need(TINY_MODEL), dtype=torch.bfloat16).save_pretrained(source)
    AutoTokenizer.from_pretrained(need(TINY_MODEL)).save_pretrained(source)
    assert bf16_source(source) == source
    recipe = validate_recipe({
        "name": "tiny", "model": {"source": str(source)}, "target": "h100",
        "workloads": [{"name": "chat", "batch_size": 4, "input_tokens": 16, "output_tokens": 8}],
        "calibration": {"num_samples": 4, "seq_len": 32, "heldout_samples": 2, "heldout_seq_len": 32},
        "search": {"trials": 2, "seed": 0}, "out": str(tmp_path / "runs"), "device": "cpu", "energy": "predicted"})
    run(recipe)
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(step_s=0.002))
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h100", "Fake GPU"))
    monkeypatch.setattr(verify_module, "run_in_child", lambda job: serve(job, make_counter=ConstantPowerCounter))
    res = CliRunner().invoke(app, ["verify", str(recipe.run_dir), "--no-energy"])
    assert res.exit_code == 0, res.output
    data = json.loads((Path(recipe.run_dir) / "verify.json").read_text())
    bf16 = next(r for r in data["plans"] if "bf16" in r["role"].split("+"))
    assert bf16["checkpoint"] == str(source) and bf16["formats_match"] is True
    assert bf16["accuracy"]["advisor_kl"] == pytest.approx(0.0, abs=1e-6)  # the reference's own weights
    assert not (Path(recipe.run_dir) / "engine_checkpoints" / bf16["plan_id"]).exists()
    assert f"served from {source} as it is" in res.output
