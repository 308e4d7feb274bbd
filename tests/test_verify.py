"""`advisor verify RUN_DIR --engine vllm` on a real (tiny) run, with the fake vllm module standing in for the
engine (served in-process here; the child-process path is tests/test_vllm_engine.py's)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL, need, verify_recipe_dict
from typer.testing import CliRunner

from advisor.cli import app
from advisor.deploy.vllm import serve
from advisor.search.measured import step_up_ceiling
from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

runner = CliRunner()
FAST = {"warmup_s": 0.5, "min_window_s": 0.3, "min_ticks": 20, "repeats": 3, "idle_s": 0.05, "max_cv": 0.5}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from advisor.recipe.schema import validate_recipe
    from advisor.workflows.search import run

    recipe = validate_recipe(verify_recipe_dict(need(TINY_MODEL), tmp_path_factory.mktemp("runs")))
    run(recipe)
    return recipe.run_dir


@pytest.fixture
def engine(monkeypatch, run_dir):
    """The fake vllm importable, a GPU "here", and the engine served in-process on a constant-power counter (with
    the batch search's rounds); the servings an earlier test kept in the shared run folder forgotten."""
    from advisor.deploy.verification import FOLDER
    from advisor.energy.meter import MeterConfig
    from advisor.workflows import verify as verify_module

    shutil.rmtree(run_dir / FOLDER, ignore_errors=True)
    vllm = fake_vllm(step_s=0.002)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h100", "Fake GPU"))
    monkeypatch.setattr(verify_module, "run_in_child", lambda job: serve(job, make_counter=ConstantPowerCounter))
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds",
                        lambda job, more: serve(job, make_counter=ConstantPowerCounter, more=more))
    monkeypatch.setattr(verify_module, "STEADY_LOAD_METER", MeterConfig(**FAST))
    return vllm


def test_verify_serves_the_recommendation_and_bf16(run_dir, engine, tmp_path):
    lambada = tmp_path / "lambada.jsonl"
    lambada.write_text("\n".join(json.dumps({"text": t}) for t in (
        "Once upon a time there was a little girl named Lily", "The dog ran to the park and saw a big tree")))
    fp8 = next(t["plan_id"] for t in json.loads((run_dir / "summary.json").read_text())["trials"]
               if set(t["formats"].values()) == {"fp8"})
    res = runner.invoke(app, ["verify", str(run_dir), "--lambada", str(lambada), "--plan", fp8])
    assert res.exit_code == 0, res.output
    data = json.loads((run_dir / "verify.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    roles = {part: r for r in data["plans"] for part in r["role"].split("+")}
    assert roles["recommendation"]["plan_id"] == summary["recommendation"]["plan_id"]
    assert len({r["plan_id"] for r in data["plans"]}) == len(data["plans"])  # each plan served once
    assert all(r["formats_match"] is True for r in data["plans"]) and data["verified"]
    bf16 = roles["bf16"]
    assert set(bf16["served_formats"].values()) == {"bf16"}
    assert set(roles[fp8]["served_formats"].values()) == {"fp8"}
    assert roles[fp8]["accuracy"]["advisor_kl"] > 0
    # the advisor's own model of the BF16 export is the reference itself
    assert bf16["accuracy"]["advisor_kl"] == pytest.approx(0.0, abs=1e-6)
    assert bf16["accuracy"]["served_kl"] > 0  # the fake engine's "model" is another one
    assert roles[fp8]["accuracy"]["served_kl"] > bf16["accuracy"]["served_kl"]  # the fake's FP8 adds noise
    assert bf16["accuracy"]["positions"] == 2 * 31  # 2 held-out sequences of 32 tokens: 31 next tokens each
    assert not (run_dir / "verify_reference.pt").exists()  # the reference's file is gone once served
    # the fake's bigram "model" is far from the tiny model: every plan is over the budget as served, and said so
    assert data["max_kl"] == 0.05 and all(r["accuracy"]["served_kl"] > 0.05 for r in data["plans"])
    for r in data["plans"]:
        (line,) = [x for x in res.output.splitlines() if f" {r['plan_id']}: served as planned" in x]
        assert line.endswith("over max_kl 0.05 as served"), line
    assert bf16["accuracy"]["items"]["n"] == 2
    e = bf16["energy"][0]
    assert e["workload"] == "chat" and e["vllm_j_per_token"] > 0 and e["batch_full"]
    assert e["predicted_j_per_token"] is not None and "predicted" in e["predicted_source"]
    assert engine.instances[0].kwargs["enable_prefix_caching"] is False
    # "here" is an H100: the FP8 plan's GEMMs are served by cuBLASLt, as its export's vllm_config.yaml asks, and
    # verify.md names the options each plan ran with
    assert roles[fp8]["vllm_options"]["linear_backend"] == "torch" and "linear_backend" not in bf16["vllm_options"]
    assert re.search(rf'`{fp8}` compilation_config={{"cudagraph_capture_sizes": \[[\d, ]+\]}}, linear_backend="torch", '
                     'max_num_seqs=6',
                     (run_dir / "verify.md").read_text())
    # the objective's operating point: each plan served at its own largest batch under it (here the service's 6)
    points = {p["plan_id"]: p for p in summary["operating_points"]}
    for r in data["plans"]:
        (op,) = r["operating"]
        assert op["workload"] == "chat" and op["batch"] == points[r["plan_id"]]["batch"] == 6
        assert op["predicted"]["j_per_token"] == points[r["plan_id"]]["j_per_token"]
        assert op["vllm"]["batch"] == 6 and op["vllm"]["j_per_token"] > 0 and op["batch_full"]
        assert op["vllm"]["source"].startswith("measured (vLLM 0.0-fake, Fake GPU")
    # each engine sized for its largest operating batch, 6, as the team's serving config sizes it (a step up from
    # the largest stays under it: none here), its CUDA graphs captured for every batch up to it
    assert {llm.kwargs["max_num_seqs"] for llm in engine.instances} == {6} and step_up_ceiling(6) == 8
    sizes = engine.instances[0].kwargs["compilation_config"]["cudagraph_capture_sizes"]
    assert {1, 2, 4, 8} <= set(sizes)  # every decode size up to 6 and the one it pads to (8, as vLLM pads it)
    assert "### Operating points as served" in (run_dir / "verify.md").read_text()
    # each operating point states the prediction's error against what vLLM served there
    for r in data["plans"]:
        (op,) = r["operating"]
        want = 100 * (op["predicted"]["j_per_token"] - op["vllm"]["j_per_token"]) / op["vllm"]["j_per_token"]
        (row,) = [x for x in (run_dir / "verify.md").read_text().splitlines()
                  if x.startswith(f"| `{r['plan_id']}` | chat | 6 |")]
        assert f"| {want:+.1f}% |" in row
    report = (run_dir / "report.md").read_text()
    assert report.count("## Verified in vLLM 0.0-fake") == 1 and "Energy as served" in report
    # the frontier as served: the served plans' predicted curves with vLLM's points, drawn and linked
    assert data["operating_plot"] == "verify_operating_points.png" and (run_dir / data["operating_plot"]).stat().st_size
    assert "![the time-energy frontier as served](verify_operating_points.png)" in report
    from advisor.deploy.verification import served_operating_summary
    from advisor.report import load_verify

    drawn = served_operating_summary(summary, load_verify(run_dir / "verify.json"))
    assert {p["plan_id"] for p in drawn["operating_points"]} == {r["plan_id"] for r in data["plans"]}
    for p in drawn["operating_points"]:
        (op,) = next(r for r in data["plans"] if r["plan_id"] == p["plan_id"])["operating"]
        assert p["measured"]["j_per_token"] == (op.get("vllm_search") or op["vllm"])["j_per_token"]
    # again: the report's section is replaced, not repeated; the exports are reused
    stamp = (run_dir / "engine_checkpoints" / bf16["plan_id"] / "export.json").stat().st_mtime
    assert runner.invoke(app, ["verify", str(run_dir), "--no-energy"]).exit_code == 0
    assert (run_dir / "report.md").read_text().count("## Verified in vLLM") == 1
    assert (run_dir / "engine_checkpoints" / bf16["plan_id"] / "export.json").stat().st_mtime == stamp


def test_the_advisors_own_models_are_scored_as_their_exports_reload_them(run_dir, engine, tmp_path, monkeypatch):
    """A plan exported in this verify is scored (KL against the reference, items) on the model its export's round
    trip reloaded: no export is read from disk again after the serving. Exported before, it is read back from its
    folder, and scores the same."""
    from advisor.deploy import checkpoint

    lambada = tmp_path / "lambada.jsonl"
    lambada.write_text("\n".join(json.dumps({"text": t}) for t in (
        "Once upon a time there was a little girl named Lily", "The dog ran to the park and saw a big tree")))
    fp8 = next(t["plan_id"] for t in json.loads((run_dir / "summary.json").read_text())["trials"]
               if set(t["formats"].values()) == {"fp8"})
    shutil.rmtree(run_dir / "engine_checkpoints", ignore_errors=True)
    reads, real = [], checkpoint.load_exported
    monkeypatch.setattr(checkpoint, "load_exported", lambda path, **kw: reads.append(path.name) or real(path, **kw))
    scores, said = [], []
    for _ in range(2):
        res = runner.invoke(app, ["verify", str(run_dir), "--lambada", str(lambada), "--plan", fp8, "--no-energy"])
        assert res.exit_code == 0, res.output
        data = json.loads((run_dir / "verify.json").read_text())
        scores.append({r["plan_id"]: r["accuracy"] for r in data["plans"]})
        said.append(res.output.count("scoring the advisor's own model of"))
        if len(scores) == 1:  # the first verify exported every plan (this model's folder is not served as it is)
            assert reads == [] and said == [0]
    assert sorted(reads) == sorted(scores[1]) and said[1] == len(scores[1])  # read back from their folders
    first, again = scores
    assert first[fp8]["advisor_kl"] > 0
    for pid, acc in first.items():
        assert acc["advisor_kl"] == pytest.approx(again[pid]["advisor_kl"], rel=1e-6, abs=1e-9)
        assert acc["items"]["advisor_accuracy"] == again[pid]["items"]["advisor_accuracy"]


def test_a_group_served_otherwise_is_an_error_named(run_dir, engine):
    engine.misserve = {"model.layers.1.mlp.down_proj": "ModelOptNvFp4W4A16LinearMethod"}
    res = runner.invoke(app, ["verify", str(run_dir), "--no-energy"])
    assert res.exit_code == 1
    assert "Error: vLLM served layer groups otherwise than planned" in res.output
    assert "layers.1.down planned" in res.output
    assert "ModelOptNvFp4W4A16LinearMethod" in (run_dir / "verify.md").read_text()


def test_without_vllm_or_gpu_exit_3_and_a_foreign_run_exit_2(run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    res = runner.invoke(app, ["verify", str(run_dir)])
    assert res.exit_code == 3 and res.output.count("Error:") == 1 and "pip install vllm==0.26.0" in res.output

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: (None, None))
    res = runner.invoke(app, ["verify", str(run_dir)])
    assert res.exit_code == 3 and "NVML sees none" in res.output

    old = tmp_path / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns("engine_checkpoints"))
    data = json.loads((old / "summary.json").read_text())
    (old / "summary.json").write_text(json.dumps({**data, "schema_version": 2}))
    res = runner.invoke(app, ["verify", str(old)])
    assert res.exit_code == 2 and "schema version 2" in res.output and res.output.count("Error:") == 1


def test_verify_over_two_gpus_serves_with_tensor_parallelism_beside_the_prediction_for_two(run_dir, engine,
                                                                                            monkeypatch):
    monkeypatch.setattr("advisor.deploy.serving_gpus.visible_gpus", lambda: (2, 80 * 2**30))
    res = runner.invoke(app, ["verify", str(run_dir), "--gpus", "2"])
    assert res.exit_code == 0, res.output
    assert {llm.kwargs["tensor_parallel_size"] for llm in engine.instances} == {2}
    data = json.loads((run_dir / "verify.json").read_text())
    assert data["gpus"] == 2
    for r in data["plans"]:
        (e,) = r["energy"]
        assert e["predicted_source"].startswith("predicted for 2 GPUs (tensor parallel, tp=2")
        assert "assumed, not measured" in e["predicted_source"] and e["predicted_run_j_per_token"] > 0
        assert r["operating"][0]["vllm"]["source"].startswith("measured (vLLM 0.0-fake, 2x Fake GPU, tp=2")
    res = runner.invoke(app, ["verify", str(run_dir), "--gpus", "4", "--no-energy"])
    assert res.exit_code == 3 and res.output.count("Error:") == 1 and "--gpus 4: torch sees 2 GPU(s)" in res.output


def test_the_builtin_runtime_column_is_its_metering_at_the_same_batch():
    from advisor.formats import Format
    from advisor.plan import LayerGroup, Plan
    from advisor.workflows.verify import operating_as_served

    plan = Plan.uniform((LayerGroup("layers.0.qkv", ("m0",), ((8, 8),)),), Format.FP8)
    searched = {"batch": 40, "predicted_batch": 64, "j_per_token": 0.09, "meets": True, "source": "measured (built-in)",
                "trail": [{"batch": 64, "j_per_token": 0.07, "tpot_ms": 13.0, "meets": False},
                          {"batch": 40, "j_per_token": 0.09, "tpot_ms": 11.0, "meets": True}]}
    point = {"plan_id": plan.id, "workload": "chat", "batch": 64, "meets": True, "bound": "objective", "tpot_ms": 12.0,
             "ttft_ms": 30.0, "j_per_token": 0.065, "tokens_per_s": 5e3, "source": "predicted", "measured": searched}
    summary = {"workloads": [{"name": "chat", "batch_size": 4, "tpot_ms": 12.0}], "operating_points": [point]}
    row = {"j_per_token": 0.075, "tokens_per_s": 5e3, "tpot_ms_p50": 12.5, "ttft_ms_p50": 30.0,
           "measurement": {"unstable": False}, "batch_full": True}
    (got,) = operating_as_served(summary, plan, {"energy": {"chat at batch 64": row}}, "measured (vLLM)")
    assert got.batch == 64 and got.runtime.j_per_token == 0.07  # the trail's batch 64, not batch 40
    del searched["trail"]
    (got,) = operating_as_served(summary, plan, {"energy": {"chat at batch 64": row}}, "measured (vLLM)")
    assert got.runtime is None  # not metered at this batch: no number rather than another batch's


def test_verify_searches_an_operating_point_vllm_misses_in_the_same_engine(run_dir, engine, tmp_path, monkeypatch):
    from advisor.energy.meter import MeterConfig
    from advisor.workflows import verify as verify_module

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    summary = json.loads((copy / "summary.json").read_text())
    for ws in (summary["workloads"], summary["recipe"]["workloads"]):
        ws[0]["tpot_ms"] = 2.8  # the stored points still say batch 6 meets it
    (copy / "summary.json").write_text(json.dumps(summary))
    engine.step_s, engine.step_s_per_seq = 0.0005, 0.0005  # TPOT about 0.5 + 0.5 b ms: batch 6 misses 2.8
    monkeypatch.setattr(verify_module, "MeterConfig", lambda: MeterConfig(**{**FAST, "warmup_s": 0.5}))
    res = runner.invoke(app, ["verify", str(copy)])
    assert res.exit_code == 0, res.output
    data = json.loads((copy / "verify.json").read_text())
    # each plan in one engine: its verify serving, then the search's smaller batches
    assert [llm.kwargs["max_num_seqs"] for llm in engine.instances] == [6] * len(data["plans"])
    for r in data["plans"]:
        (op,) = r["operating"]
        found = op["vllm_search"]
        assert op["vllm"]["meets"] is False and found["trail"][0]["batch"] == 6 and found["predicted_batch"] == 6
        assert found["meets"] is True and found["batch"] < 6 and found["tpot_ms"] <= 2.8
        assert found["source"].startswith("measured (vLLM 0.0-fake, Fake GPU")
    text = (copy / "verify.md").read_text()
    assert "(smaller after a miss, larger after a batch that met with room to spare), until the largest that " \
        "meets" in text
    assert "on 'chat': batches 6 (" in text
    # the recommendation (all-BF16 on this run) at the batch the search found, in verify.md and on the screen
    rec = next(r for r in data["plans"] if "recommendation" in r["role"].split("+"))
    found = rec["operating"][0]["vllm_search"]
    assert f"vLLM serves it at batch {found['batch']} at {found['j_per_token']:.4g} J/token" in text
    assert f"as served, 'chat': the recommendation is all-BF16; vLLM serves it at batch {found['batch']}" in res.output


def test_a_verify_cut_off_serves_only_the_plans_it_had_not_served(run_dir, engine, tmp_path, monkeypatch):
    from advisor.deploy.verification import FOLDER

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "verify.json").unlink(missing_ok=True)  # an earlier test's
    served_plans = []

    def in_process(job, more):  # as the engine fixture serves
        return serve(job, make_counter=ConstantPowerCounter, more=more)

    def cut_after_one(job, more):
        if served_plans:
            raise KeyboardInterrupt  # the lent GPU's time ran out during the second plan
        served_plans.append(job.checkpoint)
        return in_process(job, more)

    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds", cut_after_one)
    fp8 = next(t["plan_id"] for t in json.loads((copy / "summary.json").read_text())["trials"]
               if set(t["formats"].values()) == {"fp8"})
    res = runner.invoke(app, ["verify", str(copy), "--plan", fp8])
    assert res.exit_code != 0 and not (copy / "verify.json").exists()
    (kept,) = (copy / FOLDER).glob("*.json")
    assert served_plans == [str(copy / "engine_checkpoints" / kept.stem)]
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds", in_process)
    before = len(engine.instances)
    res = runner.invoke(app, ["verify", str(copy), "--plan", fp8])
    assert res.exit_code == 0, res.output
    assert f"read back from {kept}" in res.output
    data = json.loads((copy / "verify.json").read_text())
    assert len(engine.instances) - before == len(data["plans"]) - 1  # the kept plan started no engine
    by_plan = {r["plan_id"]: r for r in data["plans"]}
    assert by_plan[kept.stem]["read_back_from"] == str(kept)
    stored = json.loads(kept.read_text())["served"]
    assert by_plan[kept.stem]["energy"][0]["vllm_j_per_token"] == stored["energy"]["chat"]["j_per_token"]
    assert all(r["read_back_from"] is None for r in data["plans"] if r["plan_id"] != kept.stem)
    # another job (no energy) does not read a kept serving back; nor does a torn file
    kept.write_text(kept.read_text()[:100])
    before = len(engine.instances)
    assert runner.invoke(app, ["verify", str(copy), "--plan", fp8, "--no-energy"]).exit_code == 0
    assert len(engine.instances) - before == len(data["plans"])


def test_served_on_another_gpu_kind_the_prediction_is_repriced_for_it_and_said(run_dir, engine, monkeypatch):
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h200", "Fake H200"))
    res = runner.invoke(app, ["verify", str(run_dir)])
    assert res.exit_code == 0, res.output
    data = json.loads((run_dir / "verify.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (data["target"], data["gpu_kind"]) == ("h100", "h200")
    run_prediction = {t["plan_id"]: t["energy"][0]["j_per_token"] for t in summary["trials"]}
    for r in data["plans"]:
        (e,) = r["energy"]
        assert e["predicted_run_j_per_token"] == run_prediction[r["plan_id"]]  # the run's, for its H100
        assert e["predicted_j_per_token"] != e["predicted_run_j_per_token"]  # re-priced for the H200 that served
        assert "h200" in e["predicted_source"].lower() and "h100" not in e["predicted_source"].lower()
    assert "Served on another GPU kind than the run's target" in (run_dir / "verify.md").read_text()


# ------------------------------------------------------------- reports/benchmarks/operating_points_8b's collector
def _vllm_verify_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_verify.py"
    spec = importlib.util.spec_from_file_location("vllm_verify", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_operating_points_report_collects_what_verify_served_and_searched(run_dir, engine, tmp_path,
                                                                            monkeypatch, capsys):
    from advisor.energy.meter import MeterConfig
    from advisor.workflows import verify as verify_module

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    summary = json.loads((copy / "summary.json").read_text())
    for ws in (summary["workloads"], summary["recipe"]["workloads"]):
        ws[0]["tpot_ms"] = 2.8  # batch 6 (the stored point) misses it as served: the search goes below
    for point in summary["operating_points"]:  # a prediction shaped like the fake engine's steps (the search reads
        point["curve"] = [[b, 0.1 * (1 + b), j] for b, _, j in point["curve"]]  # its shape, scaled by the miss)
    (copy / "summary.json").write_text(json.dumps(summary))
    engine.step_s, engine.step_s_per_seq = 0.0005, 0.0005
    jobs = []
    monkeypatch.setattr(verify_module, "run_in_child", lambda job: jobs.append(job) or serve(
        job, make_counter=ConstantPowerCounter))
    monkeypatch.setattr(verify_module, "MeterConfig", lambda: MeterConfig(**{**FAST, "warmup_s": 0.5}))
    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds", lambda job, more: jobs.append(job) or serve(
        job, make_counter=ConstantPowerCounter, more=more))
    fp8 = next(t["plan_id"] for t in summary["trials"] if t["trial"] == summary["baselines"]["all-fp8"])
    assert runner.invoke(app, ["verify", str(copy), "--plan", fp8]).exit_code == 0
    assert jobs and not any(j.prefill for j in jobs)  # verify reports no prefill J/token: it meters none
    verify = json.loads((copy / "verify.json").read_text())
    gpu_csv = tmp_path / "gpu.csv"
    gpu_csv.write_text("name, driver_version [MiB], power.limit [W]\nFake GPU, 580.1, 700.00 W\n")
    out = tmp_path / "op"
    script = _vllm_verify_script()
    assert script.main(["operating-collect", str(copy / "verify.json"), str(copy / "summary.json"), "--out", str(out),
                        "--gpu-csv", str(gpu_csv)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert (data["gpu"], data["driver"], data["vllm_version"]) == ("Fake GPU", "580.1", "0.0-fake")
    assert "advisor verify RUN --engine vllm --plan" in data["command"]
    predicted = {p["plan_id"]: p for p in summary["operating_points"]}
    assert {p["plan_id"] for p in data["points"]} == {r["plan_id"] for r in verify["plans"]} >= {fp8}
    for p in data["points"]:
        first, pred = p["trail"][0], predicted[p["plan_id"]]
        assert p["tpot_objective_ms"] == 2.8 and p["predicted_batch"] == pred["batch"] == first["batch"] == 6
        assert p["meets_measured"] and p["batch"] < 6 and p["measured_tpot_ms"] <= 2.8 < first["tpot_ms"]
        assert p["measured_j_per_token"] > 0 and p["measured_ttft_ms"] > 0 and p["tokens_per_s"] > 0
        assert p["predicted_j_per_token"] == pred["j_per_token"]
        assert p["prediction_error_pct"]["j_per_token"] == pytest.approx(
            100 * (pred["j_per_token"] - first["j_per_token"]) / first["j_per_token"])
        curve = {b: j for b, _, j in pred["curve"]}
        if p["batch"] in curve:
            assert p["predicted_j_per_token_at_batch"] == pytest.approx(curve[p["batch"]])
        # vLLM pads a decode batch to its next CUDA-graph size (1, 2, 4, 8, ...): only those are searched
        assert p["batch"] in (1, 2, 4) and all(t["batch"] in (1, 2, 4) for t in p["trail"][1:])
        assert f"batch {p['batch']} is the largest that meets as measured" in p["search"] or (
            f"batch {p['batch']} meets as measured and " in p["search"] and "no batch between them" in p["search"])
        assert p["recommendation"] == (p["plan_id"] == summary["recommendation"]["plan_id"])
    served = {(r["plan_id"], e["workload"]): e for r in verify["plans"] for e in r["energy"]}
    assert [(f["batch"], f["measured_j_per_token"]) for f in data["fixed_batch"] if f["plan_id"] == fp8] == [
        (4, served[fp8, "chat"]["vllm_j_per_token"])]
    md = out.with_suffix(".md").read_text()
    assert "driver 580.1" in md and "| all-fp8 | 2.8 | " in md and "| all-fp8 | 4 | " in md
    # a verify.json without operating points (verify --no-energy, or no objective): one Error line, exit 2
    for r in verify["plans"]:
        r["operating"] = []
    (copy / "verify.json").write_text(json.dumps(verify))
    capsys.readouterr()
    assert script.main(["operating-collect", str(copy / "verify.json"), str(copy / "summary.json"),
                        "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1 and "tpot_ms" in err


# ------------------------------------------------------------- the decision as served (verify.md's first lines)
def _served_plan(role, plan_id, point, searched=None):
    operating = {"workload": "chat", "batch": point["batch"], "vllm": point}
    if searched is not None:
        operating["vllm_search"] = searched
    return {"role": role, "plan_id": plan_id, "operating": [operating]}


def _at(batch, j, meets, tpot=5.0):
    return {"batch": batch, "j_per_token": j, "meets": meets, "tpot_ms": tpot}


def _decision(result):
    """served_decision of ``result`` (its plans and operating points), completed into a verify result."""
    from advisor.deploy.verification import served_decision
    from advisor.report import VerifyResult

    plans = [{"label": r["plan_id"], "checkpoint": "", "formats_match": True, "served_formats": {},
              "proxy_kl": None, "accuracy": {}, **r,
              "operating": [{"predicted": {"batch": o["batch"]}, "vllm_unstable": False, "batch_full": True, **o}
                            for o in r["operating"]]} for r in result["plans"]]
    return served_decision(VerifyResult.model_validate(
        {"run": "r", "engine": "vllm", "vllm_version": "0.26.0", "gpu": "H100", "date": "2026-11-28",
         "verified": True, "plans": plans}))


def test_the_decision_as_served_compares_each_plan_at_its_largest_batch_that_met_in_vllm():
    from advisor.search.frontier import percent_less

    # all-BF16 missed at its predicted batch 40 and met at 30 after the search; the recommendation met at 90
    rec, bf16 = _at(90, 0.07, True), _at(30, 0.12, True)
    searched = {**bf16, "trail": [_at(40, 0.11, False), bf16]}
    result = {"plans": [_served_plan("bf16", "b", _at(40, 0.11, False), searched=searched),
                        _served_plan("recommendation", "r", rec)]}
    (line,) = [x for x in _decision(result) if x.startswith("- ")]
    assert "batch 90 at 0.07 J/token" in line and "batch 30 at 0.12 J/token" in line and "batch 40" not in line
    assert f"{percent_less(0.07, 0.12)} less energy per token" in line
    # all-BF16 searched around its prediction, the recommendation met at its predicted batch with nothing larger
    # served: each basis is named
    assert "the recommendation at its predicted operating batch, which met the objective in vLLM (no larger batch " \
        "was served), all-BF16 at its largest batch that met the objective in vLLM" in line
    # both met at their predicted batches, nothing larger served: not called the largest that met
    result["plans"][0] = _served_plan("bf16", "b", bf16, searched={**bf16, "trail": [bf16]})
    (line,) = [x for x in _decision(result) if x.startswith("- ")]
    assert line.endswith("each at its predicted operating batch, which met the objective in vLLM (no larger batch "
                         "was served).") and "largest" not in line

    # the recommendation costs more than BF16 as served: said, and no saving
    result["plans"][1]["operating"][0]["vllm"] = _at(90, 0.13, True)
    (line,) = [x for x in _decision(result) if x.startswith("- ")]
    assert "costs more than all-BF16 as served" in line and "less energy" not in line

    # one of them met the objective at no batch served: no saving stated
    result["plans"][1]["operating"][0]["vllm"] = _at(1, 0.5, False, tpot=9.0)
    (line,) = [x for x in _decision(result) if x.startswith("- ")]
    assert line.startswith("- 'chat': the recommendation met the objective at no batch") and "less energy" not in line

    # the recommendation is all-BF16: its point, no comparison
    one = {"plans": [_served_plan("bf16+recommendation", "b", bf16)]}
    (line,) = [x for x in _decision(one) if x.startswith("- ")]
    assert "the recommendation is all-BF16" in line and "batch 30" in line
    assert _decision({"plans": [{"role": "bf16+recommendation", "plan_id": "b", "operating": []}]}) == []


def test_served_kl_is_bounded_to_the_first_held_out_sequences_and_verify_says_so(run_dir, engine, monkeypatch):
    from advisor.deploy.vllm import within_budget
    from advisor.workflows import verify as verify_module

    five = (1,) * 5  # 4 positions: 40 entries at a vocabulary of 10
    assert within_budget([five] * 3, 10, 80) == [five] * 2 and within_budget([five] * 3, 10, 1) == [five]
    monkeypatch.setattr(verify_module, "within_budget", lambda seqs, vocab, _entries: within_budget(seqs, vocab,
                                                                                                  31 * vocab))
    res = runner.invoke(app, ["verify", str(run_dir), "--no-energy"])
    assert res.exit_code == 0, res.output
    data = json.loads((run_dir / "verify.json").read_text())
    for r in data["plans"]:
        a = r["accuracy"]
        assert (a["sequences"], a["heldout_sequences"], a["positions"]) == (1, 2, 31) and a["served_kl"] > 0
    assert "on the first 1 of the run's 2 held-out sequences" in (run_dir / "verify.md").read_text()


def test_verify_md_sets_served_kl_beside_the_proxy_and_names_a_plan_over_the_budget_as_served():
    from advisor.deploy.verification import render_verify
    from advisor.report import VerifyResult

    def plan(role, pid, served, proxy):
        return {"role": role, "plan_id": pid, "label": pid, "checkpoint": f"/ckpt/{pid}", "formats_match": True,
                "served_formats": {}, "accuracy": {"served_kl": served, "advisor_kl": proxy}, "proxy_kl": proxy,
                "energy": []}

    result = {"run": "r", "engine": "vllm", "vllm_version": "0.26.0", "gpu": "H100", "date": "2026-11-28",
              "max_kl": 0.05, "verified": True,
              "plans": [plan("bf16", "b", 0.001, 0.0), plan("recommendation", "r", 0.06, 0.048)]}
    text = render_verify(VerifyResult.model_validate(result))
    assert "| `r` | recommendation | 0.06 | 0.048 | 0.048 | +25.0% |" in text
    assert "**Over the accuracy budget as served:** plan r (recommendation) served KL 0.06 against max_kl 0.05" in text
    result["plans"][1]["accuracy"]["served_kl"] = 0.049
    assert "Over the accuracy budget" not in render_verify(VerifyResult.model_validate(result))


def test_verify_md_says_how_busy_the_gpu_was_and_when_the_host_held_it_back():
    from advisor.deploy.verification import render_verify
    from advisor.report import VerifyResult

    def row(busy):
        return {"workload": "chat", "vllm_j_per_token": 0.07, "vllm_unstable": False, "batch_full": True,
                "vllm_tokens_per_s": 9e3, "gpu_busy_pct": busy}

    def result(busy):
        return VerifyResult.model_validate({
            "run": "r", "engine": "vllm", "vllm_version": "0.26.0", "gpu": "H200", "date": "2026-11-29",
            "max_kl": 0.1, "verified": True,
            "plans": [{"role": "recommendation", "plan_id": "r", "label": "r", "checkpoint": "/ckpt/r",
                       "formats_match": True, "served_formats": {}, "accuracy": {}, "proxy_kl": 0.01,
                       "energy": [row(busy)]}]})

    text = render_verify(result(78.4))
    assert "| predicted J/token | vs vLLM | steady | GPU busy % |" in text and "| yes | 78 |" in text
    assert "GPU busy under 90% (NVML's utilization over the load): the GPU waited on the engine's host side" in text
    assert "GPU busy under" not in render_verify(result(99.0))
    assert "| yes | n/a |" in render_verify(result(None))  # not read (a run before it was recorded)
    stalled = result(84.1)
    stalled.plans[0].energy[0].vllm_starved_windows = 6  # round 5's stall: the meter left six windows out
    assert "| yes (6 starved windows left out) | 84 |" in render_verify(stalled)

    assert "Another GPU of this host" not in render_verify(stalled)  # nothing read beside it
    beside = result(99.0)
    beside.plans[0].energy[0].other_gpus_busy_pct = 62.4  # round 8: another verify on the host's other GPU
    assert ("Another GPU of this host was busy during 1 of these 1 meterings (up to 62%, NVML's utilization)"
            in render_verify(beside))
    beside.plans[0].energy[0].other_gpus_busy_pct = 3.0  # an idle neighbour's housekeeping
    assert "Another GPU of this host" not in render_verify(beside)


# ------------------------------------------------------------- several plans at once, each engine on GPUs of its own
def test_verify_with_workers_serves_plans_at_once_each_on_its_own_gpu(run_dir, engine, monkeypatch):
    import threading

    from advisor.workflows import verify as verify_module

    monkeypatch.setattr("advisor.deploy.serving_gpus.visible_gpus", lambda: (2, 80 * 2**30))
    monkeypatch.setattr("advisor.deploy.engine_slots.device_id", lambda i: f"GPU-fake-{i}")
    both_started, threads = threading.Barrier(2, timeout=30), set()

    def served_at_once(job):  # returns only once the other plan's engine has started too
        threads.add(threading.get_ident())
        both_started.wait()
        return serve(job, make_counter=ConstantPowerCounter)

    monkeypatch.setattr(verify_module, "run_in_child", served_at_once)
    fp8 = next(t["plan_id"] for t in json.loads((run_dir / "summary.json").read_text())["trials"]
               if set(t["formats"].values()) == {"fp8"})
    res = runner.invoke(app, ["verify", str(run_dir), "--plan", fp8, "--no-energy", "--workers", "2"])
    assert res.exit_code == 0, res.output
    data = json.loads((run_dir / "verify.json").read_text())
    assert len(data["plans"]) == 2 and len(threads) == 2
    assert sorted(d for r in data["plans"] for d in r["devices"]) == ["GPU-fake-0", "GPU-fake-1"]
    assert all(r["formats_match"] is True for r in data["plans"])
    # more engines than the GPUs hold: one Error line, exit 3, before anything is exported or served
    before = len(engine.instances)
    res = runner.invoke(app, ["verify", str(run_dir), "--plan", fp8, "--workers", "3"])
    assert res.exit_code == 3 and res.output.count("Error:") == 1 and "--workers 3" in res.output
    assert len(engine.instances) == before


def test_slots_run_every_task_once_at_most_one_per_slot_and_report_the_first_failure():
    import threading
    import time

    from advisor.deploy.engine_slots import Slot, run_on_slots

    slots = [Slot(0, ("GPU-a",)), Slot(1, ("GPU-b",))]
    held, lock, overlap = set(), threading.Lock(), []

    def work(task, slot):
        with lock:
            overlap.append(slot.devices in held)
            held.add(slot.devices)
        time.sleep(0.01)
        with lock:
            held.discard(slot.devices)
        return task * 10

    assert run_on_slots(list(range(7)), slots, work) == [t * 10 for t in range(7)]
    assert len(overlap) == 7 and not any(overlap)  # no slot was held by two tasks at once
    done = []

    def fails_on_two(task, slot):
        if task == 2:
            raise ValueError("task 2")
        done.append(task)
        return task

    with pytest.raises(ValueError, match="task 2"):
        run_on_slots([1, 2, 3, 4], slots, fails_on_two)
    assert sorted(done) == [1, 3, 4]  # the others ran to their end


def test_an_engines_process_sees_only_its_jobs_gpus(monkeypatch):
    import os

    from advisor.deploy.vllm import ServeJob, pin_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    pin_devices(ServeJob(checkpoint="ck", vocab_size=8))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # no devices named: this process's
    pin_devices(ServeJob(checkpoint="ck", vocab_size=8, devices=("GPU-b", "GPU-d")))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-d"


def test_slots_interrupted_start_no_further_task(monkeypatch):
    import threading

    from advisor.deploy import engine_slots
    from advisor.deploy.engine_slots import Slot, run_on_slots

    started, release = [], threading.Event()

    def work(task, slot):
        started.append(task)
        release.wait(5)
        return task

    def interrupted(futures):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_slots, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_on_slots(list(range(6)), [Slot(0, ("GPU-a",))], work)
    release.set()
    assert len(started) <= 1  # the one serving ends as it would; the five waiting never start


def test_with_workers_all_bf16_and_the_recommendation_share_a_gpu(tmp_path, monkeypatch):
    import threading

    from advisor.deploy.vllm import ServeJob
    from advisor.formats import Format
    from advisor.plan import Plan
    from advisor.workflows.verify_serving import Serving, serve_plans

    monkeypatch.setattr("advisor.deploy.serving_gpus.visible_gpus", lambda: (2, 80 * 2**30))
    monkeypatch.setattr("advisor.deploy.engine_slots.device_id", lambda i: f"GPU-fake-{i}")
    plans = {"bf16": Plan.uniform(["a", "b"], Format.BF16), "recommendation": Plan({"a": Format.FP8, "b": Format.BF16}),
             "fp8": Plan.uniform(["a", "b"], Format.FP8)}
    order, lock = [], threading.Lock()

    def runner(job):
        with lock:
            order.append(job.checkpoint)
        return {"served": {}}

    summary = {"workloads": [], "operating_points": []}
    serving = Serving(tmp_path, summary, ServeJob(checkpoint="", vocab_size=8), False, "0.0-fake", "Fake GPU", runner)
    served = serve_plans(plans, {r: tmp_path / r for r in plans}, serving, workers=2)
    assert served["bf16"]["devices"] == served["recommendation"]["devices"] != served["fp8"]["devices"]
    assert order.index(str(tmp_path / "bf16")) < order.index(str(tmp_path / "recommendation"))
    assert {p.stem for p in (tmp_path / "verify_served").glob("*.json")} == {p.id for p in plans.values()}


def test_the_decision_as_served_says_when_its_two_plans_ran_on_different_gpus():
    rec, bf16 = _served_plan("recommendation", "r", _at(90, 0.07, True)), _served_plan("bf16", "b", _at(30, 0.12, True))
    rec["devices"], bf16["devices"] = ["GPU-x"], ["GPU-y"]
    assert any("different GPUs of this node (GPU-x; GPU-y)" in line for line in _decision({"plans": [bf16, rec]}))
    rec["devices"] = ["GPU-y"]
    assert not any("different GPUs" in line for line in _decision({"plans": [bf16, rec]}))


def test_quick_refuses_a_further_plan_before_any_model_is_read(tmp_path):
    from advisor.errors import InputError
    from advisor.workflows.verify import verify_run

    with pytest.raises(InputError, match="--quick serves the recommendation and all-BF16 only"):
        verify_run(tmp_path / "no_run", plan_ids=("abc",), quick=True)



def test_quick_serves_the_recommendation_and_bf16_with_fewer_kl_positions_and_says_where_time_went(run_dir, engine,
                                                                                                 monkeypatch):
    from advisor.workflows import verify as verify_module

    monkeypatch.setattr(verify_module, "QUICK_KL_ENTRIES", 31 * 2048)  # one held-out sequence of 32 tokens
    res = runner.invoke(app, ["verify", str(run_dir), "--quick"])
    assert res.exit_code == 0, res.output
    data = json.loads((run_dir / "verify.json").read_text())
    assert data["quick"] is True and {p for r in data["plans"] for p in r["role"].split("+")} == {
        "bf16", "recommendation"}
    assert all(r["accuracy"]["sequences"] == 1 for r in data["plans"])
    t = data["timings_s"]
    assert t["total_s"] >= t["serving_s"] > 0 and set(t["export_s"]) == {r["role"] for r in data["plans"]}
    for p in t["plans"].values():
        assert p["engine_start_s"] >= 0 and p["meterings"] and all(m["seconds"] > 0 for m in p["meterings"])
    text = (run_dir / "verify.md").read_text()
    assert "### Time" in text and "(--quick)" in text and "took " in res.output
    # --quick proves the predicted operating batch only: no step up, so the engine is sized for that batch
    assert {llm.kwargs["max_num_seqs"] for llm in engine.instances[-len(data["plans"]):]} == {6}


def test_a_batch_served_for_a_stated_workload_is_compared_as_the_largest_that_met():
    """The search's answer can be a batch of the same load served for a stated workload (its own trail holds only
    the predicted batch, which missed): the decision then compares it as the largest batch that met, never as the
    predicted one. Round 4's verify.json (an FP8 8B on an H200), its recommendation's tpot8 answer so replaced."""
    from advisor.deploy.verification import render_verify
    from advisor.report import VerifyResult

    data = json.loads((Path(__file__).resolve().parents[1] / "reports/benchmarks/verify_time_data/round4/verify.json")
                      .read_text())
    rec = next(p for p in data["plans"] if p["role"] == "recommendation")
    o = next(o for o in rec["operating"] if o["workload"] == "tpot8")
    first = o["vllm_search"]["trail"][0]
    o["vllm_search"].update(batch=64, tpot_ms=7.9, j_per_token=0.0744, meets=True, trail=[first],
                            search="batch 64 meets as measured and 80 misses, no batch between them runs differently "
                                   "(batch 64 metered for 'tpot12' in the same engine)")
    text = render_verify(VerifyResult.model_validate(data))
    line = next(x for x in text.splitlines() if x.startswith("- 'tpot8': the recommendation"))
    assert "at batch 64" in line and "the recommendation at its largest batch that met the objective in vLLM" in line
    assert "- `fe6b6a3cd096` on 'tpot8': batches 80 (" in text  # listed among the searched, with what answered it


@pytest.mark.parametrize("order", [("all-bf16", "all-fp8"), ("all-fp8", "all-bf16")])
def test_random_checkpoints_quantize_the_model_itself_only_for_the_last_plan(order, tmp_path, monkeypatch):
    """benchmarks/vllm_verify.py's random checkpoints (the GPU rounds' models): the last plan is quantized in place,
    so an MoE of 30B (61 GB in BF16) is not held twice on the GPU; a plan written after a quantized one is still the
    unquantized model."""
    from safetensors.torch import load_file

    from advisor.models.groups import model_shape

    script = _vllm_verify_script()
    copies = []
    real_deepcopy = script.copy.deepcopy

    def counted(x, *args, **kwargs):  # copies of the whole model, not the parts a deepcopy recurses into
        if type(x).__name__ == "LlamaForCausalLM":
            copies.append(x)
        return real_deepcopy(x, *args, **kwargs)

    monkeypatch.setattr(script.copy, "deepcopy", counted)
    config = script.llama31_8b_config(tiny=True)
    from transformers import AutoModelForCausalLM

    groups = model_shape(AutoModelForCausalLM.from_config(config)).groups
    plans = script.standard_plans(groups, [g.name for g in groups])
    paths = script.build_checkpoints(config, {name: plans[name] for name in order}, tmp_path, "cpu")
    assert len(copies) == (1 if order[0] == "all-fp8" else 0)

    def weight_dtypes(path):
        tensors = {}
        for f in sorted(path.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        return {str(t.dtype) for k, t in tensors.items() if k.endswith("mlp.down_proj.weight")}

    assert weight_dtypes(paths["all-bf16"]) == {"torch.bfloat16"}
    assert weight_dtypes(paths["all-fp8"]) == {"torch.float8_e4m3fn"}
    assert (paths["all-fp8"] / "hf_quant_config.json").is_file()
