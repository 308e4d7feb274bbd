"""`advisor verify`'s engines started while the plans export (advisor.workflows.verify_early), on a run of a BF16 copy
of the tiny model (all-BF16 served from its own folder as it is, the other plan once exported), with the fake vllm
module served in-process: they meter one at a time once the exports are done and every engine has started, a failed
export stops them, and a failed early engine is served again after the exports."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import types

import pytest
from conftest import TINY_MODEL, need, verify_recipe_dict
from typer.testing import CliRunner

from advisor.cli import app
from advisor.deploy.vllm import serve
from advisor.errors import InputError
from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

runner = CliRunner()
FAST = {"warmup_s": 0.5, "min_window_s": 0.3, "min_ticks": 20, "repeats": 3, "idle_s": 0.05, "max_cv": 0.5}
KV = 2**30


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A search over a BF16 copy of the tiny model (its folder serves all-BF16 as it is)."""
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.recipe.schema import validate_recipe
    from advisor.workflows.search import run

    folder = tmp_path_factory.mktemp("bf16") / "tiny-bf16"
    AutoModelForCausalLM.from_pretrained(need(TINY_MODEL), dtype=torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TINY_MODEL / name, folder / name)
    recipe = validate_recipe(verify_recipe_dict(folder, tmp_path_factory.mktemp("runs"), name="tiny-bf16"))
    run(recipe)
    return recipe.run_dir, folder


@pytest.fixture
def served(monkeypatch, bf16_run):
    """The fake engine served in-process; every job it got, and when a held one was let meter."""
    from advisor.deploy.verification import FOLDER
    from advisor.energy.meter import MeterConfig
    from advisor.workflows import verify as verify_module

    shutil.rmtree(bf16_run[0] / FOLDER, ignore_errors=True)
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(step_s=0.002))
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h100", "Fake GPU"))
    monkeypatch.setattr(verify_module, "STEADY_LOAD_METER", MeterConfig(**FAST))
    monkeypatch.setattr("advisor.workflows.verify_early.engine_beside",
                        lambda shape, batch, longest, beside, free_bytes=None: (0.3, KV))
    record = {"jobs": [], "went_at": None, "exported_at": None, "holding": {}, "went": {}, "ended": {}}

    def rounds(job, more):
        record["jobs"].append(job)
        if job.hold and "engine_checkpoints" in job.checkpoint:
            time.sleep(0.5)  # an exported plan's engine still starting after the exports: the others wait for it

        def asked(rows):
            if not rows:
                record["holding"][job.checkpoint] = time.perf_counter()
            answer = more(rows)
            if not rows:
                record["went_at"] = record["went"][job.checkpoint] = time.perf_counter()
            return answer

        answer = serve(job, make_counter=ConstantPowerCounter, more=asked)
        record["ended"][job.checkpoint] = time.perf_counter()
        return answer

    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds", rounds)
    exports = verify_module.export_plans

    def timed_exports(*args, **kwargs):
        time.sleep(0.3)  # the held engine is waiting by now
        paths = exports(*args, **kwargs)
        record["exported_at"] = time.perf_counter()
        return paths

    monkeypatch.setattr(verify_module, "export_plans", timed_exports)
    return record


def _fp8(run_dir):
    return next(t["plan_id"] for t in json.loads((run_dir / "summary.json").read_text())["trials"]
                if set(t["formats"].values()) == {"fp8"})


def test_every_engine_starts_during_the_exports_and_they_meter_one_after_another_after_them(bf16_run, served):
    run_dir, folder = bf16_run
    res = runner.invoke(app, ["verify", str(run_dir), "--plan", _fp8(run_dir)])
    assert res.exit_code == 0, res.output
    assert "its engine starts while the plans export, and meters once they are done" in res.output
    # the exported plan's engine, still starting
    assert f"the first metering waits for plan {_fp8(run_dir)} (--plan): its engine is still starting" in res.output
    held = [j for j in served["jobs"] if j.hold]
    # all-BF16 from the model's own folder at once, all-FP8 (the recommendation here) once its export is written
    assert held[0].checkpoint == str(folder) and len(held) == 2 and "engine_checkpoints" in held[1].checkpoint
    assert all(j.kv_cache_bytes == KV and j.gpu_memory_utilization == 0.3 for j in held)
    assert [j for j in served["jobs"] if not j.hold] == []  # no engine left to start after the exports
    first, second = (j.checkpoint for j in held)
    assert served["went"][first] >= served["exported_at"]  # no metering beside an export,
    assert served["went"][first] >= served["holding"][second]  # nor beside another engine's start,
    assert served["went"][second] >= served["ended"][first]  # nor beside another metering
    data = json.loads((run_dir / "verify.json").read_text())
    bf16 = next(r for r in data["plans"] if "bf16" in r["role"].split("+"))
    assert bf16["energy"][0]["vllm_j_per_token"] > 0
    role = bf16["role"]
    assert data["timings_s"]["plans"][role]["held_s"] >= 0
    assert f"{role}'s engine started while the plans exported, then waited" in (run_dir / "verify.md").read_text()


def test_a_failed_export_stops_the_held_engine_unmetered(bf16_run, served, monkeypatch):
    from advisor.workflows import verify as verify_module

    def failing(*_args, **_kwargs):
        time.sleep(0.3)
        raise InputError("the export failed")

    monkeypatch.setattr(verify_module, "export_plans", failing)
    res = runner.invoke(app, ["verify", str(bf16_run[0]), "--plan", _fp8(bf16_run[0])])
    assert res.exit_code == 2 and "the export failed" in res.output
    assert served["went_at"] is None  # it never metered
    assert not any(t.name == "verify-early-engine" for t in threading.enumerate())


def test_an_early_engine_that_fails_is_served_again_after_the_exports(bf16_run, served, monkeypatch):
    def no_room(job, more):
        served["jobs"].append(job)
        if job.hold:
            raise RuntimeError("CUDA out of memory")
        return serve(job, make_counter=ConstantPowerCounter, more=more)

    monkeypatch.setattr("advisor.deploy.vllm._engine._run_rounds", no_room)
    res = runner.invoke(app, ["verify", str(bf16_run[0]), "--plan", _fp8(bf16_run[0])])
    assert res.exit_code == 0, res.output
    assert "the engine started during the exports failed (RuntimeError: CUDA out of memory); serving" in res.output
    folder = str(bf16_run[1])
    assert [j.hold for j in served["jobs"] if j.checkpoint == folder] == [True, False]


def test_an_engine_starts_beside_the_exports_only_where_both_fit(monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.deploy import serving_gpus
    from advisor.models.adapters.geometry import model_shape

    gib = 2**30
    shape = model_shape(AutoModelForCausalLM.from_pretrained(need(TINY_MODEL)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(serving_gpus, "release_gpu_memory", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _i=0: (100 * gib, 140 * gib))
    share, kv = serving_gpus.engine_beside(shape, 240, 768, beside_bytes=40 * gib)
    per_token = shape.kv_bytes_per_token()
    assert kv >= 240 * 768 * per_token and kv <= 1.1 * 240 * 768 * per_token + gib + 1  # the pool the loads need
    assert share == pytest.approx((serving_gpus.bf16_weight_bytes(shape) + kv
                                   + serving_gpus.EARLY_ENGINE_RESERVE_BYTES) / (140 * gib))
    assert serving_gpus.engine_beside(shape, 240, 768, beside_bytes=95 * gib) is None  # the exports need it
    # what another engine started meanwhile holds, taken out of what was free before it
    assert serving_gpus.engine_beside(shape, 240, 768, beside_bytes=40 * gib, free_bytes=40 * gib) is None
    assert serving_gpus.engine_beside(shape, 240, 768, beside_bytes=0, free_bytes=40 * gib) == (share, kv)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert serving_gpus.engine_beside(shape, 240, 768, beside_bytes=0) is None


def test_the_engines_memory_is_counted_by_reservation_and_the_exports_kept_room_while_any_is_left(monkeypatch):
    # what the GPU says is free while an engine starts counts its memory as free: each engine started holds its share
    # of what was free before the first
    from advisor.workflows import verify_early

    room: list[tuple[int, int]] = []

    class Started:
        reserved_bytes = 10

    def start_early(role, plan, path, s, shape, beside_bytes, free_bytes):
        room.append((beside_bytes, free_bytes))
        return Started() if role != "x" else None  # x does not fit

    monkeypatch.setattr(verify_early, "start_early", start_early)
    monkeypatch.setattr("advisor.deploy.serving_gpus.free_gpu_bytes", lambda: 1000)
    engines = verify_early.EarlyEngines(None, None, exports_bytes=100, roles=["bf16", "recommendation", "x"])
    plan = types.SimpleNamespace(id="p")
    engines._start("bf16", plan, None)  # before the exports (start_bf16)
    engines.start("bf16", plan, None)  # its turn in the exports: served from the folder, started already
    engines.start("recommendation", plan, None)  # exported; x still to export
    engines.start("x", plan, None)  # the last export: no room kept for the exports
    assert room == [(100, 1000), (100, 990), (0, 980)]
    assert list(engines.started) == ["bf16", "recommendation"]


def test_a_kept_serving_is_the_same_job_whether_its_engine_started_early_or_not():
    from dataclasses import replace

    from advisor.deploy.verification import serving_key
    from advisor.deploy.vllm import ServeJob

    job = ServeJob(checkpoint="/m", vocab_size=64, workloads=({"name": "chat", "batch_size": 4},))
    early = replace(job, hold=True, kv_cache_bytes=KV, gpu_memory_utilization=0.3)
    assert serving_key(job, "0.26.0", "H200", True) == serving_key(early, "0.26.0", "H200", True)
    assert serving_key(job, "0.26.0", "H200", True) != serving_key(replace(job, checkpoint="/n"), "0.26.0", "H200",
                                                                   True)


def test_the_first_engine_s_process_is_started_before_the_model_loads(bf16_run, monkeypatch):
    # vLLM's import in that process (20-46 s on the lent H200s) overlaps the model's load, not only the exports
    import contextlib

    from advisor.workflows import verify as verify_module

    run_dir, folder = bf16_run
    summary = json.loads((run_dir / "summary.json").read_text())
    seen: dict = {}

    @contextlib.contextmanager
    def ahead(architectures, jobs=None):
        seen.update(architectures=architectures, jobs=jobs, entered=True)
        yield

    class Loaded(Exception):
        pass

    def load(spec, device="cpu"):
        seen["loaded_inside"] = seen.get("entered", False)
        raise Loaded

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    monkeypatch.setattr("advisor.energy.prediction.gpu_here", lambda: ("h100", "Fake GPU"))
    monkeypatch.setattr(verify_module, "processes_ahead", ahead)
    monkeypatch.setattr("advisor.models.loading.load_model", load)
    with pytest.raises(Loaded):
        verify_module.verify_run(run_dir)
    assert seen["loaded_inside"] and seen["architectures"] == tuple(
        json.loads((folder / "config.json").read_text())["architectures"])
    rec = summary["recommendation"]["plan_id"]
    bf16 = next(t["plan_id"] for t in summary["trials"] if t["trial"] == summary["baselines"]["all-bf16"])
    assert seen["jobs"] == len({rec, bf16})


def test_engines_to_start_and_the_architectures_read_without_a_load(tmp_path):
    from advisor.plan import Plan
    from advisor.recipe.schema import ModelSpec
    from advisor.workflows.verify import config_architectures, engines_to_start

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert config_architectures(ModelSpec(source=str(tmp_path / "m"))) == ("Qwen2ForCausalLM",)
    assert config_architectures(ModelSpec(source=str(tmp_path / "missing"))) == ()  # the load says what is wrong
    a, b = Plan({"g": "bf16"}), Plan({"g": "fp8"})
    summary = {"baselines": {"all-bf16": 3}, "trials": [{"trial": 3, "plan_id": a.id}]}
    assert engines_to_start(summary, {"recommendation": b, "x": b}) == 2
    assert engines_to_start(summary, {"recommendation": a}) == 1  # the recommendation is all-BF16
    assert engines_to_start({"trials": []}, {"recommendation": b}) is None
