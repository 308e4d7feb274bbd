"""End to end on the trained 656K TinyStories Llama from ../shared, through the CLI."""

from __future__ import annotations

import json

import optuna
import yaml
from conftest import TINY_TEXT, need
from typer.testing import CliRunner

from advisor.cli import app

runner = CliRunner()


def test_search_report_show_on_the_trained_tiny_model(tmp_path, tiny_recipe):
    path = tmp_path / "r.yaml"
    tiny_recipe["calibration"] = {"source": str(need(TINY_TEXT)), "num_samples": 4, "seq_len": 64,
                                  "heldout_samples": 4, "heldout_seq_len": 64}
    path.write_text(yaml.safe_dump(tiny_recipe))
    result = runner.invoke(app, ["search", "-r", str(path), "--trials", "6"])
    assert result.exit_code == 0, result.output
    run_dir = tmp_path / "runs" / "t"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["trials"]) == 6
    by_label = {r["label"]: r for r in summary["trials"]}
    # A trained model: BF16 perplexity on TinyStories text is tens (random weights: ~2000).
    assert 10 < by_label["all-bf16"]["ppl"] < 80
    assert by_label["all-bf16"]["kl"] == 0
    assert 0 < by_label["all-fp8"]["kl"] < by_label["all-nvfp4"]["kl"]
    energies = [e for r in summary["trials"] for e in r["energy"]]
    assert all(e["source"].startswith("predicted (") and not e["measured"] for e in energies)
    assert summary["recommendation"]["plan_id"] in summary["front"]
    assert "recommended: plan" in result.stdout

    (run_dir / "report.md").unlink()
    rebuilt = runner.invoke(app, ["report", str(run_dir)])
    assert rebuilt.exit_code == 0, rebuilt.output
    report = (run_dir / "report.md").read_text()
    assert "## Recommendation" in report
    # a 656k-parameter model priced from an 8B profile: labelled and explained as extrapolation
    assert all(e["source"].endswith(": extrapolated)") for e in energies)
    assert "2-3x below the measured J/token" in report

    shown = runner.invoke(app, ["show", str(run_dir)])
    assert shown.exit_code == 0
    assert json.loads(shown.stdout)["plan_id"] == summary["recommendation"]["plan_id"]

    resumed = runner.invoke(app, ["search", "-r", str(path), "--trials", "8", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    rows = json.loads((run_dir / "summary.json").read_text())["trials"]
    study = optuna.load_study(study_name=run_dir.name, storage=f"sqlite:///{run_dir / 'study.db'}")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 8  # the budget raised to 8: two more trials
    assert sorted(r["plan_id"] for r in rows) == sorted({t.user_attrs["plan_id"] for t in complete})  # a row a plan
    timings = json.loads((run_dir / "summary.json").read_text())["timings_s"]
    for stage in ("load_s", "fingerprint_s", "tokens_s", "calibration_s", "bank_s", "reference_s", "sensitivity_s",
                  "trials_s", "measured_s", "operating_s", "total_s"):
        assert timings[stage] >= 0, stage
    assert timings["trials_s"] <= timings["total_s"]


def test_a_run_stored_with_the_old_fingerprint_resumes_and_keeps_it(tmp_path, tiny_recipe):
    import optuna

    from advisor.models.fingerprint import PREFIX, legacy_fingerprint
    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe))
    assert runner.invoke(app, ["search", "-r", str(path), "--trials", "3"]).exit_code == 0
    run_dir = tmp_path / "runs" / "t"
    assert json.loads((run_dir / "summary.json").read_text())["model"]["fingerprint"].startswith(PREFIX)
    # as an older advisor stored it: the old hash in the study and in the token sets' key
    old = legacy_fingerprint(load_model(ModelSpec(source=tiny_recipe["model"]["source"])).model)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{run_dir / 'study.db'}")
    study.set_user_attr("model", {**study.user_attrs["model"], "fingerprint": old})
    key = json.loads((run_dir / "tokens.key.json").read_text())
    (run_dir / "tokens.key.json").write_text(json.dumps({**key, "model": old}))
    tokens_before = (run_dir / "tokens.pt").stat().st_mtime_ns
    resumed = runner.invoke(app, ["search", "-r", str(path), "--trials", "4", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"]["fingerprint"] == old and len(summary["trials"]) == 4
    assert (run_dir / "tokens.pt").stat().st_mtime_ns == tokens_before  # the same token sets, not new ones


def test_report_and_show_refuse_a_folder_that_is_no_run(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output
    result = runner.invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "summary.json").write_text("{broken")
    result = runner.invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 2 and "not valid JSON" in result.output


def test_lm_eval_stage_judges_baselines_and_the_cheapest_candidate(tmp_path, tiny_recipe):
    from conftest import SHARED

    data_dir = need(SHARED / "data" / "eval")
    tiny_recipe["benchmark"] = {"tasks": ["piqa"], "limit": 6, "data_dir": str(data_dir), "max_candidates": 2,
                                "max_drop": 1.0}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe))
    result = runner.invoke(app, ["search", "-r", str(path), "--trials", "4", "--sampler", "tpe"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    assert summary["schema_version"] == 3
    scored = {r["label"]: r for r in summary["trials"] if r["benchmark"]}
    # the reference, and the baseline outside the proxy budget (NVFP4 on this tiny model)
    assert {"all-bf16", "all-nvfp4"} <= set(scored) and not summary_trial(summary, "all-nvfp4")["feasible"]
    # the candidates (within the budget, no costlier than BF16) by rising energy: the cheapest is judged, and the
    # first to pass ends the queue (with vLLM's host time, a tiny model's plans differ by tenths of a percent)
    bf16 = summary_trial(summary, "all-bf16")["energy"][0]["j_per_token"]
    eligible = sorted((r for r in summary["trials"] if r["feasible"] and r["label"] != "all-bf16"
                       and r["energy"][0]["j_per_token"] <= bf16), key=lambda r: r["energy"][0]["j_per_token"])
    assert eligible and eligible[0]["label"] in scored
    assert all(r["benchmark"]["piqa"]["n"] == 6 and r["benchmark"]["piqa"]["metric"] == "acc,none"
               for r in scored.values())
    assert scored["all-bf16"]["acceptance"] is None  # the reference
    judged = [r for r in scored.values() if r["acceptance"]]
    # a budget of 100 points: every judged plan passes at its first (and only) look of 6 items
    assert judged and all(r["acceptance"]["verdict"] == "passes" for r in judged)
    assert all(t["n_items"] == 6 and t["looks"] == 1 for r in judged for t in r["acceptance"]["tasks"])
    assert "lm-eval" in summary["recommendation"]["accuracy_metric"]
    assert summary["recommendation"]["acceptance"]["verdict"] == "passes"
    assert summary["benchmark_status"].startswith("measured: ")
    report = (tmp_path / "runs" / "t" / "report.md").read_text()
    assert "## Benchmark acceptance (lm-eval, measured)" in report and "passes: " in report


def summary_trial(summary: dict, label: str) -> dict:
    return next(r for r in summary["trials"] if r["label"] == label)


def test_a_gpu_run_records_torchs_peak_memory_per_gpu_beside_its_timings(monkeypatch):
    from types import SimpleNamespace

    import torch

    from advisor.workflows.search import timings

    peaks = {0: 3 * 2**30, 1: 2**29}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: peaks[i])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda i: peaks[i] + 2**30)
    recipe = SimpleNamespace(benchmark=SimpleNamespace(tasks=[]))
    ctx = SimpleNamespace(timings_s={"load_s": 1.0}, trial_times_s=[], device="cuda")
    out = timings(ctx, recipe, t0=0.0)
    assert out["peak_gpu_allocated_gib"] == [3.0, 0.5] and out["peak_gpu_reserved_gib"] == [4.0, 1.5]
    on_cpu = timings(SimpleNamespace(**{**vars(ctx), "device": "cpu"}), recipe, t0=0.0)
    assert "peak_gpu_allocated_gib" not in on_cpu and on_cpu["load_s"] == 1.0
