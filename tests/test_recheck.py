"""advisor recheck: pass on the same model, regression on perturbed weights, exit 2 on bad input."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import typer
from conftest import TINY_MODEL, need
from typer.testing import CliRunner

from advisor.cli.deploy import recheck
from advisor.deploy.verification import neighbours, objective_checks, read_summary
from advisor.formats import Format
from advisor.plan import Plan
from advisor.recipe.schema import Workload

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(recheck)
    app.command("noop")(lambda: None)  # two commands, so `recheck` is a subcommand as in `advisor`
    return app


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished tiny-model run (the three baselines; all-fp8 is recommended)."""
    from advisor.recipe.schema import validate_recipe
    from advisor.workflows.search import run

    out = tmp_path_factory.mktemp("runs")
    recipe = validate_recipe({
        "name": "tiny", "model": {"source": str(need(TINY_MODEL))}, "target": "b200",
        "workloads": [{"name": "chat", "batch_size": 16, "input_tokens": 256, "output_tokens": 128}],
        "calibration": {"num_samples": 4, "seq_len": 32, "heldout_samples": 4, "heldout_seq_len": 32},
        "accuracy": {"max_kl": 0.05}, "search": {"trials": 3, "seed": 0}, "out": str(out), "device": "cpu",
    })
    summary = run(recipe)
    assert summary.recommendation.label == "all-fp8", summary.recommendation
    return recipe.run_dir


@pytest.fixture(scope="module")
def perturbed_model(tmp_path_factory):
    """The tiny model with activation outliers: 4 channels of every RMSNorm weight x100.

    BF16 is still a working model, but per-tensor FP8 activation scales now serve
    outliers 100x larger than the other channels, so all-fp8 breaks the KL budget.
    """
    import torch
    from transformers import AutoModelForCausalLM

    src = need(TINY_MODEL)
    dst = tmp_path_factory.mktemp("perturbed")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.input_layernorm.weight[:4] *= 100
            layer.post_attention_layernorm.weight[:4] *= 100
    model.save_pretrained(dst)
    for f in src.glob("*token*.json"):
        shutil.copy(f, dst)
    return dst


def _invoke(*args: str):
    return runner.invoke(_app(), ["recheck", *args])


def test_recheck_passes_on_the_same_model_and_researches(run_dir, tmp_path):
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(run_dir / "summary.json"), "--model", str(TINY_MODEL),
                  "--out", str(out), "--research", "--research-trials", "5")
    assert res.exit_code == 0, res.output
    data = json.loads((out / "recheck.json").read_text())
    stored = json.loads((run_dir / "summary.json").read_text())["recommendation"]
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    assert data["model"]["same_weights_as_stored"]
    # Same weights, same self-sampled tokens, same quantizers: the stored KL is reproduced.
    assert data["new"]["kl"] == pytest.approx(stored["kl"], abs=1e-6)
    assert data["research"]["trials"] == 5 and data["research"]["seeded_with"] == stored["plan_id"]
    md = (out / "recheck.md").read_text()
    assert "PASS" in md and stored["plan_id"] in md


def test_recheck_exits_1_on_perturbed_weights(run_dir, perturbed_model, tmp_path):
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(run_dir / "summary.json"), "--model", str(perturbed_model),
                  "--out", str(out))
    assert res.exit_code == 1, res.output
    data = json.loads((out / "recheck.json").read_text())
    assert data["verdict"] == "regression" and not data["model"]["same_weights_as_stored"]
    failed = [c["name"] for c in data["checks"] if not c["ok"]]
    assert failed == ["proxy KL vs BF16 (nats/token)"]
    assert data["new"]["kl"] > data["stored"]["accuracy_budget"]["max_kl"]
    assert "REGRESSION" in (out / "recheck.md").read_text()


def test_recheck_missing_summary_exits_2(tmp_path):
    res = _invoke("--recommendation", str(tmp_path / "nope.json"), "--model", str(TINY_MODEL),
                  "--out", str(tmp_path / "rc"))
    assert res.exit_code == 2
    assert "does not exist" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("content", "message"), [
    ('{"tool": "precision-advisor", "trials": [', "is not valid JSON"),
    ('{"hello": 1}', "is not a precision-advisor summary.json"),
    ('{"tool": "precision-advisor", "trials": []}', "schema version 1"),
    ('{"tool": "precision-advisor", "schema_version": 2, "trials": []}', "schema version 2"),
    ('{"tool": "precision-advisor", "schema_version": 3, "trials": []}', "is not a valid summary.json"),
])
def test_recheck_corrupt_summary_exits_2(tmp_path, content, message):
    path = tmp_path / "summary.json"
    path.write_text(content)
    res = _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(tmp_path / "rc"))
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_recheck_edited_plan_exits_2(run_dir, tmp_path):
    data = json.loads((run_dir / "summary.json").read_text())
    first = next(iter(data["recommendation"]["formats"]))
    for r in data["trials"]:
        if r["plan_id"] == data["recommendation"]["plan_id"]:
            r["formats"][first] = "bf16"
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    res = _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(tmp_path / "rc"))
    assert res.exit_code == 2 and "does not match its formats" in res.output


def test_read_summary_accepts_the_run_folder(run_dir):
    assert read_summary(run_dir)["recommendation"]


def test_neighbours_flip_one_group():
    plan = Plan({"a": Format.FP8, "b": Format.BF16})
    found = neighbours(plan, [Format.BF16, Format.FP8, Format.NVFP4])
    assert len(found) == 4
    assert all(sum(plan.formats[g] != n.formats[g] for g in plan.formats) == 1 for n in found)


@pytest.fixture
def fake_vllm_gpu(monkeypatch):
    """The fake vllm importable, a GPU "here" for NVML, and the engine served in-process on a constant-power
    counter with short meter windows."""
    import sys
    import types

    import advisor.energy.meter as meter_module
    from advisor.deploy.vllm import serve
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h100", "Fake GPU"))
    state = types.SimpleNamespace(name="Fake GPU", driver="0")
    monkeypatch.setattr(meter_module, "NvmlDevice", lambda index: types.SimpleNamespace(state=lambda: state))
    monkeypatch.setattr("advisor.deploy.vllm._engine.run_in_child",
                        lambda job: serve(job, make_counter=ConstantPowerCounter))
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds",
                        lambda job, more: serve(job, make_counter=ConstantPowerCounter, more=more))
    monkeypatch.setattr("advisor.deploy.vllm._engine.STEADY_LOAD_METER", MeterConfig(
        warmup_s=0.5, min_window_s=0.2, min_ticks=10, repeats=3, idle_s=0.02, max_cv=0.5))
    return vllm


def test_recheck_meters_the_plan_and_bf16_through_vllm(run_dir, fake_vllm_gpu, tmp_path):
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(run_dir / "summary.json"), "--model", str(TINY_MODEL),
                  "--out", str(out), "--engine", "vllm")
    data = json.loads((out / "recheck.json").read_text())
    assert res.exit_code == (0 if all(c["ok"] for c in data["checks"]) else 1), res.output
    stored = json.loads((run_dir / "summary.json").read_text())["recommendation"]
    served = [str(llm.model.name) for llm in fake_vllm_gpu.instances]
    bf16_id = Plan.uniform(list(stored["formats"]), Format.BF16).id
    assert served == [stored["plan_id"], bf16_id]  # each exported checkpoint served once
    for key in ("energy", "bf16_energy"):
        (e,) = data["new"][key]
        assert e["measured"] and e["source"].startswith("measured (vLLM 0.0-fake, Fake GPU, driver 0")
        assert e["prefill_j_per_input_token"] != e["prefill_j_per_input_token"]  # NaN: no prefill metered apart
        (p,) = data["new"]["predicted"][key]
        assert not p["measured"] and p["j_per_token"] != e["j_per_token"]
    check = next(c for c in data["checks"] if c["name"].startswith("J/token"))
    assert check["value"] == data["new"]["energy"][0]["j_per_token"]
    assert check["threshold"] == data["new"]["bf16_energy"][0]["j_per_token"]
    assert "Metered through `--engine vllm`" in (out / "recheck.md").read_text()


def test_recheck_engine_without_vllm_or_gpu_exits_3_in_one_line(run_dir, tmp_path, monkeypatch):
    import sys

    args = ("--recommendation", str(run_dir / "summary.json"), "--model", str(TINY_MODEL), "--out", str(tmp_path))
    monkeypatch.setitem(sys.modules, "vllm", None)
    res = _invoke(*args, "--engine", "vllm")
    assert res.exit_code == 3 and res.output.count("Error:") == 1 and "pip install vllm==0.26.0" in res.output

    from advisor.testing_vllm import fake_vllm

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: (None, None))
    for engine in ("vllm", "builtin"):
        res = _invoke(*args, "--engine", engine)
        assert res.exit_code == 3 and res.output.count("Error:") == 1 and "NVML sees none" in res.output

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    res = _invoke(*args, "--engine", "tensorrt_llm")
    assert res.exit_code == 3 and "cannot be installed on the GPU machines" in res.output
    assert "tensorrt_llm is not importable" in res.output
    res = _invoke(*args, "--engine", "sglang")
    assert res.exit_code == 2 and "--engine: got 'sglang'" in res.output


def test_recheck_over_two_gpus_serves_with_tp_2_and_predicts_for_two(run_dir, fake_vllm_gpu, tmp_path, monkeypatch):
    import types

    state = types.SimpleNamespace(name="2x Fake GPU", driver="0")
    monkeypatch.setattr("advisor.deploy.serving_gpus.visible_gpus", lambda: (2, 80 * 2**30))
    monkeypatch.setattr("advisor.energy.meter.open_gpus_counter", lambda n: types.SimpleNamespace(state=lambda: state))
    out = tmp_path / "rc2"
    res = _invoke("--recommendation", str(run_dir / "summary.json"), "--model", str(TINY_MODEL),
                  "--out", str(out), "--engine", "vllm", "--gpus", "2")
    assert {llm.kwargs["tensor_parallel_size"] for llm in fake_vllm_gpu.instances} == {2}
    data = json.loads((out / "recheck.json").read_text())
    assert res.exit_code == (0 if all(c["ok"] for c in data["checks"]) else 1), res.output
    (e,) = data["new"]["energy"]
    assert e["source"].startswith("measured (vLLM 0.0-fake, 2x Fake GPU, driver 0, tp=2")
    (p,) = data["new"]["predicted"]["energy"]
    assert p["source"].startswith("predicted for 2 GPUs (vLLM 0.26.0 step model") and not p["measured"]
    assert "device costs from tensor parallel, tp=2" in p["source"]


def _with_objective(run_dir, tmp_path, measured_batch: int | None):
    """The run's summary.json with a TPOT objective on 'chat' and the recommendation's operating point under it
    (predicted batch 6; as measured, ``measured_batch`` met it), as a search with a measured tier stores them."""
    data = json.loads((run_dir / "summary.json").read_text())
    for ws in (data["workloads"], data["recipe"]["workloads"]):
        ws[0].update({"tpot_ms": 3.0, "input_tokens": 8, "output_tokens": 8})
    rec = data["recommendation"]
    measured = None if measured_batch is None else {
        "batch": measured_batch, "predicted_batch": 6, "j_per_token": 0.1, "tpot_ms": 2.5, "meets": True,
        "source": "measured (vLLM 0.0-fake, Fake GPU, 2026-11-27)", "search": "found",
        "trail": [{"batch": 6, "tpot_ms": 3.5, "meets": False}, {"batch": measured_batch, "tpot_ms": 2.5,
                                                                "meets": True}]}
    data["operating_points"] = [{
        "plan_id": rec["plan_id"], "plan": rec["label"], "workload": "chat", "meets": True, "bound": "objective",
        "batch": 6, "tpot_ms": 2.9, "ttft_ms": 9.0, "j_per_token": 0.09, "tokens_per_s": 1e3, "power_w": 300.0,
        "source": "predicted (profile)", "measured": measured}]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    return path


def test_recheck_meters_the_recommendation_at_its_measured_operating_batch(run_dir, fake_vllm_gpu, tmp_path):
    fake_vllm_gpu.step_s, fake_vllm_gpu.step_s_per_seq = 0.0005, 0.0002  # TPOT about 0.5 + 0.2 b ms
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(_with_objective(run_dir, tmp_path, 4)), "--model", str(TINY_MODEL),
                  "--out", str(out), "--engine", "vllm")
    data = json.loads((out / "recheck.json").read_text())
    (point,) = data["new"]["operating_points"]
    assert point["batch"] == 4 and point["batch_from"] == "measured" and point["workload"] == "chat"
    # one engine for the plan: its stated workload (batch 4) and its operating batch in one start
    assert [str(llm.model.name) for llm in fake_vllm_gpu.instances].count(data["plan_id"]) == 1
    check = next(c for c in data["checks"] if c["name"].startswith("TPOT p50 'chat'"))
    assert check["name"] == "TPOT p50 'chat' at batch 4 (measured operating batch), as measured (ms)"
    assert check["ok"] and check["value"] == point["tpot_ms"] <= 3.0
    assert check["threshold"] == pytest.approx(3.15)  # a proven batch: the objective and two meterings' difference
    assert check["detail"] == "stored run: 2.5 ms at this batch"
    assert res.exit_code == (0 if all(c["ok"] for c in data["checks"]) else 1), res.output


def test_recheck_fails_in_one_line_when_the_objective_is_missed_as_measured(run_dir, fake_vllm_gpu, tmp_path):
    fake_vllm_gpu.step_s, fake_vllm_gpu.step_s_per_seq = 0.004, 0.0  # every step 4 ms: TPOT 3 ms is missed
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(_with_objective(run_dir, tmp_path, None)), "--model", str(TINY_MODEL),
                  "--out", str(out), "--engine", "vllm")
    assert res.exit_code == 1, res.output
    data = json.loads((out / "recheck.json").read_text())
    assert data["verdict"] == "regression" and data["new"]["operating_points"][0]["batch_from"] == "predicted"
    failed = [line for line in res.output.splitlines() if line.startswith("FAIL TPOT")]
    assert len(failed) == 1 and "(threshold 3)" in failed[0]
    assert failed[0].startswith("FAIL TPOT p50 'chat' at batch 6 (predicted operating batch), as measured (ms): ")
    assert "TPOT p50 'chat' at batch 6" in (out / "recheck.md").read_text().split("Failed: ")[1]


def test_recheck_meters_the_recommendation_at_the_batch_its_verify_served(run_dir, fake_vllm_gpu, tmp_path):
    """The batch the run's `advisor verify` proved in the engine (not the predicted one) is what recheck holds the
    new version to, where verify served through the same vLLM and GPU."""
    fake_vllm_gpu.step_s, fake_vllm_gpu.step_s_per_seq = 0.0005, 0.0002
    path = _with_objective(run_dir, tmp_path, None)  # the search's own: predicted batch 6, nothing measured
    plan_id = json.loads(path.read_text())["recommendation"]["plan_id"]
    served = {"batch": 3, "tpot_ms": 2.0, "meets": True, "not_measured": None}
    verify = {"engine": "vllm", "vllm_version": "0.0-fake", "gpu": "Fake GPU", "gpus": 1, "date": "2026-11-29",
              "plans": [{"role": "recommendation", "plan_id": plan_id, "energy": [],
                         "operating": [{"workload": "chat", "batch": 6, "vllm_search": served}]}]}
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(out), "--engine", "vllm")
    data = json.loads((out / "recheck.json").read_text())
    (point,) = data["new"]["operating_points"]
    assert point["batch"] == 3 and point["batch_from"] == "served in verify", res.output
    check = next(c for c in data["checks"] if c["name"].startswith("TPOT p50 'chat'"))
    assert check["name"] == "TPOT p50 'chat' at batch 3 (served in verify operating batch), as measured (ms)"
    assert check["detail"] == "stored run: 2 ms at this batch"
    assert "3 (served in verify) on 'chat'" in res.output
    (tmp_path / "verify.json").write_text(json.dumps({**verify, "gpu": "Other GPU"}))  # not this GPU: predicted
    _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(out), "--engine", "vllm")
    (point,) = json.loads((out / "recheck.json").read_text())["new"]["operating_points"]
    assert point["batch"] == 6 and point["batch_from"] == "predicted"


@pytest.mark.parametrize(("origin", "tpot_ms", "ok"), [("served in verify", 3.1, True), ("measured", 3.1, True),
                                                       ("served in verify", 3.2, False), ("predicted", 3.1, False),
                                                       ("predicted", 2.9, True)])
def test_a_proven_batch_is_not_failed_for_less_than_two_meterings_differ_by(origin, tpot_ms, ok):
    workload = Workload(name="chat", batch_size=4, input_tokens=8, output_tokens=8, tpot_ms=3.0)
    point = SimpleNamespace(batch=6, tpot_ms=tpot_ms, ttft_ms=None)  # the metered point: what the checks read
    (check,), untimed = objective_checks(workload, point, origin, {"tpot_ms": 2.9})
    assert check.ok is ok and check.value == tpot_ms and not untimed
    assert check.threshold == pytest.approx(3.0 if origin == "predicted" else 3.15)
    over = "over the objective (3 ms) by 3.3%: two meterings of one batch differ by up to 5%"
    assert (over in check.detail) is (origin != "predicted" and tpot_ms == 3.1)


def test_recheck_reuses_the_run_s_bf16_measurement_of_the_same_engine_gpu_and_shape(run_dir, fake_vllm_gpu, tmp_path):
    data = json.loads((run_dir / "summary.json").read_text())
    number = data["baselines"]["all-bf16"]
    bf16 = next(t for t in data["trials"] if t["trial"] == number)
    bf16["energy"] = [{"workload": "chat", "j_per_token": 0.25, "decode_j_per_token": 0.2,
                       "prefill_j_per_input_token": 0.01, "decode_tokens_per_s": 1e3, "measured": True,
                       "source": "measured (vLLM 0.0-fake, Fake GPU, driver 0, 2026-11-20)"}]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "rc"
    res = _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(out), "--engine", "vllm")
    new = json.loads((out / "recheck.json").read_text())
    assert [str(llm.model.name) for llm in fake_vllm_gpu.instances] == [new["plan_id"]]  # BF16 not served again
    (e,) = new["new"]["bf16_energy"]
    assert e["j_per_token"] == 0.25 and e["source"].endswith("the run's own, reused: same shape, engine and GPU")
    assert "1 engine start(s) and 1 meterings, expected about 2 min" in res.output
    bf16["energy"][0]["source"] = "measured (vLLM 0.0-fake, Other GPU, driver 0, 2026-11-20)"  # another GPU
    path.write_text(json.dumps(data))
    _invoke("--recommendation", str(path), "--model", str(TINY_MODEL), "--out", str(tmp_path / "rc2"),
            "--engine", "vllm")
    assert len(fake_vllm_gpu.instances) == 3  # the plan and BF16 served this time


def test_recheck_reuses_all_bf16_as_the_run_s_verify_served_it_on_the_same_vllm_and_gpu(run_dir, fake_vllm_gpu,
                                                                                         tmp_path):
    (tmp_path / "summary.json").write_text((run_dir / "summary.json").read_text())
    row = {"workload": "chat", "vllm_j_per_token": 0.3, "vllm_tokens_per_s": 900.0, "batch_full": True,
           "vllm_unstable": False}
    verify = {"engine": "vllm", "vllm_version": "0.0-fake", "gpu": "Fake GPU", "gpus": 1, "date": "2026-11-20",
              "plans": [{"role": "bf16", "energy": [row]}]}
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    res = _invoke("--recommendation", str(tmp_path), "--model", str(TINY_MODEL), "--out", str(tmp_path / "rc"),
                  "--engine", "vllm")
    new = json.loads((tmp_path / "rc" / "recheck.json").read_text())
    assert [str(llm.model.name) for llm in fake_vllm_gpu.instances] == [new["plan_id"]]  # BF16 not served again
    (e,) = new["new"]["bf16_energy"]
    assert e["j_per_token"] == 0.3 and e["decode_tokens_per_s"] == 900.0
    assert e["source"] == ("measured (vLLM 0.0-fake, Fake GPU, 2026-11-20); the run's own `advisor verify`, reused: "
                           "same shape, engine and GPU")
    assert "1 engine start(s)" in res.output
    for change in ({"gpu": "Other GPU"}, {"vllm_version": "0.1-fake"},
                   {"plans": [{"role": "bf16", "energy": [{**row, "vllm_unstable": True}]}]}):
        (tmp_path / "verify.json").write_text(json.dumps({**verify, **change}))
        served = len(fake_vllm_gpu.instances)
        _invoke("--recommendation", str(tmp_path), "--model", str(TINY_MODEL), "--out", str(tmp_path / "rc"),
                "--engine", "vllm")
        assert len(fake_vllm_gpu.instances) == served + 2, change  # the plan and BF16 served this time
