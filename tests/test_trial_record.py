"""What the study stores per trial and per plan (search.trial_record): typed round trips, studies written before
the accessor existed (their attributes as literal JSON) still reported, and foreign attributes refused."""

from __future__ import annotations

import optuna
import pytest

from advisor.errors import InputError
from advisor.estimate import DriftCheck, EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import Recipe, validate_recipe
from advisor.report.summary import build_summary, write_report
from advisor.search.study import candidates, open_study, run_search, save_run_meta
from advisor.search.trial_record import (
    TrialScores,
    benchmark_scores,
    energy_of,
    measured_drifts,
    measured_energy,
    record_drift,
    record_measured,
    record_scores,
    scores_of,
)
from advisor.testing import AdditiveEvaluator

GROUPS = (LayerGroup("layers.0.qkv", ("m0",), ((64, 64),)), LayerGroup("layers.0.down", ("m1",), ((64, 64),)))
SHAPE = ModelShape(GROUPS, 1, 64, 4, 4, 16, 100, 6400)


def _study(tmp_path, trials: int = 4) -> tuple[optuna.Study, Recipe]:
    recipe = validate_recipe({"name": "r", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "search": {"trials": trials, "seed": 0, "sampler": "random"}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, {"version": "test", "recipe": recipe.model_dump(mode="json"), "shape": SHAPE.to_dict(),
                          "model": {"name": "fake", "fingerprint": "0"}})
    return study, recipe


def _estimate(j: float, measured: bool) -> EnergyEstimate:
    return EnergyEstimate("chat", j, 0.8 * j, 0.1 * j, 1000.0, "measured (GPU X)" if measured else "predicted (X)",
                          measured)


def test_scores_measured_energy_and_drift_come_back_as_they_were_stored(tmp_path):
    study, _ = _study(tmp_path)
    scores = TrialScores(0.01, 10.5, 10.0, (_estimate(2.0, False),), (-0.09,), "abc", "all-fp8", repeat=False)
    trial = study.ask()
    record_scores(trial, scores)
    study.tell(trial, [0.01, 2.0])
    (frozen,) = study.get_trials(deepcopy=False)
    assert scores_of(frozen) == scores and energy_of(frozen) == [_estimate(2.0, False)]
    assert scores_of(frozen).ppl_increase_pct == pytest.approx(5.0)

    record_measured(study, "abc", [_estimate(1.5, True)])
    assert measured_energy(study) == {"abc": [_estimate(1.5, True)]}
    check = DriftCheck("abc", "all-fp8", "measured (GPU X)", "2026-01-01T00:00:00+00:00", {"chat": 1.5},
                       {"chat": 1.53}, {"chat": 2.0})
    record_drift(study, check)
    assert measured_drifts(study) == [check]


# Attributes as the advisor stored them before search.trial_record (JSON as Optuna keeps it; from a real run).
OLD_ENERGY = [{"workload": "chat", "j_per_token": 0.24011456943758233, "decode_j_per_token": 0.20378129528985506,
               "prefill_j_per_input_token": 0.018166637073863637, "decode_tokens_per_s": 2425.050470523405,
               "source": "predicted (per-model profile, NVIDIA H100 80GB HBM3)", "measured": False}]
OLD_MEASURED = [{"workload": "chat", "j_per_token": 0.24142359854193035, "decode_j_per_token": 0.20487937005277046,
                 "prefill_j_per_input_token": 0.018272114244579946, "decode_tokens_per_s": 2425.5406673944026,
                 "source": "measured (NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-26)", "measured": True}]
OLD_DRIFT = {"plan_id": "x", "plan": "all-bf16", "source": "measured (NVIDIA H100 80GB HBM3)",
             "measured_at": "2026-11-26T12:40:08+00:00", "first_j_per_token": {"chat": 0.24142359854193035},
             "again_j_per_token": {"chat": 0.24465778174695144}, "drift_pct": {"chat": 1.3396301043285819}}


def test_a_study_written_before_the_accessor_is_still_reported(tmp_path):
    study, recipe = _study(tmp_path)
    bf16 = Plan.uniform(GROUPS, Format.BF16)
    fp8 = Plan.uniform(GROUPS, Format.FP8)
    dist = optuna.distributions.CategoricalDistribution(["bf16", "fp8", "nvfp4"])
    for plan, kl, scale in ((bf16, 0.0, 1.0), (fp8, 0.02, 0.7)):
        energy = [{**OLD_ENERGY[0], "j_per_token": OLD_ENERGY[0]["j_per_token"] * scale}]
        study.add_trial(optuna.trial.create_trial(
            params=plan.params(), distributions={g.name: dist for g in GROUPS}, values=[kl, energy[0]["j_per_token"]],
            user_attrs={"worker": {"host": "h", "pid": 1, "gpu_uuid": None}, "repeat": False, "plan_id": plan.id,
                        "label": plan.label(), "kl": kl, "ppl": 10.0 + kl, "ppl_bf16": 10.0, "energy": energy,
                        "constraint": [kl - 0.1]}))
    study.set_user_attr(f"measured_energy:{bf16.id}", OLD_MEASURED)
    study.set_user_attr("measured_drift:00000001764160808000000000", {**OLD_DRIFT, "plan_id": bf16.id})
    study.set_user_attr("benchmark", {fp8.id: {"piqa": {"acc": 0.61, "acc_stderr": 0.01, "n": 100}}})  # oldest form

    by_plan = {c.plan.id: c for c in candidates(study)}
    assert by_plan[bf16.id].energy_measured and by_plan[bf16.id].energy("chat") == OLD_MEASURED[0]["j_per_token"]
    assert by_plan[fp8.id].predicted_j_per_token == {"chat": OLD_ENERGY[0]["j_per_token"] * 0.7}
    assert by_plan[fp8.id].benchmark == {"piqa": 0.61}
    assert benchmark_scores(study)[fp8.id]["piqa"]["metric"] == "acc,none"

    summary = build_summary(study)
    rec_bf16 = summary.record(bf16.id)
    assert [e.to_dict() for e in rec_bf16.energy] == OLD_MEASURED
    assert [e.to_dict() for e in rec_bf16.predicted_energy] == OLD_ENERGY
    assert rec_bf16.prediction_error_pct["chat"] == pytest.approx(
        100 * (OLD_ENERGY[0]["j_per_token"] / OLD_MEASURED[0]["j_per_token"] - 1))
    assert summary.measured_drift[0].drift_pct == OLD_DRIFT["drift_pct"]
    assert summary.recommendation is not None and summary.recommendation.plan_id == bf16.id  # measured plans only
    md = write_report(study, recipe.run_dir).read_text()
    assert "## Energy: predicted / measured" in md and "(+1.3%) on 'chat'" in md


def test_an_attribute_another_tool_wrote_is_refused_with_its_name(tmp_path):
    study, _ = _study(tmp_path)
    run_search(study, AdditiveEvaluator(), validate_recipe({
        "name": "r", "target": "b200", "out": str(tmp_path), "search": {"trials": 3, "seed": 0}}), GROUPS)
    study.set_user_attr("measured_energy:abc", [{"workload": "chat", "j_per_token": "lots"}])
    with pytest.raises(InputError, match="measured_energy:abc"):
        candidates(study)
