"""Accuracy in float32 on a CPU without BF16 matrix instructions: the same model, scores close to BF16's,
a scoring place of its own that a resume or a worker must match."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MODEL, TINY_TEXT, need

from advisor.errors import InputError
from advisor.formats import Format
from advisor.models import arithmetic
from advisor.models.arithmetic import BF16, FLOAT32, choose_arithmetic
from advisor.plan import Plan
from advisor.recipe.schema import validate_recipe
from advisor.search.study import check_same_scoring

GIB = 2**30


def test_only_a_cpu_without_bf16_instructions_computes_in_float32_and_only_where_it_fits():
    assert choose_arithmetic("cuda", 10**9, False, 16 * GIB)[0] == BF16
    assert choose_arithmetic("cpu", 10**9, True, 16 * GIB)[0] == BF16
    assert choose_arithmetic("cpu", 10**9, False, 16 * GIB)[0] == FLOAT32  # 3.7 GiB of 16
    assert choose_arithmetic("cpu", 10**9, False, None)[0] == FLOAT32  # memory unknown
    name, why = choose_arithmetic("cpu", 8 * 10**9, False, 32 * GIB)  # 29.8 GiB of float32 weights
    assert name == BF16 and "29.8 GiB" in why and "32 GiB" in why


def _recipe(tmp_path, name: str, tokens: int, **more):
    """The tiny model on the CPU, its calibration and held-out tokens read from text (the same in every arithmetic)."""
    return validate_recipe({
        "name": name, "model": {"source": str(need(TINY_MODEL))}, "target": "h100", "formats": ["bf16", "fp8"],
        "calibration": {"source": str(need(TINY_TEXT)), "num_samples": tokens // 16, "seq_len": tokens,
                        "heldout_samples": tokens // 16, "heldout_seq_len": tokens},
        "energy": "predicted", "out": str(tmp_path), "device": "cpu", **more,
    })


def _prepare(tmp_path, monkeypatch, has_bf16: bool, name: str):
    from advisor.workflows.context import prepare

    monkeypatch.setattr(arithmetic, "cpu_has_bf16_matmul", lambda: has_bf16)
    return prepare(_recipe(tmp_path, name, 64))


def test_a_float32_run_is_the_same_model_scores_close_to_bf16_and_says_where_it_scored(tmp_path, monkeypatch):
    ctx32 = _prepare(tmp_path, monkeypatch, has_bf16=False, name="f32")
    ctx16 = _prepare(tmp_path, monkeypatch, has_bf16=True, name="bf16")
    assert next(ctx32.loaded.model.parameters()).dtype == torch.float32
    assert next(ctx16.loaded.model.parameters()).dtype == torch.bfloat16
    assert ctx32.fingerprint == ctx16.fingerprint  # taken from the BF16 weights: caches and recheck see one model
    assert (ctx32.scoring_place, ctx16.scoring_place) == ("cpu (float32 arithmetic)", "cpu")
    assert torch.equal(ctx32.tokens.heldout, ctx16.tokens.heldout)
    groups = ctx32.loaded.shape.groups
    assert ctx32.evaluate(Plan.uniform(groups, Format.BF16)).kl == pytest.approx(0.0, abs=1e-6)
    fp8_32 = ctx32.evaluate(Plan.uniform(groups, Format.FP8))
    fp8_16 = ctx16.evaluate(Plan.uniform(groups, Format.FP8))
    assert fp8_32.kl > 0 and fp8_32.kl == pytest.approx(fp8_16.kl, rel=0.1)
    assert fp8_32.ppl_bf16 == pytest.approx(fp8_16.ppl_bf16, rel=0.02)


def test_a_study_scored_one_way_refuses_a_process_that_scores_another():
    check_same_scoring("cpu (float32 arithmetic)", "cpu (float32 arithmetic)", "s", "--resume")
    check_same_scoring(None, "cpu", "s", "--resume")  # a study made before the place was stored
    with pytest.raises(InputError, match=r"--resume: study 's' scores accuracy on cpu, this process on cpu \(float32"):
        check_same_scoring("cpu", "cpu (float32 arithmetic)", "s", "--resume")


def test_a_search_resumed_on_a_cpu_that_scores_otherwise_is_refused_before_any_trial(tmp_path, monkeypatch):
    import io

    import optuna
    from rich.console import Console

    from advisor.workflows.search import run

    recipe = _recipe(tmp_path, "r", 32, search={"trials": 2, "sampler": "random", "seed": 0})
    quiet = Console(file=io.StringIO())
    monkeypatch.setattr(arithmetic, "cpu_has_bf16_matmul", lambda: True)
    run(recipe, console=quiet)
    more = recipe.model_copy(update={"search": recipe.search.model_copy(update={"trials": 4})})
    monkeypatch.setattr(arithmetic, "cpu_has_bf16_matmul", lambda: False)
    with pytest.raises(InputError, match=r"scores accuracy on cpu, this process on cpu \(float32 arithmetic\)"):
        run(more, resume=True, console=quiet)
    study = optuna.load_study(study_name="r", storage=recipe.storage_url)
    assert len(study.trials) == 2 and study.user_attrs["device"] == "cpu"
