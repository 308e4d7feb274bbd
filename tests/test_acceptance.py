"""The per-task acceptance rule, sequential stopping on synthetic items with a known drop, and the
lm-eval stage's order (candidates by energy until one passes), all without a model."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console
from test_study import GROUPS, meta

from advisor.accuracy.score_cache import TaskScore
from advisor.formats import Format
from advisor.plan import Plan
from advisor.recipe.schema import validate_recipe
from advisor.search.acceptance import TaskAcceptance, Verdict, judge, plan_verdict, task_verdict
from advisor.search.frontier import recommend
from advisor.search.policy import PairedItems, benchmark_queue, item_schedule, judge_sequentially
from advisor.search.stats import PairedInterval, paired_drop
from advisor.search.study import candidates, open_study, run_search, save_run_meta
from advisor.search.trial_record import record_benchmark
from advisor.testing import AdditiveEvaluator


def interval(low: float, high: float) -> PairedInterval:
    return PairedInterval(400, (low + high) / 2, low, high, 0.95, "test")


def test_task_verdict_reads_the_interval_against_max_drop():
    assert task_verdict(interval(-0.01, 0.02), 0.03) is Verdict.PASSES
    assert task_verdict(interval(-0.01, 0.03), 0.03) is Verdict.PASSES  # "within" includes the edge
    assert task_verdict(interval(0.01, 0.05), 0.03) is Verdict.UNDECIDED
    assert task_verdict(interval(0.031, 0.09), 0.03) is Verdict.FAILS


def test_plan_verdict_needs_every_task():
    assert plan_verdict([Verdict.PASSES, Verdict.PASSES]) is Verdict.PASSES
    assert plan_verdict([Verdict.PASSES, Verdict.UNDECIDED]) is Verdict.UNDECIDED
    assert plan_verdict([Verdict.PASSES, Verdict.UNDECIDED, Verdict.FAILS]) is Verdict.FAILS
    with pytest.raises(ValueError):
        plan_verdict([])


def paired_items(n: int, worse: float, better: float, seed: int, base: float = 0.5) -> tuple[list[int], list[int]]:
    """BF16 items ~ Bernoulli(base); the plan loses a fraction ``worse`` of BF16's right answers'
    worth and gains ``better``: drop = worse - better in expectation."""
    rng = np.random.default_rng(seed)
    ref = (rng.random(n) < base).astype(int)
    u = rng.random(n)
    plan = ref.copy()
    plan[(ref == 1) & (u < worse / base)] = 0
    plan[(ref == 0) & (u < better / (1 - base))] = 1
    return ref.tolist(), plan.tolist()


def test_a_loss_on_one_task_is_not_hidden_by_a_gain_on_another(tmp_path):
    recipe = validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path), "search": {"trials": 6, "seed": 1},
                              "accuracy": {"max_kl": 0.1}, "benchmark": {"max_drop": 0.03}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    by_label = {c.plan.label(): c for c in candidates(study)}
    fp8 = by_label["all-fp8"].plan

    lost = paired_items(2000, worse=0.08, better=0.0, seed=1)  # piqa: 8 points worse
    gained = paired_items(2000, worse=0.0, better=0.08, seed=2)  # arc: 8 points better
    tasks = [TaskAcceptance(name, "acc,none", 2000, 1, paired_drop(*items, 0.95), Verdict.UNDECIDED)
             for name, items in (("piqa", lost), ("arc_easy", gained))]
    result = judge(tasks, max_drop=0.03)
    mean_drop = sum(t.interval.drop for t in result.tasks) / 2
    assert abs(mean_drop) < 0.01  # the old mean-over-tasks rule would have accepted it
    assert [t.verdict for t in result.tasks] == [Verdict.FAILS, Verdict.PASSES]
    assert result.verdict is Verdict.FAILS

    def score(value: float) -> dict:
        return {"task": "piqa", "metric": "acc,none", "value": value, "stderr": 0.01, "n": 2000}

    record_benchmark(study, by_label["all-bf16"].plan.id, {"piqa": score(0.5), "arc_easy": score(0.5)})
    record_benchmark(study, fp8.id, {"piqa": score(0.42), "arc_easy": score(0.58)}, result.to_dict())
    after = {c.plan.label(): c for c in candidates(study)}
    assert after["all-fp8"].verdict is Verdict.FAILS and not after["all-fp8"].feasible
    assert after["all-fp8"].proxy_feasible
    rec = recommend(candidates(study), ["chat"])
    assert rec.candidate.plan.id != fp8.id and "every task" in rec.accuracy_metric


def test_item_schedule_doubles_up_to_the_available_items():
    assert item_schedule(5153, 100) == [100, 200, 400, 800, 1600, 3200, 5153]
    assert item_schedule(400, 100) == [100, 200, 400]
    assert item_schedule(80, 100) == [80]


def synthetic_scorer(items: dict[str, tuple[list[int], list[int]]], asked: list[tuple[str, int]]):
    def score(task: str, n: int) -> PairedItems:
        asked.append((task, n))
        ref, plan = items[task]
        return PairedItems("acc,none", ref[:n], plan[:n])  # nested: the first n of a fixed order

    return score


def test_sequential_judge_stops_early_when_the_drop_is_clearly_inside_or_outside():
    n = 3200
    same = paired_items(n, worse=0.01, better=0.01, seed=3)  # true drop 0 against max_drop 0.05
    asked: list[tuple[str, int]] = []
    res = judge_sequentially(synthetic_scorer({"t": same}, asked), {"t": n}, 100, 0.05, 0.95)
    assert res.verdict is Verdict.PASSES and res.tasks[0].n_items < n
    assert [a[1] for a in asked] == item_schedule(n, 100)[: len(asked)]  # nested, doubling batches
    assert res.tasks[0].interval.confidence == pytest.approx(1 - 0.05 / len(item_schedule(n, 100)))

    bad = paired_items(n, worse=0.25, better=0.0, seed=4)  # true drop 0.25
    asked = []
    res = judge_sequentially(synthetic_scorer({"t": bad}, asked), {"t": n}, 100, 0.05, 0.95)
    assert res.verdict is Verdict.FAILS and asked == [("t", 100)]


def test_sequential_judge_uses_every_item_when_the_drop_sits_on_the_budget():
    n = 400
    edge = paired_items(n, worse=0.05, better=0.0, seed=5)
    asked: list[tuple[str, int]] = []
    res = judge_sequentially(synthetic_scorer({"t": edge}, asked), {"t": n}, 100, 0.05, 0.95)
    assert res.verdict is Verdict.UNDECIDED and res.tasks[0].n_items == n
    assert asked == [("t", 100), ("t", 200), ("t", 400)]


def test_one_failing_task_stops_the_plan_and_a_passing_task_stops_scoring():
    n = 1600
    items = {"fine": paired_items(n, 0.0, 0.0, seed=6), "broken": paired_items(n, 0.3, 0.0, seed=7)}
    asked: list[tuple[str, int]] = []
    res = judge_sequentially(synthetic_scorer(items, asked), {"fine": n, "broken": n}, 100, 0.05, 0.95)
    assert res.verdict is Verdict.FAILS and asked == [("fine", 100), ("broken", 100)]

    items = {"fine": paired_items(n, 0.0, 0.0, seed=6), "close": paired_items(n, 0.045, 0.0, seed=8)}
    asked = []
    res = judge_sequentially(synthetic_scorer(items, asked), {"fine": n, "close": n}, 100, 0.05, 0.95)
    fine_sizes = [k for t, k in asked if t == "fine"]
    close_sizes = [k for t, k in asked if t == "close"]
    assert res.task("fine").verdict is Verdict.PASSES
    assert max(fine_sizes) < max(close_sizes)  # the decided task was not scored further


def test_optional_stopping_keeps_false_acceptance_within_the_level():
    """Plans exactly at the budget: a sequential judge with 5 looks must accept at most ~2.5% of
    them (one side of a 95% interval), as a single look would."""
    accepted = 0
    reps = 300
    for seed in range(reps):
        items = paired_items(1600, worse=0.05, better=0.0, seed=100 + seed)
        res = judge_sequentially(synthetic_scorer({"t": items}, []), {"t": 1600}, 100, 0.05, 0.95)
        accepted += res.verdict is Verdict.PASSES
    assert accepted / reps <= 0.035


def test_benchmark_queue_orders_candidates_by_energy_within_the_proxy_budget(tmp_path):
    recipe = validate_recipe({"name": "q", "target": "b200", "out": str(tmp_path),
                              "search": {"trials": 12, "seed": 1}, "accuracy": {"max_kl": 0.1}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    cands = candidates(study)
    queue = benchmark_queue(cands, ["chat"], max_candidates=3)
    assert queue.reference.uniform_format() == Format.BF16
    assert {p.uniform_format() for p in queue.baselines} == {Format.FP8, Format.NVFP4}
    by_id = {c.plan.id: c for c in cands}
    energies = [by_id[p.id].energy("chat") for p in queue.candidates]
    assert energies == sorted(energies) and len(queue.candidates) <= 3
    assert all(by_id[p.id].proxy_feasible for p in queue.candidates)
    assert queue.reference.id not in {p.id for p in queue.candidates}
    pool = [c for c in cands if c.proxy_feasible and c.plan.uniform_format() != Format.BF16]
    assert energies[0] == min(c.energy("chat") for c in pool)


def test_lm_eval_stage_scores_candidates_by_energy_until_one_passes(tmp_path, monkeypatch):
    """The stage with synthetic per-item results: a plan's drop grows with its NVFP4 groups."""
    from advisor.accuracy import harness
    from advisor.workflows.progress import ProgressReporter
    from advisor.workflows.search import benchmark_stage

    recipe = validate_recipe({"name": "b", "target": "b200", "out": str(tmp_path), "search": {"trials": 12, "seed": 1},
                              "accuracy": {"max_kl": 0.3},
                              "benchmark": {"tasks": ["piqa", "arc_easy"], "max_drop": 0.03, "first_batch": 100,
                                            "max_candidates": 6}})
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    n_docs = {"piqa": 1600, "arc_easy": 1600}
    scored: list[tuple[str, str, int]] = []

    def fake_score_plan(model, tokenizer, plan_id, model_hash, tasks, limit=None, seed=0, n_docs=None, **kw):
        plan: Plan = model  # the fake context "assembles" a plan into itself
        worse = 0.06 * sum(f == Format.NVFP4 for f in plan.formats.values())  # each NVFP4 group: 6 points
        out = {}
        for task in tasks:
            ref, got = paired_items(n_docs[task], worse=min(worse, 0.45), better=0.0, seed=len(task))
            values = ref if plan.uniform_format() == Format.BF16 else got
            order = harness.item_order(n_docs[task], seed)[:limit]
            scored.append((plan_id, task, len(order)))
            out[task] = TaskScore.from_items(task, "acc,none", {i: values[i] for i in order}, limit=limit, seed=seed,
                                             source="fake", n_docs=n_docs[task])
        return out

    monkeypatch.setattr(harness, "score_plan", fake_score_plan)
    monkeypatch.setattr(harness, "validate_tasks", lambda tasks, data_dir: list(tasks))
    monkeypatch.setattr(harness, "task_sizes", lambda tasks, data_dir: dict(n_docs))

    class FakeContext:
        assemble = staticmethod(lambda plan: plan)
        loaded = type("Loaded", (), {"tokenizer": None})()
        fingerprint, device, scoring_place = "fake", "cpu", "cpu"

    status = benchmark_stage(study, FakeContext(), recipe, ProgressReporter(Console(file=io.StringIO())))
    cands = candidates(study)
    queue = benchmark_queue(cands, ["chat"], 6)
    judged = {pid for pid, _, _ in scored}
    by_id = {c.plan.id: c for c in cands}
    first_pass = next(p for p in queue.candidates if all(f != Format.NVFP4 for f in p.formats.values()))
    order = [p.id for p in queue.candidates]
    # every candidate cheaper than the first passing one was judged (and failed), none after it
    for pid in order[: order.index(first_pass.id)]:
        assert pid in judged and by_id[pid].verdict is Verdict.FAILS
    assert all(pid not in judged for pid in order[order.index(first_pass.id) + 1:]
               if pid not in {p.id for p in queue.baselines})
    assert by_id[first_pass.id].verdict is Verdict.PASSES
    assert recommend(cands, ["chat"]).candidate.plan.id == first_pass.id
    assert "the lowest-energy passing candidate is" in status
    nvfp4 = next(p for p in queue.baselines if p.uniform_format() == Format.NVFP4)
    assert by_id[nvfp4.id].verdict is Verdict.FAILS
    assert max(n for pid, _, n in scored if pid == nvfp4.id) == 100  # a clear failure stops at the first batch
