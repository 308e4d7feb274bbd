"""vLLM over several GPUs of a node (tensor parallelism): the summed meter, the engine's option, the GPU count
where serving is chosen, and the prediction for N GPUs; on CPU against the fake ``vllm`` module and fake counters."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from advisor.deploy.vllm import ServeJob, serve
from advisor.energy.meter import GPUState, MeterConfig, SummedCounter, combined_state, summed_config
from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

# warm-up >= 0.5 s: a busy 2-core machine finished no step in less
FAST = {"warmup_s": 0.5, "min_window_s": 0.3, "min_ticks": 20, "repeats": 3, "idle_s": 0.05, "max_cv": 0.2}
STATE = GPUState("NVIDIA H100 80GB HBM3", 0, "570.1", 700.0, 1980, 2619, 40, 100.0, "GPU-a")


def checkpoint(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "vocab_size": 64}))
    return path


class _Gpu(ConstantPowerCounter):
    """A fake GPU at ``power_w`` with its own state."""

    def __init__(self, power_w: float, state: GPUState) -> None:
        super().__init__(power_w)
        self._state = state

    def state(self) -> GPUState:
        return self._state


class _Fixed:
    def __init__(self, mj: int, state: GPUState) -> None:
        self.mj, self._state = mj, state

    def energy_mj(self) -> int:
        return self.mj

    def state(self) -> GPUState:
        return self._state


def test_the_summed_counter_adds_every_gpus_energy_and_reports_the_hottest_and_slowest():
    a = STATE
    b = replace(STATE, index=1, sm_clock_mhz=1755, temperature_c=63, power_w=250.0, uuid="GPU-b")
    counters = [_Fixed(1200, a), _Fixed(34, b)]
    summed = SummedCounter(counters)
    assert summed.energy_mj() == 1234
    s = summed.state()
    assert s.name == "2x NVIDIA H100 80GB HBM3" and s.temperature_c == 63 and s.sm_clock_mhz == 1755
    assert s.power_w == 350.0 and s.power_limit_w == 1400.0 and s.uuid == "GPU-a,GPU-b" and s.driver == "570.1"
    assert combined_state([a]) == a  # one GPU: its own state
    mixed = combined_state([a, replace(b, name="NVIDIA H200")])
    assert mixed.name == "NVIDIA H100 80GB HBM3 + NVIDIA H200"


def test_a_summed_window_asks_every_gpus_ticks():
    cfg = MeterConfig(min_ticks=50)
    assert summed_config(cfg, 1) is cfg and summed_config(cfg, 4).min_ticks == 200


def test_serving_over_two_gpus_passes_tensor_parallelism_and_meters_both(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.002)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    opened = []
    powers = {0: 300.0, 1: 200.0}

    def nvml_device(index, uuid=None):
        opened.append((index, uuid))
        return _Gpu(powers[index], replace(STATE, index=index, uuid=f"GPU-{uuid}"))

    monkeypatch.setattr("advisor.energy.meter._nvml.NvmlDevice", nvml_device)
    monkeypatch.setattr("advisor.energy.meter._summed.torch_device_uuid", lambda i: f"uuid-of-cuda{i}")
    job = ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, prefill=False, meter=FAST,
                   tensor_parallel_size=2,
                   workloads=({"name": "chat", "batch_size": 4, "input_tokens": 8, "output_tokens": 16},))
    out = serve(job)
    assert vllm.instances[0].kwargs["tensor_parallel_size"] == 2 and out["tensor_parallel_size"] == 2
    assert opened == [(0, "uuid-of-cuda0"), (1, "uuid-of-cuda1")]  # torch's first two GPUs, found by UUID
    import os

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    row = out["energy"]["chat"]
    # both GPUs' 500 W over the tokens: J/token = 500 / tokens/s (one GPU's 300 W would be 40% less)
    assert row["j_per_token"] == pytest.approx(500.0 / row["tokens_per_s"], rel=0.1)
    assert row["measurement"]["gpu_before"]["name"] == "2x NVIDIA H100 80GB HBM3"


def test_one_gpu_serves_as_before(tmp_path, monkeypatch):
    vllm = fake_vllm(step_s=0.0)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    serve(ServeJob(str(checkpoint(tmp_path / "ck")), vocab_size=64, formats=False, prefill=False))
    assert vllm.instances[0].kwargs["tensor_parallel_size"] == 1


# ---------------------------------------------------------------------------------- how many GPUs serve
GIB = 2**30


def test_the_fewest_gpus_that_hold_a_70b_divide_its_heads():
    from advisor.deploy.serving_gpus import fewest_gpus

    weights, kv = 141 * 10**9, 20 * GIB  # a 70B in BF16; batch 64 of 768 tokens is ~15 GiB of KV
    # per GPU 0.85 x 80 GiB less 4 GiB: 64 GiB; two hold 75 GiB each (no), three do not divide 64 heads, four do
    assert fewest_gpus(weights, kv, 80 * GIB, heads=64, most=8) == 4
    assert fewest_gpus(weights, kv, 141 * GIB, heads=64, most=8) == 2  # an H200 pair
    assert fewest_gpus(weights, kv, 80 * GIB, heads=64, most=2) is None
    assert fewest_gpus(2 * GIB, 0, 80 * GIB, heads=9, most=8) == 1


def test_a_gpu_count_vllm_refuses_is_exit_2_and_more_than_visible_exit_3(monkeypatch):
    from advisor.deploy import serving_gpus as sg
    from advisor.errors import InputError, SetupError

    monkeypatch.setattr(sg, "visible_gpus", lambda: (2, 80 * GIB))
    assert sg.serving_gpus(2, 64, 10 * GIB, 0) == 2
    with pytest.raises(SetupError, match=r"--gpus 4: torch sees 2 GPU\(s\) here.*give --gpus 2 or fewer"):
        sg.serving_gpus(4, 64, 10 * GIB, 0)
    with pytest.raises(InputError, match="--gpus 3: vLLM splits the model's 64 attention heads evenly.*1, 2, 4, 8"):
        sg.serving_gpus(3, 64, 10 * GIB, 0)
    # unset: the fewest that hold it, here one; both needed for a model of 100 GiB; none for 200 GiB
    assert sg.serving_gpus(None, 64, 10 * GIB, 0) == 1
    assert sg.serving_gpus(None, 64, 100 * GIB, 0) == 2
    with pytest.raises(SetupError, match="fits no count of the 2 GPUs of 80 GiB"):
        sg.serving_gpus(None, 64, 200 * GIB, 0)
    monkeypatch.setattr(sg, "visible_gpus", lambda: (1, 80 * GIB))
    assert sg.serving_gpus(None, 64, 200 * GIB, 0) == 1  # one GPU: vLLM says whether it fits


def test_the_measured_tier_serves_over_the_recipes_gpus_and_labels_them(tmp_path, monkeypatch):
    from advisor.deploy.vllm import VllmEnergyModel
    from advisor.formats import Format
    from advisor.plan import LayerGroup, Plan
    from advisor.recipe.schema import Workload

    jobs = []

    def runner(job):
        jobs.append(job)
        m = {"unstable": False}
        return {"energy": {"chat": {"j_per_token": 0.5, "tokens_per_s": 100.0, "measurement": m, "batch_full": True,
                                    "fewest_inflight": 16}}}

    model = VllmEnergyModel(lambda _p: tmp_path, [Workload(name="chat")], 64, runner=runner, vllm_version="0.26.0",
                            gpu_label="4x NVIDIA H100 80GB HBM3, driver 570.1", gpus=4)
    plan = Plan.uniform([LayerGroup("layers.0.o", ("o",), ((8, 8),))], Format.BF16)
    est = model.estimate(plan, Workload(name="chat"))
    assert jobs[0].tensor_parallel_size == 4
    assert est.source.startswith("measured (vLLM 0.26.0, 4x NVIDIA H100 80GB HBM3, driver 570.1, tp=4, ")


def test_gpus_belong_to_serving_and_the_dry_run(tmp_path):
    from typer.testing import CliRunner

    from advisor.cli import app
    from advisor.recipe.schema import load_recipe

    runner = CliRunner()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"formats": {}}))
    res = runner.invoke(app, ["measure", "--plan", str(plan), "--gpus", "2"])
    assert res.exit_code == 2 and res.output.count("Error:") == 1 and "only --engine vllm" in res.output
    res = runner.invoke(app, ["recheck", "--recommendation", str(tmp_path), "--model", "x", "--gpus", "2"])
    assert res.exit_code == 2 and res.output.count("Error:") == 1 and "only --engine vllm" in res.output
    res = runner.invoke(app, ["search", "--model", "demo:smollm2-135m", "--gpus", "2", "--out", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("Error:") == 1 and "only engine vllm" in res.output
    assert load_recipe(None, {"engine": "vllm", "gpus": 4}).gpus == 4
    assert load_recipe(None, {"engine": "builtin", "gpus": 1}).gpus == 1
    # workers get one GPU each: an engine over two cannot be theirs
    res = runner.invoke(app, ["search", "--model", "demo:smollm2-135m", "--engine", "vllm", "--gpus", "2",
                              "--workers", "2", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 2 and res.output.count("Error:") == 1 and "--workers 2 with gpus 2" in res.output
    assert not (tmp_path / "runs").exists()


def test_a_run_served_over_several_gpus_keeps_them_in_its_study_key():
    from advisor.recipe.schema import load_recipe
    from advisor.search.study import study_key

    assert study_key(load_recipe(None, {"engine": "vllm", "gpus": 4}), {})["gpus"] == 4
    assert "gpus" not in study_key(load_recipe(None, {"engine": "vllm"}), {})  # studies made before keep their key


def test_measure_over_more_gpus_than_visible_is_one_error_exit_3(tmp_path, monkeypatch):
    from conftest import TINY_MODEL, need
    from typer.testing import CliRunner

    from advisor.cli import app
    from advisor.cli.energy import shape_from_model
    from advisor.formats import Format
    from advisor.plan import Plan

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm())
    monkeypatch.setattr("advisor.cli.energy.gpu_here", lambda: (None, "Fake GPU"))
    monkeypatch.setattr("advisor.deploy.serving_gpus.visible_gpus", lambda: (2, 80 * GIB))
    model = need(TINY_MODEL)
    plan = tmp_path / "plan.json"
    plan.write_text(Plan.uniform(shape_from_model(str(model)).groups, Format.FP8).to_json())
    ck = checkpoint(tmp_path / "ck")
    res = CliRunner().invoke(app, ["measure", "--plan", str(plan), "--model", str(model), "--engine", "vllm",
                                   "--checkpoint", str(ck), "--gpus", "8"])
    assert res.exit_code == 3 and res.output.count("Error:") == 1, res.output  # 8 divides its 8 heads: 2 are here
    assert "--gpus 8: torch sees 2 GPU(s) here" in res.output


# ---------------------------------------------------------------------------------- the prediction for N GPUs
def _llama_70b():
    from advisor.models.shape import llama_shape

    return llama_shape("model.layers", 80, 8192, 28672, 64, 8, 128256)


def test_a_shard_holds_a_quarter_of_every_gemm_the_heads_and_the_kv_cache():
    from advisor.energy.prediction import shard_shape

    full = _llama_70b()
    part = shard_shape(full, 4)
    by_name = {g.name: g.shapes for g in part.groups}
    assert by_name["layers.0.qkv"] == ((8192, 2048), (8192, 256), (8192, 256))  # column parallel: outputs / 4
    assert by_name["layers.0.gate_up"] == ((8192, 7168), (8192, 7168))
    assert by_name["layers.0.o"] == ((2048, 8192),) and by_name["layers.0.down"] == ((7168, 8192),)  # inputs / 4
    assert part.quantizable_weights * 4 == full.quantizable_weights
    assert part.kv_bytes(768) * 4 == full.kv_bytes(768) and part.layers[0].heads == 16
    assert part.lm_head_weights * 4 == full.lm_head_weights
    assert shard_shape(full, 1) is full
    # 16 GPUs, 8 KV heads: each GPU keeps one KV head (vLLM replicates them)
    assert {g.name: g.shapes for g in shard_shape(full, 16).groups}["layers.0.qkv"][1] == (8192, 128)


def test_a_model_that_does_not_split_is_refused():
    from advisor.energy.prediction import shard_shape
    from advisor.errors import InputError

    with pytest.raises(InputError, match="does not split evenly over 3 GPUs"):
        shard_shape(_llama_70b(), 3)


def test_one_gpu_is_todays_prediction_exactly():
    from advisor.energy.prediction import TensorParallelEnergyModel, make_predicted_model, predicted_for_gpus
    from advisor.formats import GPU, Format
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload

    shape = _llama_70b()
    today = make_predicted_model(shape, GPU.H100)
    w = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    for fmt in (Format.BF16, Format.FP8):
        plan = Plan.uniform(shape.groups, fmt)
        assert predicted_for_gpus(shape, GPU.H100, 1).estimate(plan, w) == today.estimate(plan, w)
        assert TensorParallelEnergyModel(today, 1, 8192, 80).estimate(plan, w) == today.estimate(plan, w)


def test_four_gpus_price_the_sharded_gemms_times_four_plus_the_allreduces():
    from advisor.energy.prediction import ALLREDUCE, make_predicted_model, predicted_for_gpus, shard_shape
    from advisor.formats import GPU, Format
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload

    shape = _llama_70b()
    tp = predicted_for_gpus(shape, GPU.H100, 4)
    one_gpu = make_predicted_model(shard_shape(shape, 4), GPU.H100, per_model=False)
    gemm_model = tp.per_gpu.primary  # the GPU profile's GEMM tables
    assert ("layers.0.qkv", "qkv", 2560, 8192) in gemm_model.geo.groups  # the shard's (N, K), not the model's
    assert ("layers.0.down", "down", 8192, 7168) in gemm_model.geo.groups
    plan = Plan.uniform(shape.groups, Format.FP8)
    for batch in (16, 64):
        ms, j = tp.decode_step(plan, batch, 640)
        ms1, j1 = one_gpu.decode_step(plan, batch, 640)
        calls, nbytes = 2 * 80, batch * 8192 * 2
        assert ms == pytest.approx(ms1 + calls * ALLREDUCE.time_s(nbytes, 4) * 1e3, rel=1e-12)
        assert j == pytest.approx(4 * j1 + calls * ALLREDUCE.energy_j(nbytes, 4), rel=1e-12)
    # a shard's step is shorter than the whole model's on one GPU (a quarter of the weights to read)
    whole = make_predicted_model(shape, GPU.H100, per_model=False)
    assert one_gpu.decode_step(plan, 64, 640)[0] < 0.5 * whole.decode_step(plan, 64, 640)[0]
    w = Workload(name="chat", batch_size=64, input_tokens=512, output_tokens=256)
    est = tp.estimate(plan, w)
    assert not est.measured and est.source.startswith("predicted for 4 GPUs (tensor parallel, tp=4")
    assert "assumed, not measured" in est.source and "GEMM shapes outside the table scaled" in est.source
    step_ms, step_j = tp.decode_step(plan, 64, 512 + 128)
    assert est.decode_j_per_token == pytest.approx(step_j / 64) and est.decode_tokens_per_s == pytest.approx(
        64 / (step_ms / 1e3))


# ---------------------------------------------------------------------------------- the device script, dry
def _collector():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "large_models_multi_gpu.py"
    spec = importlib.util.spec_from_file_location("large_models_multi_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_scripts_python_parts_run_dry_on_a_tiny_shape(tmp_path, monkeypatch):
    mg = _collector()
    monkeypatch.setitem(sys.modules, "vllm", None)  # restored afterwards; the dry run installs the fake
    with pytest.raises(SystemExit):
        mg.main(["serve", "--gpus", "four"])  # argparse: one line, exit 2
    out = tmp_path / "out"
    assert mg.main(["all", "--dry-run", "--gpus", "2", "--trials", "3", "--work", str(tmp_path / "w"),
                    "--out", str(out)]) == 0
    data = json.loads((out / "large_models_multi_gpu.json").read_text())
    assert {"gpu", "gpu_count", "driver", "date", "command"} <= set(data)
    assert data["plan"]["rc"] == 0 and data["plan"]["fits"] and len(data["plan"]["used_gib_per_gpu"]) == 2
    assert data["search"]["rc"] == 0 and data["search"]["stages_s"]["trials_s"] > 0 and data["search"]["trials"] == 3
    assert data["export"]["all-fp8"]["rc"] == 0
    rows = data["serve"]
    assert [(r["plan"], r["batch"]) for r in rows] == [("all-bf16", 16), ("all-bf16", 64), ("all-fp8", 16),
                                                        ("all-fp8", 64)]
    for r in rows:
        assert r["gpus"] == 2 and r["batch_full"] and r["vllm_j_per_token"] > 0
        assert r["predicted_source"].startswith("predicted for 2 GPUs") and "assumed, not measured" in r[
            "predicted_source"]
        # the J/token miss is the power miss over the tokens/s miss
        assert 1 + r["j_miss_pct"] / 100 == pytest.approx((1 + r["power_miss_pct"] / 100)
                                                          / (1 + r["tokens_per_s_miss_pct"] / 100))
    assert {m for r in rows if r["plan"] == "all-fp8" for m in r["served_methods"]} >= {"ModelOptFp8LinearMethod"}
    md = (out / "large_models_multi_gpu.md").read_text()
    assert "## Served by vLLM with tensor parallelism" in md and "| all-fp8 | 64 | 2 |" in md
