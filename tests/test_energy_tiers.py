"""Two energy tiers: predicted for every trial, measured for the baselines and the front; measured
numbers decide where they exist, and the report shows both."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from advisor.errors import UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe import validate_recipe
from advisor.report.summary import build_summary, write_report
from advisor.search.energy_tiers import measured_energy
from advisor.search.study import candidates, open_study, run_search, save_run_meta
from advisor.testing import AdditiveEvaluator
from advisor.workflows.progress import ProgressReporter
from advisor.workflows.search import energy_stage

GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))


@dataclass
class FakeMeasured:
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
    assert len(fake.calls) <= 2 + recipe.search.measured_candidates
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
