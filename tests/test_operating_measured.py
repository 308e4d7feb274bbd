"""Operating points as measured (advisor.search.operating._measured): each measured plan metered at its own
operating batch, recorded beside the predicted point, and shown in the report; with synthetic step times, a
fake measured tier and the fake vllm module."""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass, field

import pytest
from rich.console import Console

from advisor.estimate import EnergyEstimate
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe import validate_recipe
from advisor.recipe.schema import Workload
from advisor.report.operating_md import operating_lines, operating_section
from advisor.report.summary import build_summary
from advisor.search.measured import EXTRA_METERINGS, MeasuredTier
from advisor.search.operating import (
    MeasuredPoint,
    at_batch,
    from_steps,
    from_timed,
    meets_as_measured,
    objective_name,
    operating_points,
    steady_state,
)
from advisor.search.study import open_study, run_search, save_run_meta
from advisor.search.trial_record import measured_points, record_operating_points
from advisor.testing import AdditiveEvaluator
from advisor.workflows.operating import measured_operating_stage
from advisor.workflows.progress import ProgressReporter
from advisor.workflows.search import energy_stage

GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))
SHAPE = ModelShape(GROUPS, 3, 64, 4, 4, 16, 100, 6400)
BF16 = Plan.uniform(GROUPS, Format.BF16)
FP8 = Plan.uniform(GROUPS, Format.FP8)
CHAT = Workload(name="chat", batch_size=4, input_tokens=64, output_tokens=32, tpot_ms=3.0, max_concurrency=512)


class Steps:
    """Predicted step times: decode 1 + 0.02 b ms (FP8: 0.5 + 0.01 b) at 400 W, a 2 ms prefill."""

    def decode_step(self, plan, batch, context):
        fp8 = Format.FP8 in plan.formats.values()
        ms = (0.5 + 0.01 * batch) if fp8 else (1.0 + 0.02 * batch)
        return ms, 0.4 * ms

    def prefill(self, plan, length):
        return 2.0, 0.8


def test_meets_as_measured_judges_only_what_was_timed():
    both = Workload(name="w", tpot_ms=10.0, ttft_ms=100.0)
    assert meets_as_measured(both, 9.0, 90.0) is True
    assert meets_as_measured(both, 11.0, None) is False  # one missed term is enough
    assert meets_as_measured(both, 9.0, None) is None  # TTFT not timed: not known
    assert meets_as_measured(Workload(name="w", tpot_ms=10.0), 9.0, None) is True  # TTFT not asked


def test_measured_steps_compose_into_the_steady_state_as_the_prediction_does():
    w = at_batch(CHAT, 64)
    assert (w.name, w.batch_size, objective_name(w)) == ("chat at batch 64", 64, "chat")
    dec_ms, dec_j = Steps().decode_step(BF16, 64, 0)
    point = from_steps(BF16, w, dec_ms, dec_j, 2.0, 0.8, "measured (Fake GPU)")
    predicted = steady_state(Steps(), BF16, CHAT, 64)
    assert (point.tpot_ms, point.ttft_ms, point.j_per_token) == pytest.approx(
        (predicted.tpot_ms, predicted.ttft_ms, predicted.j_per_token))
    assert point.decode_step_ms == dec_ms < point.tpot_ms  # the prefills' share rides on every token
    assert point.workload == "chat" and point.meets is (predicted.tpot_ms <= 3.0)
    assert point.source.startswith("measured (Fake GPU); TPOT/TTFT: measured step times")


def test_an_engine_row_gives_the_objectives_percentile_or_leaves_it_unknown():
    w = at_batch(CHAT.model_copy(update={"percentile": "p90"}), 32)
    timed = {"j_per_token": 0.2, "tokens_per_s": 900.0, "tpot_ms_p50": 2.0, "tpot_ms_p90": 3.5,
             "ttft_ms_p50": 20.0, "ttft_ms_p90": None}
    point = from_timed(BF16, w, timed, "measured (vLLM)")
    assert (point.tpot_ms, point.ttft_ms, point.meets, point.batch) == (3.5, None, False, 32)
    untimed = from_timed(BF16, w, {"j_per_token": 0.2, "tokens_per_s": 900.0}, "measured (vLLM)")
    assert (untimed.tpot_ms, untimed.meets) == (None, None)


@dataclass
class FakeMeasured(MeasuredTier):
    """A measured tier that gives J/token only (as TensorRT-LLM's does): 10% above the prediction's J/token."""

    label: str = "measured (Fake GPU, driver 0, 2026-11-27)"
    measured: bool = True
    batches: list[tuple[str, int]] = field(default_factory=list)

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        self.batches.append((plan.id, workload.batch_size))
        j = steady_state(Steps(), plan, workload, workload.batch_size).j_per_token * 1.1
        return EnergyEstimate(workload.name, j, j, j / 10, 1e3, self.label, True)


class FakeTimed(FakeMeasured):
    """A measured tier that times requests: TPOT 40% above the predicted step time."""

    def measure_points(self, plan: Plan, workloads):
        out = []
        for w in workloads:
            self.batches.append((plan.id, w.batch_size))
            s = steady_state(Steps(), plan, w, w.batch_size)
            out.append(from_timed(plan, w, {"j_per_token": s.j_per_token, "tokens_per_s": s.tokens_per_s,
                                            "tpot_ms_p50": 1.4 * s.tpot_ms, "ttft_ms_p50": s.ttft_ms}, self.label))
        return out


@dataclass
class Ctx:
    measured_model: FakeMeasured


@pytest.fixture
def study_and_recipe(tmp_path):
    recipe = validate_recipe({"name": "s", "target": "h100", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "workloads": [CHAT.model_dump()],
                              "search": {"trials": 8, "seed": 1, "sampler": "random", "measured_candidates": 1}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, {"version": "test", "recipe": recipe.model_dump(mode="json"), "shape": SHAPE.to_dict(),
                          "model": {"name": "fake", "fingerprint": "0"}})
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    return study, recipe


def _stages(study, recipe, fake) -> str:
    from advisor.search.study import candidates

    buf = io.StringIO()
    progress = ProgressReporter(Console(file=buf, width=200), heartbeat=False)
    energy_stage(study, Ctx(fake), recipe, progress)
    plans = list({c.plan.id: c.plan for c in candidates(study)}.values())
    points = operating_points(Steps(), SHAPE, GPU_SPECS[GPU.H100], plans, recipe.workloads, lambda p: "predicted")
    record_operating_points(study, [p.to_dict() for p in points])
    fake.batches.clear()
    measured_operating_stage(study, Ctx(fake), recipe, progress)
    return buf.getvalue()


def test_each_measured_plan_is_metered_at_its_own_operating_batch(study_and_recipe):
    study, recipe = study_and_recipe
    fake = FakeTimed()
    _stages(study, recipe, fake)
    summary = build_summary(study)
    points = {p.plan_id: p for p in summary.operating_points}
    bf16, fp8 = points[BF16.id], points[FP8.id]
    assert bf16.batch < fp8.batch  # the faster plan serves a larger batch under the same objective
    assert (BF16.id, bf16.batch) in fake.batches and (FP8.id, fp8.batch) in fake.batches
    assert all(b != recipe.workloads[0].batch_size for _, b in fake.batches)  # not the stated batch
    m = fp8.measured
    # predicted to meet at its batch, measured 40% slower there: searched down to the largest batch that meets
    assert m is not None and m.predicted_batch == fp8.batch and m.trail[0].batch == fp8.batch
    assert m.trail[0].meets is False and m.trail[0].tpot_ms == pytest.approx(1.4 * fp8.tpot_ms)
    assert len(m.trail) <= 1 + EXTRA_METERINGS and [t.batch for t in m.trail] == [
        b for pid, b in fake.batches if pid == FP8.id]
    true = max(b for b in range(1, fp8.batch) if 1.4 * steady_state(Steps(), FP8, CHAT, b).tpot_ms <= 3.0)
    assert m.batch == true and m.meets is True and m.tpot_ms <= 3.0
    assert m.j_per_token == pytest.approx(steady_state(Steps(), FP8, CHAT, true).j_per_token)
    assert m.search.startswith(f"batch {true} ") and "meets as measured" in m.search
    assert m.prediction_error_pct["tpot_ms"] == pytest.approx(100 * (1 / 1.4 - 1))  # at the predicted batch
    assert m.prediction_error_pct["j_per_token"] == pytest.approx(0.0, abs=1e-9)
    assert m.source.startswith("measured (Fake GPU") and m.measured_at
    unmeasured = [p for p in summary.operating_points if p.plan_id not in {BF16.id, FP8.id} and p.measured is None]
    assert all(p.plan_id not in {k for k, _ in measured_points(study)} for p in unmeasured)
    # every plan the rule compares was measured: it compared the measured points
    assert summary.operating_basis["chat"].measured and "measured (Fake GPU" in summary.recommendation.reason
    text = "\n".join(operating_section(summary.model_dump(mode="json")))
    assert "largest batch (measured)" in text and "TPOT ms (predicted)" in text
    assert f"- all-fp8: metered batches {fp8.batch} (" in text and f"misses), {m.trail[1].batch} (" in text
    assert f"at batch {fp8.batch} the prediction is off by J/token +0%, TPOT -29%." in text
    assert "Measured from the predicted batch down: measured (Fake GPU" in text
    assert "compared these plans at their operating points as measured: measured (Fake GPU" in text
    assert any(f"(measured: batch {true} at " in line for line in operating_lines(summary.model_dump(mode="json")))
    as_fp8 = {**summary.model_dump(mode="json"), "recommendation": {"plan_id": FP8.id}}
    assert (f"**As measured, the recommendation meets this objective at batch {true}, not the predicted "
            f"{fp8.batch}**") in "\n".join(operating_section(as_fp8))
    assert "As measured" not in "\n".join(operating_section({**as_fp8, "recommendation": {"plan_id": "other"}}))
    # again: nothing is metered twice at the same batch
    fake.batches.clear()
    measured_operating_stage(study, Ctx(fake), recipe, ProgressReporter(Console(file=io.StringIO()), heartbeat=False))
    assert fake.batches == []


def test_an_engine_without_timings_leaves_the_objective_unknown_as_measured(study_and_recipe):
    study, recipe = study_and_recipe
    _stages(study, recipe, FakeMeasured())
    summary = build_summary(study)
    m = next(p.measured for p in summary.operating_points if p.plan_id == FP8.id)
    assert m.tpot_ms is None and m.meets is None and "TPOT/TTFT not timed" in m.source
    assert "| not timed |" in "\n".join(operating_section(summary.model_dump(mode="json")))


def test_a_point_the_tier_cannot_meter_says_why(study_and_recipe):
    from advisor.errors import UnsupportedError

    class TooBig(FakeTimed):
        def measure_points(self, plan, workloads):
            raise UnsupportedError("batch 400 needs 90 GiB")

    study, recipe = study_and_recipe
    log = _stages(study, recipe, TooBig())
    assert "operating points not measured (batch 400 needs 90 GiB)" in log
    summary = build_summary(study)
    m = next(p.measured for p in summary.operating_points if p.plan_id == FP8.id)
    assert m.not_measured == "batch 400 needs 90 GiB" and m.j_per_token is None
    assert "Not measured: batch 400 needs 90 GiB." in "\n".join(operating_section(summary.model_dump(mode="json")))


def test_vllm_meters_a_plans_operating_points_in_one_engine(tmp_path, monkeypatch):
    import json

    from advisor.deploy.vllm import VllmEnergyModel, serve
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "vocab_size": 64}))
    jobs, rows = [], {}

    def runner(job):
        jobs.append(job)
        out = serve(job, make_counter=ConstantPowerCounter)
        rows.update(out["energy"])
        return out

    fast = MeterConfig(warmup_s=0.5, min_window_s=0.2, min_ticks=10, repeats=3, idle_s=0.02, max_cv=0.5)
    model = VllmEnergyModel(lambda plan: ck, [CHAT], 64, meter=fast, runner=runner)
    small = CHAT.model_copy(update={"input_tokens": 8, "output_tokens": 8})
    points = model.measure_points(BF16, [at_batch(small, 2), at_batch(small, 6)])
    assert len(jobs) == 1 and [w["batch_size"] for w in jobs[0].workloads] == [2, 6]
    assert not jobs[0].prefill and not jobs[0].formats
    assert [p.batch for p in points] == [2, 6] and all(isinstance(p, MeasuredPoint) for p in points)
    assert all(p.workload == "chat" and p.j_per_token > 0 and p.tokens_per_s > 0 for p in points)
    assert points[1].tokens_per_s > points[0].tokens_per_s  # three times the requests per step
    # the serving rows' latency keys are read where they exist (p50 here); absent ones leave TPOT unknown
    for p in points:
        row = rows[f"chat at batch {p.batch}"]
        assert (p.tpot_ms, p.ttft_ms) == (row.get("tpot_ms_p50"), row.get("ttft_ms_p50"))
    assert vllm.instances[0].llm_engine.most_running == 6


def test_the_builtin_runtime_composes_its_measured_steps_and_refuses_a_batch_that_does_not_fit(monkeypatch):
    import torch

    from advisor.energy.measure import MeasuredEnergyModel
    from advisor.errors import UnsupportedError

    runtime = MeasuredEnergyModel.__new__(MeasuredEnergyModel)  # its GPU parts stubbed: the steps are given
    runtime.shape, runtime.label = SHAPE, "measured (Fake GPU, driver 0, 2026-11-27; llama)"
    steps = Steps()

    def measure_steps(plan, workload):
        ms, j = steps.decode_step(plan, workload.batch_size, 0)
        decode = {"ms_per_step": ms, "j_per_step": j, "tokens_per_s": workload.batch_size / ms * 1e3}
        return {"ms_per_step": 2.0, "j_per_step": 0.8}, decode

    runtime.measure_steps = measure_steps
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 2**30, 80 * 2**30))
    (point,) = runtime.measure_points(FP8, [at_batch(CHAT, 100)])
    predicted = steady_state(steps, FP8, CHAT, 100)
    assert (point.batch, point.tpot_ms, point.j_per_token) == (100, pytest.approx(predicted.tpot_ms),
                                                               pytest.approx(predicted.j_per_token))
    assert point.decode_step_ms == pytest.approx(1.5) and point.source.startswith("measured (Fake GPU")
    est = runtime.estimate(FP8, CHAT)  # the stated batch, from the same measured steps
    assert est.measured and est.j_per_token == pytest.approx((0.8 + 32 * steps.decode_step(FP8, 4, 0)[1] / 4) / 32)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2**30, 80 * 2**30))
    with pytest.raises(UnsupportedError, match="batch 4096 of 'chat at batch 4096' needs about"):
        runtime.measure_points(FP8, [at_batch(CHAT, 4096)])


def test_the_frontier_plot_marks_the_measured_points(study_and_recipe, tmp_path):
    from advisor.report.plots import plot_operating_points

    study, recipe = study_and_recipe
    _stages(study, recipe, FakeTimed())
    plot_operating_points(build_summary(study).model_dump(mode="json"), tmp_path / "op.png")
    assert (tmp_path / "op.png").read_bytes()[:4] == b"\x89PNG"


def _fake_vllm_model(tmp_path, monkeypatch, workloads):
    import json

    from advisor.deploy.vllm import VllmEnergyModel, serve
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001, step_s_per_seq=0.0005)  # TPOT grows with the batch: about 1 + 0.5 b ms
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "vocab_size": 64}))
    jobs, round_jobs = [], []

    def runner(job):
        jobs.append(job)
        return serve(job, make_counter=ConstantPowerCounter)

    def rounds_runner(job, more):
        round_jobs.append(job)
        return serve(job, make_counter=ConstantPowerCounter, more=more)

    fast = MeterConfig(warmup_s=0.5, min_window_s=0.2, min_ticks=10, repeats=3, idle_s=0.02, max_cv=0.5)
    model = VllmEnergyModel(lambda plan: ck, workloads, 64, meter=fast, runner=runner, rounds_runner=rounds_runner)
    return model, vllm, jobs, round_jobs


OBJECTIVE = Workload(name="chat", batch_size=2, input_tokens=8, output_tokens=8, tpot_ms=6.0)
PREDICTED_CURVE = [(b, 0.25 * b, 1.0 / b) for b in (1, 2, 4, 8, 16, 32)]  # predicts batch 24 at 6 ms


def test_vllm_searches_a_missed_operating_point_in_one_engine(tmp_path, monkeypatch):
    from advisor.search.measured import BatchSearch, search_batches

    model, vllm, jobs, round_jobs = _fake_vllm_model(tmp_path, monkeypatch, [OBJECTIVE])
    (got,) = search_batches(model, BF16, [BatchSearch(OBJECTIVE, 24, PREDICTED_CURVE)])
    assert jobs == [] and len(round_jobs) == 1 and len(vllm.instances) == 1  # every round in one engine
    assert round_jobs[0].max_batch == 24 and vllm.instances[0].kwargs["max_num_seqs"] == 24
    trail = got["trail"]
    assert trail[0]["batch"] == 24 and trail[0]["meets"] is False and 2 <= len(trail) <= 1 + EXTRA_METERINGS
    assert len({t["batch"] for t in trail}) == len(trail) and all(t["batch"] < 24 for t in trail[1:])
    assert all(t["meets"] is (t["tpot_ms"] <= 6.0) for t in trail)  # judged on the engine's own timings
    met = [t["batch"] for t in trail if t["meets"]]
    assert got["meets"] is True and got["batch"] == max(met) and got["tpot_ms"] <= 6.0
    assert got["source"].startswith("measured (vLLM 0.0-fake") and got["predicted_batch"] == 24


def test_vllm_reads_the_first_round_back_and_starts_an_engine_only_for_more(tmp_path, monkeypatch):
    from advisor.search.measured import BatchSearch, search_batches

    model, vllm, jobs, round_jobs = _fake_vllm_model(tmp_path, monkeypatch, [OBJECTIVE, at_batch(OBJECTIVE, 24)])
    model.estimate(BF16, OBJECTIVE)  # as `advisor measure` does: the stated and the predicted batch in one engine
    (got,) = search_batches(model, BF16, [BatchSearch(OBJECTIVE, 24, PREDICTED_CURVE)])
    assert len(jobs) == 1 and len(round_jobs) == 1 and len(vllm.instances) == 2
    assert 24 not in [w["batch_size"] for w in round_jobs[0].workloads] and round_jobs[0].max_batch == 24
    assert got["trail"][0]["batch"] == 24 and got["trail"][0]["meets"] is False and len(got["trail"]) >= 2


def test_vllm_searches_each_plans_operating_points_in_the_engine_that_meters_it(study_and_recipe, tmp_path,
                                                                                 monkeypatch):
    """The measured tier through vLLM: a plan's stated workloads and its operating-point searches in one engine
    (an engine start is 1-2 minutes on a GPU); the later measured operating-points stage starts none."""
    from advisor.search.study import candidates
    from advisor.search.trial_record import measured_energy

    study, recipe = study_and_recipe
    model, vllm, jobs, round_jobs = _fake_vllm_model(tmp_path, monkeypatch, list(recipe.workloads))
    plans = list({c.plan.id: c.plan for c in candidates(study)}.values())
    predicted = operating_points(Steps(), SHAPE, GPU_SPECS[GPU.H100], plans, recipe.workloads, lambda p: "predicted")
    record_operating_points(study, [p.to_dict() for p in predicted])
    progress = ProgressReporter(Console(file=io.StringIO(), width=200), heartbeat=False)
    energy_stage(study, Ctx(model), recipe, progress)
    metered = set(measured_energy(study))
    assert {BF16.id, FP8.id} <= metered
    assert len(round_jobs) == len(metered)  # one engine a plan, its searches in it
    drift = [j for j in jobs if "chat" in [w["name"] for w in j.workloads]]
    assert len(vllm.instances) == len(metered) + len(drift) and len(drift) == 1  # the drift check serves afresh
    for job in round_jobs:
        names = [w["name"] for w in job.workloads]
        assert names[0] == "chat" and job.no_prefill == tuple(names[1:]) and len(names) == 2
    searched = measured_points(study)
    assert {pid for pid, _ in searched} == metered
    batches = {d["plan_id"]: d["batch"] for d in (p.to_dict() for p in predicted)}
    for (pid, workload), m in searched.items():
        assert workload == "chat" and m["predicted_batch"] == batches[pid] == m["trail"][0]["batch"]
        assert m["source"].startswith("measured (vLLM 0.0-fake") and len(m["trail"]) <= 1 + EXTRA_METERINGS
    estimates = measured_energy(study)[FP8.id]
    assert estimates[0].workload == "chat" and estimates[0].prefill_j_per_input_token > 0  # the stated row
    engines = len(vllm.instances)
    measured_operating_stage(study, Ctx(model), recipe, progress)
    assert len(vllm.instances) == engines  # nothing left to search
