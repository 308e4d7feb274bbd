"""--engine tensorrt_llm: the measured tier through TensorRT-LLM's LLM API, against a fake module shaped
like it (no GPU, no TensorRT-LLM here), with the advisor's own meter on a simulated GPU."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from advisor.deploy.trtllm_engine import NOT_VERIFIED, TensorRTLLMEnergyModel, import_tensorrt_llm
from advisor.energy.meter import EnergyMeter, MeterConfig
from advisor.errors import SetupError
from advisor.formats import Format
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.testing import SimulatedGPU, VirtualClock, fake_tensorrt_llm

FAST = MeterConfig(warmup_s=0.5, min_window_s=5.0, min_ticks=50, repeats=3, idle_s=1.0)
GROUPS = [f"layers.{i}.{k}" for i in range(2) for k in ("qkv", "o", "gate_up", "down")]
WORKLOAD = Workload(name="chat", batch_size=4, input_tokens=64, output_tokens=32)


@pytest.fixture
def engine(tmp_path, monkeypatch):
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, busy_w=500.0, idle_w=80.0)
    trtllm = fake_tensorrt_llm(gpu, prefill_s_per_token=1e-5, decode_s_per_token=2e-3)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trtllm)  # the package as the engine imports it
    exported: list[str] = []

    def checkpoint_for(plan: Plan):
        exported.append(plan.id)
        return tmp_path / plan.id

    def make_meter(depth: int) -> EnergyMeter:
        return EnergyMeter(gpu, replace(FAST, depth=depth, queued_s=0.0), clock=clock, sleep=clock.sleep)

    return TensorRTLLMEnergyModel(checkpoint_for, make_meter, vocab_size=256), trtllm, exported, tmp_path


def test_requests_of_the_workload_are_metered_in_steady_state(engine):
    model, trtllm, exported, tmp_path = engine
    plan = Plan.uniform(GROUPS, Format.FP8, Format.FP8)
    est = model.estimate(plan, WORKLOAD)
    request_s, prefill_s = 64e-5 + 32 * 2e-3, 64e-5 + 2e-3  # the fake's request and prefill-only durations
    assert est.j_per_token == pytest.approx(500.0 * request_s / 32, rel=0.01)
    # one prefill at a time: the host's gap between two requests idles the GPU a little (80 W)
    assert 500.0 * prefill_s / 64 < est.prefill_j_per_input_token < 1.1 * 500.0 * prefill_s / 64
    assert est.decode_j_per_token == pytest.approx(500.0 * (request_s - prefill_s) / 32, rel=0.02)
    assert est.decode_tokens_per_s == pytest.approx(32 / request_s, rel=0.01)
    assert est.measured and NOT_VERIFIED in est.source and "TensorRT-LLM 0.0-fake" in est.source
    (llm,) = trtllm.instances
    assert exported == [plan.id] and llm.model == str(tmp_path / plan.id) and llm.closed
    assert llm.kwargs["max_batch_size"] == 4 and llm.kwargs["max_seq_len"] == 96
    assert llm.kwargs["kv_cache_config"].dtype == "fp8" and llm.kwargs["kv_cache_config"].enable_block_reuse is False
    full = [(p, s) for p, s in llm.requests if s.max_tokens == 32]
    assert full and all(len(p) == 64 and s.ignore_eos for p, s in full)
    assert len({tuple(p) for p, _ in llm.requests}) == len(llm.requests)  # no prompt is reused


def test_bf16_kv_plan_leaves_the_kv_dtype_to_the_checkpoint(engine):
    model, trtllm, _, _ = engine
    model.estimate(Plan.uniform(GROUPS, Format.FP8), WORKLOAD)
    assert not hasattr(trtllm.instances[0].kwargs["kv_cache_config"], "dtype")


def test_the_meter_keeps_the_workloads_concurrency_in_flight(engine):
    model, trtllm, _, _ = engine
    depths = []
    make = model.make_meter
    model.make_meter = lambda d: (depths.append(d), make(d))[1]
    model.estimate(Plan.uniform(GROUPS, Format.BF16), WORKLOAD)
    assert depths == [4, 1]  # the workload's batch for requests, one at a time for prefill


def test_missing_package_is_a_setup_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails
    with pytest.raises(SetupError, match="--engine tensorrt_llm: tensorrt_llm is not importable"):
        import_tensorrt_llm()


def test_search_run_exports_each_measured_plan_once_and_serves_that_checkpoint(tmp_path, monkeypatch):
    """The wiring of a run: the plan is exported with `advisor export`'s code into the run directory,
    the fake engine is handed that folder, and a second estimate reuses the export."""
    import json

    import torch
    from conftest import TINY_MODEL, need

    import advisor.energy.meter as meter_mod
    from advisor.calibration.tokens import build_token_sets
    from advisor.deploy.trtllm_engine import tensorrt_llm_tier
    from advisor.models.loading import load_model
    from advisor.recipe.schema import validate_recipe

    clock = VirtualClock()
    gpu = SimulatedGPU(clock)
    trtllm = fake_tensorrt_llm(gpu, decode_s_per_token=1e-4)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trtllm)
    monkeypatch.setattr(meter_mod, "open_meter", lambda index, config: EnergyMeter(
        gpu, replace(FAST, depth=config.depth, queued_s=config.queued_s), clock=clock, sleep=clock.sleep))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    recipe = validate_recipe({"name": "e", "model": {"source": str(need(TINY_MODEL))}, "out": str(tmp_path),
                              "target": "h100", "energy": "measured", "engine": "tensorrt_llm",
                              "kv_cache": ["bf16", "fp8"], "workloads": [WORKLOAD.model_dump()],
                              "calibration": {"num_samples": 2, "seq_len": 16, "heldout_samples": 2,
                                              "heldout_seq_len": 16}})
    loaded = load_model(recipe.model, "cpu")
    tokens = build_token_sets(loaded.model, loaded.tokenizer, recipe.calibration)
    tier = tensorrt_llm_tier(recipe, loaded, tokens)
    plan = Plan.uniform(loaded.shape.groups, Format.FP8, Format.FP8)
    first = tier.estimate(plan, WORKLOAD)
    ckpt = recipe.run_dir / "engine_checkpoints" / plan.id
    assert trtllm.instances[0].model == str(ckpt)
    assert json.loads((ckpt / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    stamp = (ckpt / "export.json").stat().st_mtime_ns
    again = tier.estimate(plan, WORKLOAD)
    assert (ckpt / "export.json").stat().st_mtime_ns == stamp and len(trtllm.instances) == 2
    assert first.j_per_token == pytest.approx(again.j_per_token, rel=0.02) and NOT_VERIFIED in first.source


def test_a_checkpoint_the_engine_cannot_load_stays_predicted_with_the_reason(engine):
    from advisor.errors import UnsupportedError

    model, trtllm, _, _ = engine

    def refuse(model, **kwargs):
        raise ValueError("quant_algo MIXED_PRECISION is ambiguous\nmore lines")

    trtllm.LLM = refuse
    with pytest.raises(UnsupportedError, match="could not load plan .*ValueError: quant_algo MIXED_PRECISION is"):
        model.estimate(Plan.uniform(GROUPS, Format.FP8), WORKLOAD)
