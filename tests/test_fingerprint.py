"""The model fingerprint: from the safetensors bytes (no tensor copied), the same for the same weights in any
folder or placement, another for other weights; runs stored with the old fingerprint keep theirs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY_MODEL, need

from advisor.errors import InputError
from advisor.models.fingerprint import files_fingerprint, is_legacy, legacy_fingerprint, run_fingerprint
from advisor.models.loading import load_model
from advisor.recipe.schema import ModelSpec
from advisor.workflows.context import model_fingerprint


@pytest.fixture
def copy_dir(tmp_path):
    folder = tmp_path / "elsewhere" / "tiny"
    shutil.copytree(need(TINY_MODEL), folder)
    return folder


def test_same_weights_same_fingerprint_in_another_folder(copy_dir):
    here = load_model(ModelSpec(source=str(TINY_MODEL)))
    there = load_model(ModelSpec(source=str(copy_dir)))
    assert here.fingerprint == there.fingerprint == files_fingerprint(copy_dir)
    assert not is_legacy(here.fingerprint)
    # the old hash carried the install path: the bug this fingerprint fixes
    assert legacy_fingerprint(here.model) != legacy_fingerprint(there.model)


def test_other_weights_or_config_other_fingerprint(copy_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    before = files_fingerprint(copy_dir)
    weights = load_file(copy_dir / "model.safetensors")
    name = sorted(weights)[3]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] += 1
    save_file(weights, copy_dir / "model.safetensors", metadata={"format": "pt"})
    changed = files_fingerprint(copy_dir)
    assert changed != before
    config = json.loads((copy_dir / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 2
    (copy_dir / "config.json").write_text(json.dumps(config))
    assert files_fingerprint(copy_dir) != changed
    config["_name_or_path"] = "/some/other/place"  # where it was saved is not what it is
    config["transformers_version"] = "0.0.1"
    with_paths = files_fingerprint(copy_dir)
    (copy_dir / "config.json").write_text(json.dumps(config))
    assert files_fingerprint(copy_dir) == with_paths


def test_same_fingerprint_whatever_the_placement(tiny_model_dir):
    """Streamed layers (weights on the meta device between forwards) are fingerprinted from the files."""
    from accelerate import dispatch_model

    plain = load_model(ModelSpec(source=str(tiny_model_dir)))
    streamed = load_model(ModelSpec(source=str(tiny_model_dir)))
    cpu = torch.device("cpu")
    dispatch_model(streamed.model, {"model.embed_tokens": cpu, "model.layers.0": cpu, "model.layers.1": "cpu",
                                    "model.norm": cpu, "model.rotary_emb": cpu, "lm_head": cpu})
    assert streamed.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert model_fingerprint(streamed) == model_fingerprint(plain) == plain.fingerprint


def test_a_run_stored_with_the_old_fingerprint_keeps_it(tiny_model_dir):
    loaded = load_model(ModelSpec(source=str(tiny_model_dir)))
    old = legacy_fingerprint(loaded.model)
    assert is_legacy(old)
    assert model_fingerprint(loaded, old) == old  # same weights: the study, its tokens and caches stay valid
    assert model_fingerprint(loaded, "0123456789abcdef") == loaded.fingerprint  # other weights: the new one
    assert model_fingerprint(loaded, "v2-0123456789abcdef") == loaded.fingerprint
    assert run_fingerprint(loaded.fingerprint, None, loaded.model) == loaded.fingerprint


def test_old_fingerprint_and_streamed_layers_is_one_error(tiny_model_dir):
    from accelerate import dispatch_model

    loaded = load_model(ModelSpec(source=str(tiny_model_dir)))
    old = legacy_fingerprint(loaded.model)
    cpu = torch.device("cpu")
    dispatch_model(loaded.model, {"model.embed_tokens": cpu, "model.layers.0": "cpu", "model.layers.1": cpu,
                                  "model.norm": cpu, "model.rotary_emb": cpu, "lm_head": cpu})
    with pytest.raises(InputError, match="older advisor"):
        model_fingerprint(loaded, old)
