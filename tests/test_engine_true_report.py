"""reports/benchmarks/engine_true.{json,md}: one report that two scripts write, a section each
(benchmarks/_report.py: write_sections), and its section on shapes outside the step model's fit
(benchmarks/engine_true/heldout_served.py) counted against issue 56's bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def report_helpers(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import _report

    return _report


@pytest.fixture
def heldout(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))  # engine_true_sweep, for the margin table
    import heldout_served

    return heldout_served


def _section(gpu: str, text: str) -> dict:
    return {"header": {"gpu": gpu, "driver": "580", "date": "2026-11-30", "command": f"python {text}.py",
                       "vllm_version": "0.26.0"}, "markdown": [text], "rows": [1]}


def test_a_second_script_s_section_keeps_the_first_and_the_header_names_both(report_helpers, tmp_path):
    stem = tmp_path / "engine_true"
    report_helpers.write_sections(stem, "Engine-true", "ML.ENERGY", _section("B200", "mlenergy"))
    report_helpers.write_sections(stem, "Engine-true", "Served", _section("NVIDIA H200", "served"))
    report_helpers.write_sections(stem, "Engine-true", "Served", _section("NVIDIA H200", "served again"))

    saved = json.loads(stem.with_suffix(".json").read_text())
    assert list(saved["sections"]) == ["ML.ENERGY", "Served"]
    assert saved["sections"]["Served"]["markdown"] == ["served again"]
    assert saved["gpu"] == "ML.ENERGY: B200; Served: NVIDIA H200"
    md = stem.with_suffix(".md").read_text()
    assert md.index("## ML.ENERGY") < md.index("mlenergy") < md.index("## Served") < md.index("served again")
    assert "Command: `python served again.py`" in md


def _check(rows: list[dict], objectives: list[dict]) -> dict:
    return {"gpu": "NVIDIA H200", "driver": "580.159.04", "date": "2026-11-30", "vllm_version": "0.26.0",
            "rows": rows, "objectives": objectives}


def _row(shape: str, j_err: float, tpot_err: float, disturbed: str | None = None) -> dict:
    return {"shape": shape, "plan": "all-fp8", "fitted": False, "disturbed": disturbed, "batch": 64,
            "capture_sizes": [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 256, 272, 288],
            "error_pct": {"j_per_token": j_err, "tpot_ms": tpot_err, "tokens_per_s": -tpot_err}}


def test_a_moe_row_is_held_to_15_percent_in_j_per_token_a_dense_one_to_10(heldout):
    check = _check([_row("mistral-7b-v0.3", -12.0, 3.0), _row("mistral-7b-v0.3", 9.0, -8.5, "GPU 80% busy"),
                    _row("qwen3-30b-a3b", -12.0, 3.0)], [])
    dense, moe = sorted(heldout.shape_rows(check, "c.json"), key=lambda r: r["shape"])
    assert (dense["j_within"], dense["tpot_within"], dense["disturbed_rows"]) == (1, 1, 1)
    assert dense["j_worst_pct"] == -12.0 and dense["tpot_worst_pct"] == -8.5
    assert moe["j_within"] == 1 and moe["j_bound_pct"] == 15.0


def test_one_graph_size_apart_is_what_a_batch_search_resolves(heldout):
    row = _row("mistral-7b-v0.3", 0.0, 0.0)
    objectives = [{"shape": "mistral-7b-v0.3", "plan": "all-fp8", "objective": o, "predicted_batch": p,
                   "largest_met": m, "batch_error_pct": None if m is None else 100 * (p - m) / m}
                  for o, p, m in (("tpot8", 48, 40), ("tpot12", 64, 48), ("tpot20", 288, 256), ("tpot30", 32, None))]
    got = {o["objective"]: (o["within_pct"], o["within_one_graph_size"])
           for o in heldout.objective_rows(_check([row], objectives), "c.json")}
    assert got == {"tpot8": (False, True),  # 48 against 40: 20%, but the next graph size
                   "tpot12": (False, False),  # 56 lies between
                   "tpot20": (False, False),  # 272 lies between
                   "tpot30": (False, False)}  # nothing met
    sized = dict(row, max_num_seqs=256)  # an engine of 256 sequences: no batch above 256 was served
    ceiling = {o["objective"]: o["at_engine_ceiling"] for o in heldout.objective_rows(_check([sized], objectives), "c")}
    assert ceiling == {"tpot8": False, "tpot12": False, "tpot20": True, "tpot30": False}


def _ml_energy_file(path: Path, model: str, b200_over_h100: float) -> str:
    """An ML.ENERGY v3 file's form (public/data/models/*.json), with made-up numbers: H100 and B200 at batch
    8-256, one GPU; B200 ``b200_over_h100`` of H100's J/token and its inverse in tokens/s."""
    configs = []
    for gpu, scale in (("H100", 1.0), ("B200", b200_over_h100)):
        for batch in (8, 16, 32, 64, 128, 256):
            j = 0.9 / batch ** 0.6 * scale
            configs.append({"gpu_model": gpu, "num_gpus": 1, "max_num_seqs": batch, "avg_batch_size": batch * 0.98,
                            "avg_output_len": 400.0, "energy_per_token_joules": j,
                            "output_throughput_tokens_per_sec": 700 * batch ** 0.8 / scale, "median_itl_ms": 5.0,
                            "avg_power_watts": 600.0})
    path.write_text(json.dumps({"model_id": model, "configurations": configs}))
    return str(path)


def test_the_ml_energy_section_and_the_served_one_share_one_report(heldout, tmp_path, monkeypatch):
    """mlenergy_b200.py anchors B200 on the Llama-3.1-8B file alone and writes its section; heldout_served.py then
    adds its own to the same report, the first kept as it was."""
    # mlenergy_b200 points the advisor's profiles at a folder of its own where none is set, as it is imported
    monkeypatch.setenv("ADVISOR_PROFILE_DIR", str(tmp_path / "profiles"))
    import mlenergy_b200

    fit = _ml_energy_file(tmp_path / "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json",
                          "meta-llama/Llama-3.1-8B-Instruct", 0.7)
    held = _ml_energy_file(tmp_path / "Qwen__Qwen3-8B__lm-arena-chat.json", "Qwen/Qwen3-8B", 0.7)
    stem, profile = tmp_path / "engine_true", tmp_path / "b200.json"
    with pytest.raises(SystemExit, match="only meta-llama__Llama-3.1-8B-Instruct__"):
        mlenergy_b200.main(["--fit", held, "--ml-commit", "0" * 40, "--report", str(stem)])
    mlenergy_b200.main(["--fit", fit, "--heldout", held, "--ml-commit", "0" * 40, "--profile-out", str(profile),
                        "--report", str(stem)])
    assert json.loads(profile.read_text())["anchor"]["files"] == [Path(fit).name]
    first = json.loads(stem.with_suffix(".json").read_text())["sections"][mlenergy_b200.SECTION]
    assert len(first["rows"]) == 12 and len(first["heldout"]) == 12

    check = tmp_path / "check.json"
    check.write_text(json.dumps(_check([_row("mistral-7b-v0.3", 2.0, -1.0)], [])))
    heldout.main(["--checks", str(check), "--fitted-shape-checks", str(check), "--report", str(stem)])
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["sections"][mlenergy_b200.SECTION] == first
    assert saved["sections"][heldout.SECTION]["totals"]["j_within"] == 1
    assert any("Qwen3-30B-A3B" in line for line in saved["sections"][heldout.SECTION]["markdown"])  # not served
    md = stem.with_suffix(".md").read_text()
    assert md.count("\n## ") == 2 and "### Held-out models (not fitted on)" in md


def test_a_check_s_bias_is_its_mean_signed_error_at_the_operating_batches_only(heldout):
    rows = [dict(_row("mistral-7b-v0.3", -4.0, 2.0), batch=64, error_pct={"j_per_token": -4.0, "tpot_ms": 2.0,
                                                                          "tokens_per_s": -1.0}),
            dict(_row("mistral-7b-v0.3", -2.0, 4.0), batch=128, error_pct={"j_per_token": -2.0, "tpot_ms": 4.0,
                                                                           "tokens_per_s": -3.0}),
            dict(_row("mistral-7b-v0.3", 30.0, 30.0), batch=16, error_pct={"j_per_token": 30.0, "tpot_ms": 30.0,
                                                                           "tokens_per_s": 30.0})]
    bias = heldout.bias_row(_check(rows, []), "c.json")
    assert bias["rows"] == 2 and bias["shapes"] == ["mistral-7b-v0.3"]
    assert (bias["tpot_ms_mean_pct"], bias["j_per_token_mean_pct"], bias["tokens_per_s_mean_pct"]) == (3.0, -3.0, -2.0)


def test_the_margin_table_counts_predicted_batches_against_what_the_sweep_metered(heldout, tmp_path):
    """Each margin's predicted batch (the shipped step model's, CPU) against a sweep's metered batches: a sweep where
    the batch predicted at the shipped margin met the objective and the next graph size did not counts that margin
    within 10% and not at or above a miss; a larger margin predicts no larger batch."""
    from engine_true_sweep import predicted_batches

    shipped = predicted_batches("qwen2.5-7b", "all-bf16", "h200", 0.035)["tpot12"]
    # metered: the shipped prediction met 12 ms (11.5), the next graph size missed (12.5)
    sweep = {"gpu_kind": "h200", "rows": [{"shape": "qwen2.5-7b", "plan": "all-bf16", "batches": {
        f"b{shipped}": {"tpot_ms_p50": 11.5}, f"b{shipped + 8}": {"tpot_ms_p50": 12.5}},
        "objectives": {"tpot12": {"trail": []}}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    rows = {r["margin"]: r for r in heldout.margin_rows([str(path)], (0.0, 0.035, 0.06))}
    assert rows[0.035] == {"margin": 0.035, "objectives": 1, "within_pct": 1, "at_or_above_a_miss": 0}
    assert predicted_batches("qwen2.5-7b", "all-bf16", "h200", 0.0)["tpot12"] >= shipped
    assert rows[0.0]["at_or_above_a_miss"] == int(predicted_batches("qwen2.5-7b", "all-bf16", "h200", 0.0)["tpot12"]
                                                  >= shipped + 8)
    assert rows[0.06]["at_or_above_a_miss"] == 0
