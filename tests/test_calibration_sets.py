"""Named calibration sets (`calibration.source: set:NAME` / `set:PATH.yaml`): read with `datasets`, cut into the
same windows as a file's text; the shipped specs are valid; offline and bad specs fail with one clear error."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from conftest import TINY_MODEL, TINY_TEXT, need

from advisor.calibration.tokens import build_token_sets
from advisor.errors import InputError, SetupError
from advisor.recipe.calibration_sets import SETS_DIR, CalibrationSet, read_set, shipped_sets
from advisor.recipe.schema import CalibrationSpec, validate_recipe

SPEC = {"num_samples": 3, "seq_len": 32, "heldout_samples": 2, "heldout_seq_len": 16}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(need(TINY_MODEL)))


def stories(n: int) -> list[str]:
    return [s.strip() for s in need(TINY_TEXT).read_text().split("\n\n") if s.strip()][:n]


def local_set(tmp_path, rows: list[dict], **fields) -> str:
    """A spec reading ``rows`` (saved as data.jsonl) with datasets' 'json' builder."""
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = {"why": "test rows", "dataset": "json", "data_files": ["data.jsonl"], "split": "train",
            "text_field": "story", **fields}
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in spec.items() if v is not None}))
    return f"set:{path}"


def test_a_local_dataset_gives_the_tokens_of_the_same_text_as_a_file(tmp_path, tokenizer):
    texts = stories(200)
    source = local_set(tmp_path, [{"id": i, "story": t} for i, t in enumerate(texts)])
    from_set = build_token_sets(None, tokenizer, CalibrationSpec(source=source, **SPEC))
    (tmp_path / "same.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    (tmp_path / "same.txt").write_text("\n\n".join(texts))
    for path in ("same.jsonl", "same.txt"):
        from_file = build_token_sets(None, tokenizer, CalibrationSpec(source=str(tmp_path / path), **SPEC))
        assert torch.equal(from_set.calibration, from_file.calibration)
        assert torch.equal(from_set.heldout, from_file.heldout)
    assert from_set.calibration.shape == (3, 32) and from_set.heldout.shape == (2, 16)
    # streamed: only the first rows the windows need were read, not all 200
    rows_read = int(from_set.source.split("first ")[1].split()[0])
    assert 1 <= rows_read < len(texts) and "json" in from_set.source and "field story" in from_set.source


def test_too_few_rows_name_the_tokens_needed(tmp_path, tokenizer):
    source = local_set(tmp_path, [{"story": "Once upon a time."}])
    with pytest.raises(InputError, match=r"tokens; 128 are needed"):
        build_token_sets(None, tokenizer, CalibrationSpec(source=source, **SPEC))


def test_every_shipped_set_is_a_valid_spec_of_a_hub_dataset():
    sets = shipped_sets()
    assert {"cnn_dailymail", "wikitext"} <= set(sets)
    assert sets["cnn_dailymail"].parent.resolve() == (SETS_DIR.parents[2] / "calibration").resolve()
    for name in sets:
        spec = read_set(f"set:{name}")
        assert isinstance(spec, CalibrationSet) and "/" in spec.dataset and spec.text_field and spec.why
    assert read_set("set:cnn_dailymail").text_field == "article"  # ModelOpt's hf_ptq default reads `article`
    assert validate_recipe({"calibration": {"source": "set:cnn_dailymail"}}).calibration.source == "set:cnn_dailymail"


def test_unknown_set_name_is_refused_by_the_recipe_naming_the_known_ones():
    with pytest.raises(InputError, match=r"calibration.source: .*unknown calibration set 'nosuch'.*cnn_dailymail"):
        validate_recipe({"calibration": {"source": "set:nosuch"}})


@pytest.mark.parametrize(("change", "problem"), [
    ({"text_field": None}, "text_field: field required"),
    ({"splitt": "train"}, "splitt: extra inputs are not permitted"),
])
def test_a_bad_spec_names_its_field(tmp_path, tokenizer, change, problem):
    source = local_set(tmp_path, [{"story": t} for t in stories(50)], **change)
    with pytest.raises(InputError, match=problem):
        build_token_sets(None, tokenizer, CalibrationSpec(source=source, **SPEC))


def test_a_text_field_the_rows_lack_or_that_is_no_text_is_named(tmp_path, tokenizer):
    rows = [{"story": t, "turns": [{"role": "user", "content": t}]} for t in stories(50)]
    source = local_set(tmp_path, rows, text_field="text")
    with pytest.raises(InputError, match=r"text_field: 'text' is not a field of json \(its fields: story, turns\)"):
        build_token_sets(None, tokenizer, CalibrationSpec(source=source, **SPEC))
    source = local_set(tmp_path, rows, text_field="turns")
    with pytest.raises(InputError, match=r"text_field: 'turns' of json holds a list, not text"):
        build_token_sets(None, tokenizer, CalibrationSpec(source=source, **SPEC))


def test_a_hub_dataset_offline_is_an_environment_error_naming_it(monkeypatch, tokenizer):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SetupError) as err:
        build_token_sets(None, tokenizer, CalibrationSpec(source="set:cnn_dailymail", **SPEC))
    assert err.value.exit_code == 3
    message = str(err.value)
    assert "cannot read dataset 'abisee/cnn_dailymail'" in message and "give a local .txt/.jsonl file" in message
    assert "\n" not in message


def test_a_run_keeps_a_spec_path_absolute_and_a_set_name_as_it_is(tmp_path, monkeypatch):
    from advisor.search.study import absolute_local_path

    (tmp_path / "mine.yaml").write_text("why: x\n")
    monkeypatch.chdir(tmp_path)
    assert absolute_local_path("set:mine.yaml") == f"set:{tmp_path / 'mine.yaml'}"
    (tmp_path / "cnn_dailymail").mkdir()  # a folder of the set's name does not turn the name into a path
    assert absolute_local_path("set:cnn_dailymail") == "set:cnn_dailymail"
