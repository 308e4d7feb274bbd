"""Two energy tiers: predicted for every trial, measured for the baselines and the front; measured
numbers decide where they exist, and the report shows both."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from advisor.errors import Interrupted, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe import validate_recipe
from advisor.report.summary import build_summary, write_report
from advisor.search.measured import MeasuredTier
from advisor.search.policy import benchmark_targets, measurement_targets
from advisor.search.study import candidates, open_study, run_search, save_run_meta
from advisor.search.trial_record import measured_drifts, measured_energy
from advisor.testing import AdditiveEvaluator
from advisor.workflows.progress import ProgressReporter
from advisor.workflows.search import energy_stage

GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))


@dataclass
class FakeMeasured(MeasuredTier):
    """A 'GPU' on which FP8 saves less than predicted and NVFP4 cannot run (Hopper)."""

    label: str = "measured (Fake GPU, driver 0, 2026-11-22)"
    measured: bool = True
    calls: list[str] = field(default_factory=list)

    def estimate(self, plan: Plan, workload) -> EnergyEstimate:
        if Format.NVFP4 in plan.formats.values():
            raise UnsupportedError("NVFP4 cannot be measured on this GPU")
        self.calls.append(plan.id)
        n_fp8 = sum(f == Format.FP8 for f in plan.formats.values())
        j = 2.0 - 0.05 * n_fp8
        return EnergyEstimate(workload.name, j, j, j / 10, 1 / j, self.label, True)


@dataclass
class Ctx:
    measured_model: FakeMeasured


@pytest.fixture
def study_and_recipe(tmp_path):
    recipe = validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "search": {"trials": 12, "seed": 1, "sampler": "random", "measured_candidates": 2}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    shape = ModelShape(GROUPS, 3, 64, 4, 4, 16, 100, 6400)
    save_run_meta(study, {"version": "test", "recipe": recipe.model_dump(mode="json"), "shape": shape.to_dict(),
                          "model": {"name": "fake", "fingerprint": "0"}})
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    return study, recipe


def _stage(study, recipe, fake):
    buf = io.StringIO()
    energy_stage(study, Ctx(fake), recipe, ProgressReporter(Console(file=buf, width=200), heartbeat=False))
    return buf.getvalue()


def test_baselines_and_front_are_measured_and_replace_the_prediction(study_and_recipe):
    study, recipe = study_and_recipe
    fake = FakeMeasured()
    log = _stage(study, recipe, fake)
    measured = measured_energy(study)
    bf16 = Plan.uniform(GROUPS, Format.BF16).id
    assert bf16 in measured and Plan.uniform(GROUPS, Format.FP8).id in measured
    assert Plan.uniform(GROUPS, Format.NVFP4).id not in measured and "stays predicted" in log
    # the baselines that run, the candidates, and all-BF16 once more at the end (the drift check)
    assert len(fake.calls) <= 3 + recipe.search.measured_candidates and fake.calls[-1] == bf16
    by_id = {c.plan.id: c for c in candidates(study)}
    assert by_id[bf16].energy_measured and by_id[bf16].energy("chat") == pytest.approx(2.0)
    # a second stage measures nothing twice
    fake.calls.clear()
    _stage(study, recipe, fake)
    assert fake.calls == []


def test_recommendation_compares_measured_numbers_only_and_the_report_shows_both(study_and_recipe):
    study, recipe = study_and_recipe
    _stage(study, recipe, FakeMeasured())
    summary = build_summary(study)
    rec = summary.recommendation
    assert rec is not None and rec.energy_measured
    assert all(e.source.startswith("measured") for e in rec.energy)
    assert rec.prediction_error_pct and "chat" in rec.prediction_error_pct
    md = write_report(study, recipe.run_dir).read_text()
    assert "## Energy: predicted / measured" in md


def test_each_front_row_says_which_tier_its_energy_came_from(study_and_recipe):
    study, recipe = study_and_recipe
    _stage(study, recipe, FakeMeasured())
    summary = build_summary(study).model_dump(mode="json")
    by_trial = {r["trial"]: r for r in summary["trials"]}
    md = write_report(study, recipe.run_dir).read_text()
    front = md.split("## Pareto front (within budget)")[1].split("![accuracy vs energy]")[0]
    rows = [line for line in front.splitlines() if line.startswith("| ") and not line.startswith("| trial")]
    assert len(rows) == len(summary["front_trials"])
    for t, line in zip(summary["front_trials"], rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == str(t)
        assert cells[-2] == ("measured" if by_trial[t]["energy_measured"] else "predicted")
    tiers = {by_trial[t]["energy_measured"] for t in summary["front_trials"]}
    assert ("holds plans of both energy tiers" in front) == (len(tiers) == 2)
    rec_line = md.split("## Recommendation")[1].split("Why:")[0]
    assert FakeMeasured.label in rec_line and "predicted" not in rec_line


@dataclass
class DriftingMeasured(FakeMeasured):
    """The fake GPU drawing ``step`` more with every plan it measures, as a warming GPU can."""

    step: float = 0.01

    def estimate(self, plan: Plan, workload) -> EnergyEstimate:
        e = super().estimate(plan, workload)
        j = e.j_per_token * (1 + self.step * (len(self.calls) - 1))
        return EnergyEstimate(workload.name, j, j, j / 10, 1 / j, self.label, True)


def test_a_measured_stage_ends_with_a_drift_check_that_names_the_plans_it_cannot_order(study_and_recipe):
    study, recipe = study_and_recipe
    fake = DriftingMeasured()
    log = _stage(study, recipe, fake)
    bf16 = Plan.uniform(GROUPS, Format.BF16).id
    (check,) = measured_drifts(study)
    measured_in_stage = len(fake.calls)
    assert fake.calls[0] == fake.calls[-1] == bf16
    assert check.plan_id == bf16
    assert check.drift_pct["chat"] == pytest.approx(100 * fake.step * (measured_in_stage - 1))
    assert "drift check: all-bf16 measured again drew +" in log

    summary = build_summary(study)
    rec = summary.recommendation
    assert rec is not None and rec.energy_measured
    drift = abs(check.drift_pct["chat"])
    for r in summary.trials:
        if r.energy_measured and r.feasible and r.plan_id != rec.plan_id:
            within = abs(r.energy_by_workload()["chat"] / rec.energy_by_workload()["chat"] - 1) * 100 <= drift
            assert (r.trial in summary.near_ties) == within
    md = write_report(study, recipe.run_dir).read_text()
    assert "Drift checks" in md and f"({check.drift_pct['chat']:+.1f}%) on 'chat'" in md
    assert ("do not order them" in md) == bool(summary.near_ties)

    fake.calls.clear()  # nothing left to measure: no plan, and no second check
    _stage(study, recipe, fake)
    assert fake.calls == [] and len(measured_drifts(study)) == 1


def test_a_steady_gpu_has_no_drift_and_no_near_ties_between_different_energies(study_and_recipe):
    study, recipe = study_and_recipe
    _stage(study, recipe, FakeMeasured())
    (check,) = measured_drifts(study)
    assert check.drift_pct["chat"] == pytest.approx(0.0)
    summary = build_summary(study)
    rec_j = summary.recommendation.energy_by_workload()["chat"]
    by_trial = {r.trial: r for r in summary.trials}
    assert all(by_trial[t].energy_by_workload()["chat"] == pytest.approx(rec_j) for t in summary.near_ties)



@dataclass
class ScaledMeasured(FakeMeasured):
    """A fake GPU that measures ``scale`` times the predicted J/token (``scale`` > 1: drawing more, later)."""

    scale: float = 1.0

    def estimate(self, plan: Plan, workload) -> EnergyEstimate:
        super().estimate(plan, workload)  # records the call; refuses NVFP4
        j = AdditiveEvaluator().evaluate(plan).energy[0].j_per_token * self.scale
        return EnergyEstimate(workload.name, j, j, j / 10, 1 / j, self.label, True)


def test_a_later_stage_that_measures_more_checks_against_the_first_measurement(study_and_recipe):
    """A resumed search (another process) measures the plans left over, then all-BF16 again: the check compares
    with all-BF16 as the first stage measured it, so drift between the two processes shows."""
    study, recipe = study_and_recipe
    baselines_only = recipe.model_copy(update={"search": recipe.search.model_copy(update={"measured_candidates": 0})})
    _stage(study, baselines_only, ScaledMeasured())
    later = ScaledMeasured(scale=1.03)
    _stage(study, recipe, later)
    assert later.calls[0] != Plan.uniform(GROUPS, Format.BF16).id  # candidates first, all-BF16 only at the end
    first, second = measured_drifts(study)
    assert first.drift_pct["chat"] == pytest.approx(0.0)
    assert second.drift_pct["chat"] == pytest.approx(3.0)
    assert second.first_j_per_token["chat"] == pytest.approx(first.first_j_per_token["chat"])


@dataclass
class StopsAfter(ScaledMeasured):
    """A fake GPU run that is interrupted (Ctrl-C, a lost machine) after ``n`` measurements."""

    n: int = 1

    def estimate(self, plan: Plan, workload) -> EnergyEstimate:
        if len(self.calls) == self.n:
            raise Interrupted("stopped")
        return super().estimate(plan, workload)


def test_a_resumed_measured_stage_measures_the_plans_a_straight_run_would(study_and_recipe):
    """The GPU draws half what the fake model predicts. Once all-BF16 is measured, an unmeasured plan's prediction looks
    dearer than all-BF16's measurement; choosing by it would drop every candidate from the resumed stage."""
    study, recipe = study_and_recipe
    workloads = [w.name for w in recipe.workloads]
    queue = measurement_targets(study, workloads, recipe.search.measured_candidates)
    straight = {p.id for p in [queue.reference, *queue.baselines, *queue.candidates]
                if Format.NVFP4 not in p.formats.values()}
    assert queue.candidates
    with pytest.raises(Interrupted):
        _stage(study, recipe, StopsAfter(scale=0.5, n=1))
    assert set(measured_energy(study)) == {queue.reference.id}
    _stage(study, recipe, ScaledMeasured(scale=0.5))
    assert set(measured_energy(study)) == straight
    # lm-eval then ranks the measured plans only, as the recommendation does
    judged = benchmark_targets(study, workloads, recipe.search.measured_candidates)
    assert judged.candidates and {p.id for p in judged.candidates} <= straight


def test_the_trials_progress_line_names_the_best_plan_by_prediction_as_the_trial_lines_do(study_and_recipe):
    """Measured J/token (here half the prediction, all-BF16 only) must not win the progress line over predictions."""
    from advisor.search.policy import best_feasible_line

    study, recipe = study_and_recipe
    before = best_feasible_line(study, "chat")
    with pytest.raises(Interrupted):
        _stage(study, recipe, StopsAfter(scale=0.5, n=1))
    assert best_feasible_line(study, "chat") == before
    assert "all-bf16" not in before and before.endswith("J/token predicted")


def test_units_that_agree_or_were_never_checked_keep_their_numbers_as_measured():
    from advisor.estimate import MeasuredUnit
    from advisor.search.measured import on_one_unit, point_on_one_unit, unit_factors

    def est(j: float) -> list[EnergyEstimate]:
        return [EnergyEstimate("chat", j, j, j / 10, 1 / j, "measured (Fake GPU)", True)]

    units = [MeasuredUnit("GPU-a", "Fake GPU", est(1.0), ["bf16", "p1"]),
             MeasuredUnit("GPU-b", "Fake GPU", est(1.2), ["p2"])]
    measured = {"bf16": est(1.0), "p1": est(0.5), "p2": est(0.6)}
    for agree in (True, None):
        assert unit_factors(measured, units, {"agree": agree}) == ({}, None)
    factors, onto = unit_factors(measured, units[::-1], {"agree": False})  # the reference unit found, not taken first
    assert onto == "GPU-a" and set(factors) == {"p2"}
    scaled = on_one_unit(measured, factors, onto)
    assert scaled["p1"] == measured["p1"] and scaled["bf16"] == measured["bf16"]
    (p2,) = scaled["p2"]
    assert p2.j_per_token == pytest.approx(0.5) and p2.decode_j_per_token == pytest.approx(0.5)
    assert "put on GPU-a's scale" in p2.source
    # its operating point as measured at another batch takes the same factor; another plan's is left as it was
    point = {"plan_id": "p2", "workload": "chat", "batch": 48, "j_per_token": 0.3, "source": "measured (vLLM)"}
    moved = point_on_one_unit(point, factors, onto)
    assert moved["j_per_token"] == pytest.approx(0.25) and "put on GPU-a's scale" in moved["source"]
    assert point_on_one_unit({**point, "plan_id": "p1"}, factors, onto)["j_per_token"] == 0.3
