from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from advisor.cli import app
from advisor.errors import InputError
from advisor.formats import Format
from advisor.recipe.schema import load_recipe

runner = CliRunner()

BAD_RECIPES = [
    ({"target": "a100"}, "target: got 'a100'; input should be 'h100', 'h200' or 'b200'"),
    ({"formats": ["fp8"]}, "formats: must include bf16"),
    ({"formats": ["bf16", "int3"]}, "formats.1: got 'int3'"),
    ({"target": "h100", "formats": ["bf16", "nvfp4"]}, "do not run natively on target h100"),
    ({"search": {"trials": 0}}, "search.trials: got 0"),
    ({"search": {"sampler": "cmaes"}}, "search.sampler: got 'cmaes'"),
    ({"workloads": [{"batch_size": -1}]}, "workloads.0.batch_size: got -1"),
    ({"workloads": []}, "workloads: "),
    ({"workloads": [{"name": "a"}, {"name": "a"}]}, "workload names must be unique"),
    ({"accuracy": {"max_kl": -0.1}}, "accuracy.max_kl: got -0.1"),
    ({"calibration": {"source": "data.csv"}}, "calibration.source: got 'data.csv'"),
    ({"name": "bad name/x"}, "name: got 'bad name/x'"),
    ({"bogus": 1}, "bogus: unknown field"),
    ({"model": {"source": " "}}, "model.source"),
    ({"device": "tpu"}, "device: got 'tpu'"),
    ({"kv_cache": ["fp8"]}, "kv_cache: must include bf16"),
    ({"kv_cache": ["bf16", "nvfp4"]}, "kv_cache: ['nvfp4'] cannot be a KV-cache format here; allowed: bf16, fp8"),
    ({"kv_cache": ["bf16", "int4"]}, "kv_cache.1: got 'int4'"),
    ({"engine": "sglang"}, "engine: got 'sglang'"),
    ({"search": {"trials": True}}, "search.trials: got true; give a number, not true or false"),
    ({"accuracy": {"max_kl": False}}, "accuracy.max_kl: got false; give a number, not true or false"),
    ({"benchmark": {"limit": True}}, "benchmark.limit: got true; give a number"),
    ({"model": 5}, "model: got 5; give a section of fields here"),
    ({"engine": "tensorrt_llm", "energy": "predicted"}, "engine tensorrt_llm measures energy, but energy: predicted"),
]


@pytest.mark.parametrize(("data", "message"), BAD_RECIPES)
def test_bad_recipe_gives_one_clear_message(tmp_path, data, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as info:
        load_recipe(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("data", "message"), BAD_RECIPES[:6])
def test_bad_recipe_on_the_cli_exits_2_without_traceback(tmp_path, data, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["search", "-r", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert message in result.output.replace("\n", "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "a100"], "target (set by a flag): got 'a100'"),
        (["--formats", "bf16,fp4"], "got 'fp4'"),
        (["--trials", "0"], "search.trials (set by a flag)"),
        (["--max-kl", "0"], "accuracy.max_kl"),
        (["--batch-size", "0"], "workloads.0.batch_size"),
        (["--sampler", "grid"], "search.sampler"),
        (["--model", "./no/such/dir"], "directory ./no/such/dir does not exist"),
        (["--calibration", "missing.txt", "--model", "../shared/models/tinystories-656k"], "missing.txt"),
    ],
)
def test_bad_flag_exits_2_with_message(tmp_path, args, message):
    result = runner.invoke(app, ["search", "--out", str(tmp_path), "--device", "cpu", "--target", "b200", *args]
                           if "--target" not in args else ["search", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert message in result.output.replace("\n", "")


def test_missing_and_malformed_recipe_files(tmp_path):
    with pytest.raises(InputError, match="cannot read recipe"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_recipe(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="must be a YAML mapping"):
        load_recipe(listy)


def test_flag_overrides_recipe_overrides_default(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"target": "b200", "search": {"trials": 7, "seed": 3}}))
    r = load_recipe(path, {"search.trials": 11, "search.seed": None})
    assert r.search.trials == 11  # flag wins
    assert r.search.seed == 3  # recipe kept where the flag is unset
    assert r.search.sampler == "guided"  # default
    assert r.formats == [Format.BF16, Format.FP8, Format.NVFP4]  # all that b200 runs


def test_default_formats_follow_the_target():
    assert load_recipe(None, {"target": "h100"}).formats == [Format.BF16, Format.FP8]


def test_shipped_recipes_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "recipes"
    for path in root.glob("*.yaml"):
        load_recipe(path)


def test_kv_cache_defaults_to_bf16_and_fp8_is_checked_against_the_target(tmp_path, monkeypatch):
    from dataclasses import replace

    from advisor.formats import GPU, GPU_SPECS

    assert load_recipe(None).kv_cache == [Format.BF16]
    assert load_recipe(None, {"kv_cache": ["bf16", "fp8"]}).kv_cache == [Format.BF16, Format.FP8]
    no_fp8 = replace(GPU_SPECS[GPU.H100], tensor_tflops={Format.BF16: 989.0})  # a GPU without FP8 kernels
    monkeypatch.setitem(GPU_SPECS, GPU.H100, no_fp8)
    with pytest.raises(InputError, match=r"kv_cache \['fp8'\] is not served on target h100"):
        load_recipe(None, {"target": "h100", "formats": ["bf16"], "kv_cache": ["bf16", "fp8"]})


def test_study_key_names_the_kv_cache_only_when_it_is_searched():
    from advisor.search.study import study_key

    assert "kv_cache" not in study_key(load_recipe(None), {})  # studies made before it keep their key
    assert study_key(load_recipe(None, {"kv_cache": ["bf16", "fp8"]}), {})["kv_cache"] == ["bf16", "fp8"]


def test_engine_is_in_the_study_key_only_when_not_builtin_and_preflight_needs_the_package(monkeypatch):
    import sys

    from advisor.errors import SetupError
    from advisor.search.study import study_key
    from advisor.workflows.preflight import check_devices

    assert "engine" not in study_key(load_recipe(None), {})
    trt = load_recipe(None, {"engine": "tensorrt_llm", "energy": "auto"})
    assert study_key(trt, {})["engine"] == "tensorrt_llm"
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # not importable
    with pytest.raises(SetupError, match="pip install tensorrt_llm"):
        check_devices(trt)


def test_docs_recipe_md_is_the_generated_reference():
    """docs/recipe.md lists every field the schema has; regenerate it when the schema changes."""
    from advisor.recipe.reference import reference_markdown

    doc = Path(__file__).resolve().parents[1] / "docs" / "recipe.md"
    assert doc.read_text() == reference_markdown(), "run: python -m advisor.recipe.reference > docs/recipe.md"
    for section in ("model", "workloads[]", "calibration", "accuracy", "benchmark", "search"):
        assert f"| `{section}." in doc.read_text()


def test_a_recipe_that_is_not_utf8_is_one_error(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(InputError, match="is not UTF-8 text"):
        load_recipe(latin1)


def test_a_key_given_twice_is_named_not_silently_overwritten(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("name: a\naccuracy:\n  max_kl: 0.1\n  max_kl: 0.2\n")
    with pytest.raises(InputError, match="the key 'max_kl' appears twice at line 4"):
        load_recipe(twice)
    fine = tmp_path / "fine.yaml"  # the same keys in different mappings are no repeat; a merge key may be overridden
    fine.write_text("workloads:\n  - &w {name: a, batch_size: 1}\n  - {<<: *w, name: b}\n")
    assert [(w.name, w.batch_size) for w in load_recipe(fine).workloads] == [("a", 1), ("b", 1)]
    unhashable = tmp_path / "unhashable.yaml"
    unhashable.write_text("? [a, b]\n: 1\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_recipe(unhashable)
