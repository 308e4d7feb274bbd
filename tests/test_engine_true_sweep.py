"""benchmarks/device/engine_true_sweep.py on the CPU with the fake vLLM: a shape outside the step model's fit is
built, served once a plan at the sweep's batches, and each TPOT objective is searched in that engine from the
batch the vLLM step model predicts (the held-out check of issue 56); the file it writes is what the fit reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sweep(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import engine_true_sweep

    return engine_true_sweep


def test_the_sweep_serves_each_plan_once_and_searches_each_objective_from_the_predicted_batch(sweep, monkeypatch,
                                                                                              tmp_path):
    from transformers import LlamaConfig

    from advisor.deploy.vllm import serve
    from advisor.energy.meter import MeterConfig
    from advisor.formats import GPU
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001, step_s_per_seq=0.00005)  # TPOT grows with the batch: objectives bite
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr(sweep, "shape_config", lambda _name: LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, architectures=["LlamaForCausalLM"]))
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: (GPU.H100, "Fake H100"))
    monkeypatch.setattr("advisor.deploy.vllm.STEADY_LOAD_METER", MeterConfig(
        warmup_s=0.2, min_window_s=0.2, min_ticks=5, repeats=2, idle_s=0.05, max_cv=0.5, until_stable_s=1.0))
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds",
                        lambda job, more: serve(job, make_counter=ConstantPowerCounter, more=more))
    monkeypatch.setattr(sweep, "MAX_CONCURRENCY", 64)  # the tiny model meets every objective up to the bound
    out = tmp_path / "sweep.json"
    monkeypatch.setattr(sys, "argv", ["engine_true_sweep.py", "--shapes", "tiny", "--plans", "all-bf16",
                                      "--batches", "4", "8", "--work", str(tmp_path / "work"), "--out", str(out),
                                      "--device", "cpu"])
    sweep.main()
    data = json.loads(out.read_text())
    assert data["gpu"] == "Fake H100" and data["gpu_kind"] == "h100"
    (row,) = data["rows"]
    assert row["error"] is None and len(vllm.instances) == 1  # one engine: the batches and every search's rounds
    assert {"b4", "b8"} <= set(row["batches"]) and row["max_num_seqs"] == vllm.instances[0].kwargs["max_num_seqs"]
    # the random exports carry no tokenizer: served from token ids (a Llama-3.2-3B export was refused without this)
    assert vllm.instances[0].kwargs["skip_tokenizer_init"] is True
    assert all({"gpu_busy_pct", "other_gpus_busy_pct", "starved_windows"} <= set(b) for b in row["batches"].values())
    assert set(row["objectives"]) == {"tpot8", "tpot12", "tpot20"}
    for o in row["objectives"].values():
        assert o["trail"][0]["batch"] == o["predicted_batch"] >= 1 and f"b{o['batch']}" in row["batches"]
        assert o["search"] and o["prediction_error_pct"]["tpot_ms"] is not None
    # sized for the largest batch served anyway: a step up stays under it (as verify sizes a plan's engine)
    assert row["max_num_seqs"] == max(4, 8, *(o["predicted_batch"] for o in row["objectives"].values()))
    assert all(b <= row["max_num_seqs"] for o in row["objectives"].values() for b in (t["batch"] for t in o["trail"]))

    # the fit reads every metered batch once, on the GPU the file names
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import read_input

    rows = read_input(str(out))
    assert {(r.gpu, r.gpu_kind) for r in rows} == {("Fake H100", "h100")} and sorted(r.batch for r in rows) == sorted(
        int(k[1:]) for k, e in row["batches"].items() if not e["unstable"] and e["batch_full"])
    assert {r.max_num_seqs for r in rows} == {row["max_num_seqs"]}

    # the held-out check: every row priced with the shipped profile, and each objective's predicted batch against the
    # largest that met as served
    monkeypatch.setenv("ADVISOR_PROFILE_DIR", str(tmp_path / "profiles"))
    import vllm_step_fit

    stem = tmp_path / "check"
    vllm_step_fit.main(["--gpu", "h100", "--input", str(out), "--check",
                        str(ROOT / "advisor" / "energy" / "profiles" / "vllm" / "h100.json"), "--report", str(stem)])
    report = json.loads(stem.with_suffix(".json").read_text())
    assert len(report["rows"]) == len(rows) and all(not e["fitted"] for e in report["rows"])
    got = {o["objective"]: o for o in report["objectives"]}
    assert set(got) == {"tpot8", "tpot12", "tpot20"}
    for name, o in got.items():
        met = row["objectives"][name]["batch"]
        assert o["largest_met"] == met and o["batch_error_pct"] == pytest.approx(
            100 * (o["predicted_batch"] - met) / met)
    text = stem.with_suffix(".md").read_text()
    assert "## The operating batch: predicted against the largest that met as vLLM served it" in text
    assert "| tiny | all-bf16 | tpot12 |" in text
