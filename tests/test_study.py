from __future__ import annotations

import optuna
import pytest

from advisor.errors import InputError
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import validate_recipe
from advisor.report.summary import write_report
from advisor.search.frontier import pareto_front
from advisor.search.study import candidates, open_study, run_search, save_run_meta
from advisor.testing import AdditiveEvaluator

GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))


DAMAGE = AdditiveEvaluator.DAMAGE


@pytest.fixture
def recipe(tmp_path):
    return validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path), "search": {"trials": 12, "seed": 1},
                            "accuracy": {"max_kl": 0.1}})


def meta(recipe):
    shape = ModelShape(GROUPS, 3, 64, 4, 4, 16, 100, 6400)
    return {"version": "test", "recipe": recipe.model_dump(mode="json"), "shape": shape.to_dict(),
            "model": {"name": "fake", "fingerprint": "0"}}


def test_baselines_are_always_evaluated_first(recipe):
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    labels = [t.user_attrs["label"] for t in study.trials[:3]]
    assert labels == ["all-bf16", "all-fp8", "all-nvfp4"]
    assert len(candidates(study)) == 12


def test_infeasible_plans_are_marked_and_kept_off_the_front(recipe):
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    cands = candidates(study)
    nvfp4 = next(c for c in cands if c.plan.uniform_format() == Format.NVFP4)
    assert not nvfp4.feasible  # 6 * 0.08 > 0.1
    assert nvfp4.plan.id not in {c.plan.id for c in pareto_front(cands, "chat")}
    assert study.trials[2].constraints["kl_budget"] > 0  # Optuna sees it too


def test_resume_after_interruption_keeps_every_finished_trial(recipe):
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    with pytest.raises(KeyboardInterrupt):
        run_search(study, AdditiveEvaluator(interrupt_at=6), recipe, GROUPS)
    done = {t.number: t.params for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(done) == 5

    with pytest.raises(InputError, match="--resume"):
        open_study(recipe, resume=False)
    resumed = open_study(recipe, resume=True)
    ran = run_search(resumed, AdditiveEvaluator(), recipe, GROUPS)
    assert ran == 12 - 5
    after = {t.number: t.params for t in resumed.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(after) == 12
    assert all(after[n] == p for n, p in done.items())  # nothing lost or changed


def test_resume_of_a_missing_study_is_an_input_error(recipe):
    recipe.run_dir.mkdir(parents=True)
    with pytest.raises(InputError, match="no study named"):
        open_study(recipe, resume=True)


def test_report_is_built_from_storage(recipe):
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    reloaded = optuna.load_study(study_name=recipe.name, storage=recipe.storage_url)
    md = write_report(reloaded, recipe.run_dir).read_text()
    assert (recipe.run_dir / "front.png").stat().st_size > 1000
    assert (recipe.run_dir / "format_map.png").stat().st_size > 1000
    assert "## Pareto front (within budget)" in md and "predicted (fake)" in md
    assert "## Serving engines (recommended plan)" in md and "| TensorRT-LLM | **" in md
    import json

    summary = json.loads((recipe.run_dir / "summary.json").read_text())
    rec = summary["recommendation"]
    assert rec["feasible"] and rec["plan_id"] in summary["front"]
    bf16 = next(r for r in summary["trials"] if r["label"] == "all-bf16")
    assert rec["energy"][0]["j_per_token"] <= bf16["energy"][0]["j_per_token"]
    assert set(summary["baselines"]) == {"all-bf16", "all-fp8", "all-nvfp4"}


def test_benchmark_verdicts_override_the_proxy_budget(recipe):
    from advisor.search.acceptance import TaskAcceptance, Verdict, judge
    from advisor.search.frontier import recommend
    from advisor.search.stats import paired_drop
    from advisor.search.trial_record import record_benchmark

    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))  # max_drop defaults to 0.02
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    by_label = {c.plan.label(): c for c in candidates(study)}
    bf16, fp8 = by_label["all-bf16"], by_label["all-fp8"]
    assert fp8.feasible and recommend(candidates(study), ["chat"]).candidate.trial != bf16.trial

    def score(value):
        return {"lambada_openai": {"task": "lambada_openai", "metric": "acc,none", "value": value, "stderr": 0.01,
                                   "n": 1000}}

    ref = [1] * 400 + [0] * 600
    plan = [0] * 50 + [1] * 350 + [0] * 600  # 5 points worse on the same items
    interval = paired_drop(ref, plan, 0.95)
    result = judge([TaskAcceptance("lambada_openai", "acc,none", 1000, 1, interval, Verdict.UNDECIDED)], 0.02)
    record_benchmark(study, bf16.plan.id, score(0.40))
    record_benchmark(study, fp8.plan.id, score(0.35), result.to_dict())
    after = {c.plan.label(): c for c in candidates(study)}
    assert after["all-fp8"].acceptance.task("lambada_openai").interval.drop == pytest.approx(0.05)
    assert after["all-fp8"].verdict is Verdict.FAILS and not after["all-fp8"].feasible
    assert after["all-bf16"].acceptance is None and after["all-bf16"].benchmark == {"lambada_openai": 0.40}
    rec = recommend(candidates(study), ["chat"])
    assert rec.candidate.plan.id == bf16.plan.id and "lm-eval" in rec.accuracy_metric


def test_guided_search_evaluates_knapsack_proposals_after_the_baselines(recipe):
    from advisor.search.proposals import KnapsackProposer, predicted
    from advisor.search.sensitivity import measure

    def damage_of(plan):
        return AdditiveEvaluator().evaluate(plan).kl

    def energy_of(plan):
        return AdditiveEvaluator().evaluate(plan).energy[0].j_per_token

    sens = measure(GROUPS, list(Format), damage_of, energy_of)
    proposer = KnapsackProposer(GROUPS, list(Format), sens, recipe.accuracy.max_kl)
    first = proposer.propose(1.0)
    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    run_search(study, AdditiveEvaluator(), recipe, GROUPS, proposer=proposer)
    ids = [Plan(t.params).id for t in study.trials]
    new_first = [p.id for p in first if p.id not in ids[:3]]
    assert ids[3 : 3 + len(new_first)] == new_first
    assert len(set(ids[: 3 + len(new_first)])) == 3 + len(new_first)  # no plan enqueued twice
    assert len(study.trials) == recipe.search.trials
    # the fake is additive, so the proposals' observed damage equals the prediction
    assert all(t.values[0] == pytest.approx(predicted(Plan(t.params), sens.damage)) for t in study.trials)


def test_kv_cache_is_a_search_parameter_only_when_the_recipe_lists_two(recipe, tmp_path):
    """One extra categorical ``kv_cache``; baselines with both KV formats; the knapsack's KV row;
    summary and report show the KV format per plan. Without it, the parameters are the groups'."""
    import json

    from advisor.search.proposals import KnapsackProposer
    from advisor.search.sensitivity import measure

    recipe.run_dir.mkdir(parents=True)
    plain = open_study(recipe, resume=False)
    run_search(plain, AdditiveEvaluator(), recipe, GROUPS)
    assert all("kv_cache" not in t.params for t in plain.trials)

    kv = recipe.model_copy(update={"name": "kv", "kv_cache": [Format.BF16, Format.FP8]})
    ev = AdditiveEvaluator()
    sens = measure(GROUPS, list(Format), lambda p: ev.evaluate(p).kl,
                   lambda p: ev.evaluate(p).energy[0].j_per_token, kv_cache=kv.kv_cache)
    proposer = KnapsackProposer(GROUPS, list(Format), sens, kv.accuracy.max_kl, kv.kv_cache)
    assert any(p.kv_cache == Format.FP8 for p in proposer.propose(1.0))  # FP8 KV is the cheapest damage
    kv.run_dir.mkdir(parents=True)
    study = open_study(kv, resume=False)
    save_run_meta(study, meta(kv))
    run_search(study, AdditiveEvaluator(), kv, GROUPS, proposer=proposer)
    assert all(t.params["kv_cache"] in ("bf16", "fp8") for t in study.trials)
    labels = [t.user_attrs["label"] for t in study.trials[:6]]
    assert labels == ["all-bf16", "all-fp8", "all-nvfp4", "all-bf16 + fp8 KV", "all-fp8 + fp8 KV",
                      "all-nvfp4 + fp8 KV"]
    cands = {c.plan.id: c for c in candidates(study)}
    assert any(c.plan.kv_cache == Format.FP8 for c in cands.values())
    write_report(study, kv.run_dir)
    summary = json.loads((kv.run_dir / "summary.json").read_text())
    assert {r["kv_cache"] for r in summary["trials"]} == {"bf16", "fp8"}
    bf16 = summary["trials"][summary["baselines"]["all-bf16"]]
    assert bf16["kv_cache"] == "bf16" and bf16["kl"] == 0  # the reference is BF16 weights and BF16 KV
    assert "all-bf16 + fp8 KV" in summary["baselines"]
    md = (kv.run_dir / "report.md").read_text()
    assert "KV cache" in md and "+ fp8 KV" in md


def test_a_study_scored_before_per_item_results_still_reports(recipe):
    """Scores stored as {acc, acc_stderr, n} (summary v2 era) rebuild into the v3 summary, unjudged."""
    from advisor.report.summary import build_summary
    from advisor.search.trial_record import record_benchmark

    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    bf16 = next(c for c in candidates(study) if c.plan.label() == "all-bf16")
    record_benchmark(study, bf16.plan.id, {"piqa": {"acc": 0.6, "acc_stderr": 0.05, "n": 100}})
    summary = build_summary(study)
    record = summary.record(bf16.plan.id)
    assert record.benchmark["piqa"].value == 0.6 and record.benchmark["piqa"].metric == "acc,none"
    assert record.acceptance is None and summary.schema_version == 3


def test_sqlite_study_storage_commits_in_wal_mode(tmp_path):
    import sqlite3

    from advisor.search.storage import open_storage

    db = tmp_path / "study.db"
    storage = open_storage(f"sqlite:///{db}")
    optuna.create_study(storage=storage, study_name="s").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with storage.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # stored in the file
    assert len(optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials) == 2


def test_a_plan_the_sampler_proposed_twice_is_one_row_of_the_summary(recipe):
    """A repeat (the plan already scored: its scores copied, marked ``repeat``) is a trial of the study but no
    second row of summary.json, nor a second point of the front."""
    from advisor.formats import Format
    from advisor.plan import Plan
    from advisor.report.summary import build_summary

    recipe.run_dir.mkdir(parents=True)
    study = open_study(recipe, resume=False)
    save_run_meta(study, meta(recipe))
    fp8 = Plan.uniform(GROUPS, Format.FP8)
    for _ in range(3):
        study.enqueue_trial(fp8.params(), skip_if_exists=False)
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    repeats = [t for t in study.trials if t.user_attrs.get("repeat")]
    assert len(repeats) >= 2 and {t.user_attrs["plan_id"] for t in repeats} >= {fp8.id}
    summary = build_summary(study)
    ids = [r.plan_id for r in summary.trials]
    assert len(ids) == len(set(ids)) and ids.count(fp8.id) == 1
    assert len(summary.front) == len(set(summary.front))
    first = min(t.number for t in study.trials if t.user_attrs.get("plan_id") == fp8.id)
    assert summary.record(fp8.id).trial == first  # the trial that scored it
