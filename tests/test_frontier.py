from __future__ import annotations

from advisor.formats import Format
from advisor.plan import Plan
from advisor.search.acceptance import PlanAcceptance, TaskAcceptance, Verdict
from advisor.search.frontier import Candidate, hypervolume, pareto_front, recommend
from advisor.search.stats import PairedInterval


def judged(verdict: Verdict) -> PlanAcceptance:
    task = TaskAcceptance("piqa", "acc,none", 100, 1, PairedInterval(100, 0.0, -0.01, 0.01, 0.95, "t"), verdict)
    return PlanAcceptance(verdict, (task,))


def cand(trial, fmt_a, fmt_b, kl, j, feasible=True, verdict=None):
    acceptance = judged(verdict) if verdict is not None else None
    return Candidate(trial, Plan({"a": fmt_a, "b": fmt_b}), kl, 10.0, {"w": j, "v": j}, feasible,
                     acceptance=acceptance)


BF16 = cand(0, Format.BF16, Format.BF16, 0.0, 2.0)


def test_front_drops_dominated_and_infeasible_points():
    cands = [BF16, cand(1, Format.FP8, Format.FP8, 0.02, 1.0), cand(2, Format.FP8, Format.BF16, 0.03, 1.5),
             cand(3, Format.NVFP4, Format.NVFP4, 0.5, 0.5, feasible=False)]
    assert [c.trial for c in pareto_front(cands, "w")] == [1, 0]
    assert [c.trial for c in pareto_front(cands, "w", feasible_only=False)] == [3, 1, 0]


def test_hypervolume_of_a_staircase():
    assert hypervolume([(1, 3), (2, 2), (3, 1)], (4, 4)) == 3 + 2 + 1
    assert hypervolume([(5, 5)], (4, 4)) == 0


def test_recommendation_is_lowest_energy_within_budget():
    cands = [BF16, cand(1, Format.FP8, Format.FP8, 0.02, 1.0), cand(2, Format.NVFP4, Format.FP8, 0.3, 0.7, False)]
    rec = recommend(cands, ["w"])
    assert rec.candidate.trial == 1 and "proxy KL" in rec.accuracy_metric


def test_never_recommends_a_plan_costlier_than_bf16_on_any_workload():
    costly = Candidate(1, Plan({"a": Format.FP8, "b": Format.FP8}), 0.01, 10.0, {"w": 1.0, "v": 3.0}, True)
    rec = recommend([BF16, costly], ["w", "v"])
    assert rec.candidate.trial == 0


def test_benchmark_verdicts_take_over_from_the_proxy():
    """Once lm-eval judged plans, only a plan that passes (or BF16, the reference) is eligible:
    an unjudged or undecided plan is not, however cheap."""
    passes = cand(1, Format.FP8, Format.BF16, 0.02, 1.5, verdict=Verdict.PASSES)
    unjudged = cand(2, Format.FP8, Format.FP8, 0.03, 1.0)
    undecided = cand(3, Format.NVFP4, Format.FP8, 0.04, 0.8, verdict=Verdict.UNDECIDED)
    rec = recommend([cand(0, Format.BF16, Format.BF16, 0.0, 2.0), passes, unjudged, undecided], ["w"])
    assert rec.candidate.trial == 1 and "lm-eval" in rec.accuracy_metric
    rec = recommend([cand(0, Format.BF16, Format.BF16, 0.0, 2.0), unjudged, undecided], ["w"])
    assert rec.candidate.trial == 0 and "1 cheaper plan(s) judged by lm-eval stayed undecided" in rec.reason
