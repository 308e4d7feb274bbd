"""The model config.json describes is the model its weights hold (advisor/models/weights_match.py): for every
family adapter, a config that disagrees with the safetensors headers (more or fewer layers, another hidden size or
vocabulary, q/k/v biases the weights lack or hold) is one `Error:` line, exit 2, before any weight is read. The
fixtures are tiny random models transformers itself saves, so the names and shapes checked are the ones real
checkpoints carry."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.errors import InputError
from advisor.models.config_check import model_facts
from advisor.recipe.schema import ModelSpec
from advisor.testing import FAMILIES, random_model, tiny_config

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the config field that gives a family q/k/v biases (None: the family always has them); absent: it has none
BIAS = {"llama": "attention_bias", "qwen2": None, "qwen3": "attention_bias", "gemma2": "attention_bias",
        "gemma3_text": "attention_bias", "gemma3": "attention_bias", "qwen3_moe": "attention_bias",
        "qwen2_moe": "qkv_bias"}
LAYERS = {f: "language_model.model.layers" if f == "gemma3" else "model.layers" for f in FAMILIES}
VARIANTS = ("more layers", "fewer layers", "hidden size", "vocabulary", "missing bias", "bias the config lacks")
CASES = [(f, v) for f in FAMILIES for v in VARIANTS if "bias" not in v or f in BIAS]
CASES = [(f, v) for f, v in CASES if not (v == "bias the config lacks" and BIAS[f] is None)]


def _save(model, folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> a folder transformers saved: a 2-layer, hidden-64, vocabulary-256 random model (q/k/v biases on
    where the family has them)."""
    folders = {}
    for family in FAMILIES:
        config = tiny_config(family)
        if BIAS.get(family):
            setattr(config.get_text_config(), BIAS[family], True)
        folders[family] = _save(random_model(config), tmp_path_factory.mktemp(family))
    return folders


def _text(config: dict, family: str) -> dict:
    return config["text_config"] if family == "gemma3" else config


def _layers(text: dict, n: int) -> None:
    text["num_hidden_layers"] = n
    if text.get("layer_types"):  # kept as long as the layers, as transformers requires
        text["layer_types"] = (text["layer_types"] * n)[:n]


def _drop_tensor(folder: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def mismatch(src: Path, family: str, variant: str, dst: Path) -> tuple[Path, str]:
    """A copy of ``src`` whose config and weights disagree as ``variant`` says; and what the refusal names."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    text, layers = _text(config, family), LAYERS[family]
    bias = f"{layers}.0.self_attn.q_proj.bias"
    if variant == "more layers":
        _layers(text, 4)
        expect = f"says num_hidden_layers 4, but the weights hold 2 layers; {layers}.2."
    elif variant == "fewer layers":
        _layers(text, 1)
        expect = f"says num_hidden_layers 1, but the weights hold 2 layers; {layers}.1."
    elif variant == "hidden size":
        text["hidden_size"] = 32
        expect = "embed_tokens.weight is [256, 64] in the weights, but config.json makes it [256, 32]"
    elif variant == "vocabulary":
        text["vocab_size"] = 128
        expect = "embed_tokens.weight is [256, 64] in the weights, but config.json makes it [128, 64]"
    elif variant == "missing bias":
        _drop_tensor(dst, bias)
        expect = f"{bias} is missing from the weights"
    else:
        text[BIAS[family]] = False
        expect = f"{layers}.0.self_attn.k_proj.bias is in the weights, but the model config.json describes has no " \
                 f"such tensor (config.json gives it no bias: {BIAS[family]} false)"  # the first in the header
    (dst / "config.json").write_text(json.dumps(config))
    return dst, expect


@pytest.mark.parametrize("family", FAMILIES)
def test_what_transformers_saves_agrees_with_its_config(saved, family):
    assert model_facts(ModelSpec(source=str(saved[family]))) is not None


@pytest.mark.parametrize(("family", "variant"), CASES, ids=[f"{f}-{v}" for f, v in CASES])
def test_a_config_that_does_not_describe_the_weights_is_refused_before_any_load(saved, family, variant, tmp_path,
                                                                                 monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from advisor.models.loading import load_model

    folder, expect = mismatch(saved[family], family, variant, tmp_path / "model")

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_load)
    with pytest.raises(InputError, match="config.json and the weights disagree") as refused:
        load_model(ModelSpec(source=str(folder)))
    assert expect in str(refused.value) and refused.value.exit_code == 2
    assert "give the config.json that came with these weights" in str(refused.value)
    started = time.perf_counter()
    res = runner.invoke(app, ["search", "--model", str(folder), "--device", "cpu", "--target", "h200",
                              "--energy", "predicted", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in res.output
    assert time.perf_counter() - started < 10  # judged from the headers: no load, no study
    assert not (tmp_path / "runs").exists()


def _state_dict_folder(model, folder: Path) -> Path:
    """The model's tensors under their in-memory names (transformers 5's fused experts, Gemma 3's
    model.language_model prefix): a checkpoint layout transformers loads as well."""
    from safetensors.torch import save_file

    folder.mkdir()
    model.config.save_pretrained(folder)
    tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe", "gemma3"])
def test_the_in_memory_layout_is_judged_too(family, tmp_path):
    folder = _state_dict_folder(random_model(tiny_config(family)), tmp_path / "m")
    model_facts(ModelSpec(source=str(folder)))
    config = json.loads((folder / "config.json").read_text())
    text = _text(config, family)
    if family == "gemma3":
        text["intermediate_size"] = 48
        expect = "model.language_model.layers.0.mlp.gate_proj.weight is [96, 64] in the weights, but config.json " \
                 "makes it [48, 64] (intermediate_size, hidden_size)"
    else:
        key = "num_local_experts" if "num_local_experts" in text else "num_experts"
        text[key] = 8
        expect = "model.layers.0.mlp.gate.weight is [4, 64] in the weights, but config.json makes it [8, 64]"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="config.json and the weights disagree") as refused:
        model_facts(ModelSpec(source=str(folder)))
    assert expect in str(refused.value)


def test_every_shard_an_index_names_is_judged(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModelForCausalLM.from_pretrained(saved["llama"]).save_pretrained(folder, max_shard_size="40KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    model_facts(ModelSpec(source=str(folder)))
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="says num_hidden_layers 3, but the weights hold 2 layers"):
        model_facts(ModelSpec(source=str(folder)))
    shards[-1].unlink()
    with pytest.raises(InputError, match=f"{shards[-1].name}, a shard model.safetensors.index.json names, is missing"):
        model_facts(ModelSpec(source=str(folder)))


def test_a_wrapper_text_config_may_leave_sizes_to_its_class_and_the_headers_judge_them(saved, tmp_path):
    """Gemma 3's published configs name no vocabulary: transformers' default (262208) stands in, and the
    embedding table in the weights shows whether it is the model's."""
    folder = shutil.copytree(saved["gemma3"], tmp_path / "gemma3")
    config = json.loads((folder / "config.json").read_text())
    del config["text_config"]["vocab_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"language_model.model.embed_tokens.weight is \[256, 64\] in the weights, "
                                         r"but config.json makes it \[262208, 64\]"):
        model_facts(ModelSpec(source=str(folder)))


# ---- config.json's own fields, before transformers reads it


@pytest.mark.parametrize(("change", "message"), [
    ({"hidden_size": None}, "config.json has no hidden_size; the Llama 3.x model's geometry is read from it"),
    ({"num_hidden_layers": 0}, "config.json: num_hidden_layers is 0, not a positive whole number"),
    ({"num_hidden_layers": -2}, "config.json: num_hidden_layers is -2, not a positive whole number"),
    ({"hidden_size": "128"}, 'config.json: hidden_size is "128", not a positive whole number'),
    ({"num_attention_heads": 0}, "config.json: num_attention_heads is 0, not a positive whole number"),
    ({"num_key_value_heads": 3}, "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types names 3 layers, num_hidden_layers 2"),
])
def test_config_fields_are_required_and_sized(tiny_model_dir, tmp_path, change, message):
    folder = shutil.copytree(tiny_model_dir, tmp_path / "m")
    config = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    for dry in ([], ["--dry-run", "--gpus", "1", "--gpu-memory", "80"]):
        res = runner.invoke(app, ["search", "--model", str(folder), "--device", "cpu", "--out", str(tmp_path / "r"),
                                  *dry])
        assert res.exit_code == 2, res.output
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and message in errors[0], res.output
        assert "give the config.json that came with the model's weights" in errors[0]


def test_a_moe_config_names_its_experts(saved, tmp_path):
    folder = shutil.copytree(saved["mixtral"], tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    del config["num_local_experts"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="config.json has no num_local_experts; the Mixtral model's geometry"):
        model_facts(ModelSpec(source=str(folder)))


# ---- GGUF: the metadata transformers builds the model from against the tensors the file holds


def _gguf(path: Path, arch: str, blocks: int, block_count: int, biases: bool = True) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch=arch)
    writer.add_context_length(512)
    writer.add_block_count(block_count)
    writer.add_embedding_length(8)
    writer.add_token_list(["a", "b", "c", "d"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    for b in range(blocks):
        writer.add_tensor(f"blk.{b}.attn_q.weight", np.zeros((8, 8), dtype=np.float32))
        if biases:
            for x in ("q", "k", "v"):
                writer.add_tensor(f"blk.{b}.attn_{x}.bias", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("blocks", "block_count", "arch", "biases", "message"), [
    (2, 2, "llama", True, None),
    (1, 2, "llama", True, "llama.block_count says 2 layers, but blk.1.* tensors are missing"),
    (2, 1, "llama", True, "llama.block_count says 1 layers, but the file holds blk.1.* tensors"),
    (2, 2, "qwen2", False, "blk.0.attn_q.bias is missing, and a qwen2 model has it"),
])
def test_a_gguf_file_whose_metadata_and_tensors_disagree_is_refused(tmp_path, blocks, block_count, arch, biases,
                                                                    message):
    from advisor.models.gguf_header import check_gguf_complete

    path = _gguf(tmp_path / "m.gguf", arch, blocks, block_count, biases)
    if message is None:
        assert check_gguf_complete(path).block_count == block_count
        return
    with pytest.raises(InputError, match="its metadata and tensors disagree") as refused:
        check_gguf_complete(path)
    assert message in str(refused.value)
    res = runner.invoke(app, ["search", "--model", str(path), "--device", "cpu", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and res.stderr.count("Error:") == 1 and message in res.stderr, res.output


# ---- the dry run bounds its inputs like a real run, and ignores the recipe's device


def test_the_documented_dry_run_plans_the_gpus_it_is_told_whatever_the_recipe_device(tiny_model_dir):
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"
    assert "device: cpu" in recipe.read_text()
    res = runner.invoke(app, ["search", "-r", str(recipe), "--model", str(tiny_model_dir), "--dry-run", "--gpus",
                              "1", "--gpu-memory", "80"])
    assert res.exit_code == 0, res.output
    assert "cuda:0" in res.stdout and "fits" in res.stdout


@pytest.mark.parametrize("gpus", ["65", "100000"])
def test_the_dry_run_bounds_gpus_like_a_real_run(tiny_model_dir, gpus):
    started = time.perf_counter()
    res = runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--dry-run", "--gpus", gpus,
                              "--gpu-memory", "80"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [f"Error: --gpus {gpus}: a plan is for one node of 1 to 64 GPUs; "
                                               "give at most 64"]
    assert time.perf_counter() - started < 10 and not res.stdout


@pytest.mark.parametrize("dry", [[], ["--dry-run", "--gpus", "1", "--gpu-memory", "80"]])
def test_an_unsupported_architecture_exits_2_in_search_and_its_dry_run(tmp_path, dry):
    from transformers import GPT2Config

    folder = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(folder)
    res = runner.invoke(app, ["search", "--model", str(folder), "--device", "cpu", "--out", str(tmp_path / "r"),
                              *dry])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("Error:") == 1 and "model_type 'gpt2' is not supported" in res.stderr
