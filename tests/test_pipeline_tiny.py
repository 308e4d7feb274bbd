"""End to end on the trained 656K TinyStories Llama from ../shared, through the CLI."""

from __future__ import annotations

import json

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
    assert len(json.loads((run_dir / "summary.json").read_text())["trials"]) == 8


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
    assert {"all-bf16", "all-fp8", "all-nvfp4"} <= set(scored)
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
