"""`recheck` tells new weights of the run's model from another model, from the config and the
tokenizer alone: the architecture first, then the tokenizer's fingerprint."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import TINY_MODEL, need
from transformers import AutoConfig, AutoTokenizer

from advisor.deploy.verification import architecture, check_new_version, tokenizer_fingerprint
from advisor.errors import InputError
from advisor.recipe.schema import ModelSpec


@pytest.fixture(scope="module")
def run_summary() -> dict:
    """What a run of the tiny model records about its model (summary.json's `model` and `shape`)."""
    need(TINY_MODEL)
    return {"model": {"name": str(TINY_MODEL), "tokenizer": tokenizer_fingerprint(AutoTokenizer.from_pretrained(
        TINY_MODEL))}, "shape": architecture(AutoConfig.from_pretrained(TINY_MODEL))}


def _copy_config_and_tokenizer(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in TINY_MODEL.iterdir():
        if f.suffix == ".json":
            shutil.copy(f, folder / f.name)
    return folder


def test_new_weights_of_the_same_model_pass(run_summary, tmp_path):
    check_new_version(run_summary, ModelSpec(source=str(_copy_config_and_tokenizer(tmp_path))))


def test_another_architecture_is_refused_naming_what_differs(run_summary, tmp_path):
    folder = _copy_config_and_tokenizer(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 4096, "num_hidden_layers": 3}))
    with pytest.raises(InputError) as info:
        check_new_version(run_summary, ModelSpec(source=str(folder)))
    message = str(info.value)
    assert "is not a new version of this run's model" in message
    assert "num_layers 3 (the run's: 2)" in message and "vocab_size 4096 (the run's: 2048)" in message


def test_another_tokenizer_is_refused(run_summary, tmp_path):
    folder = _copy_config_and_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<an_added_token>"])
    tokenizer.save_pretrained(folder)
    with pytest.raises(InputError, match="tokenizer fingerprint .* \\(the run's: "):
        check_new_version(run_summary, ModelSpec(source=str(folder)))


def test_a_summary_without_a_tokenizer_fingerprint_compares_the_architecture_only(run_summary, tmp_path):
    folder = _copy_config_and_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<an_added_token>"])
    tokenizer.save_pretrained(folder)
    older = {**run_summary, "model": {"name": "m"}}
    check_new_version(older, ModelSpec(source=str(folder)))
