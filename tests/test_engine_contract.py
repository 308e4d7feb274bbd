"""The engine contract (advisor.search.measured._contract, checked by advisor/testing_engines.py) over every engine of
advisor.engines' table, each on its fake: the built-in runtime with its GPU steps given, TensorRT-LLM's fake module
on a simulated GPU, vLLM's fake module served in-process. And a third engine, a toy added as one entry of the table,
passes the same suite and is chosen as the others are."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

import pytest

from advisor.deploy.engines import measured_tier
from advisor.engines import ENGINE_TABLE, Engine, engine_names, import_engine
from advisor.errors import InputError
from advisor.estimate import EnergyEstimate
from advisor.formats import FORMAT_SPECS, GPU, Format
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe import validate_recipe
from advisor.recipe.schema import Workload
from advisor.search.measured import MeasuredTier
from advisor.testing_engines import GROUPS, MeasuredTierContract, check_entry

SHAPE = ModelShape(GROUPS, 1, 64, 4, 4, 16, 64, 4096)


def builtin_tier(monkeypatch, tmp_path, workload) -> MeasuredTier:
    """The built-in runtime with its GPU parts stubbed: its decode step and prefill measured as a step model gives
    them (decode 1 + 0.02 b ms at 400 W, FP8 half as long; prefill 2 ms, 0.8 J), 80 GiB free."""
    import torch

    from advisor.energy.measure import MeasuredEnergyModel

    class SteppedRuntime(MeasuredEnergyModel):
        def __init__(self) -> None:  # no GPU: the steps are given
            self.shape, self.label = SHAPE, "measured (Fake GPU, driver 0, 2026-11-30; llama)"
            self.gpu_uuid, self.gpu_name = "GPU-fake-builtin", "Fake GPU"

        def measure_steps(self, plan: Plan, workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
            ms = (1.0 + 0.02 * workload.batch_size) / (2 if Format.FP8 in plan.formats.values() else 1)
            decode = {"ms_per_step": ms, "j_per_step": 0.4 * ms, "tokens_per_s": workload.batch_size / ms * 1e3}
            return {"ms_per_step": 2.0, "j_per_step": 0.8}, decode

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 2**30, 80 * 2**30))
    return SteppedRuntime()


def tensorrt_llm_tier(monkeypatch, tmp_path, workload) -> MeasuredTier:
    """TensorRT-LLM's fake LLM API on a simulated GPU (500 W busy), metered by the advisor's meter in virtual time."""
    from advisor.deploy.trtllm_engine import TensorRTLLMEnergyModel
    from advisor.energy.meter import EnergyMeter, MeterConfig
    from advisor.testing import SimulatedGPU, VirtualClock, fake_tensorrt_llm

    clock = VirtualClock()
    gpu = SimulatedGPU(clock, busy_w=500.0, idle_w=80.0)
    trtllm = fake_tensorrt_llm(gpu, prefill_s_per_token=1e-5, decode_s_per_token=2e-3)
    meter = MeterConfig(warmup_s=0.5, min_window_s=5.0, min_ticks=50, repeats=3, idle_s=1.0)

    def make_meter(depth: int) -> EnergyMeter:
        return EnergyMeter(gpu, replace(meter, depth=depth, queued_s=0.0), clock=clock, sleep=clock.sleep)

    return TensorRTLLMEnergyModel(lambda plan: tmp_path / plan.id, make_meter, trtllm=trtllm, vocab_size=256)


def vllm_tier(monkeypatch, tmp_path, workload) -> MeasuredTier:
    """vLLM's fake module (a step grows with the batch), each serving in this process on a 300 W counter."""
    from advisor.deploy.vllm import VllmEnergyModel, serve
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(step_s=0.001, step_s_per_seq=0.0005))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "vocab_size": 64}))
    fast = MeterConfig(warmup_s=0.3, min_window_s=0.2, min_ticks=10, repeats=3, idle_s=0.02, max_cv=0.5)
    return VllmEnergyModel(lambda _plan: checkpoint, [workload], 64, meter=fast,
                           runner=lambda job: serve(job, make_counter=ConstantPowerCounter),
                           rounds_runner=lambda job, more: serve(job, make_counter=ConstantPowerCounter, more=more))


#: each engine of the table on its fake (an engine added to the table adds its fake here)
FAKES = {"builtin": builtin_tier, "tensorrt_llm": tensorrt_llm_tier, "vllm": vllm_tier}


def test_every_engine_of_the_table_has_a_fake_and_a_complete_entry():
    assert set(FAKES) == set(engine_names())
    for entry in ENGINE_TABLE.values():
        check_entry(entry)


class TestEveryEngine(MeasuredTierContract):
    @pytest.fixture(params=sorted(FAKES))
    def tier(self, request, monkeypatch, tmp_path, workload) -> MeasuredTier:
        return FAKES[request.param](monkeypatch, tmp_path, workload)


# ---------------------------------------------------------------- a third engine: one entry, one module


class ToyTier(MeasuredTier):
    """An engine in a dozen lines: J/token from the plan's weight bytes shared over the batch, tokens/s growing with
    the batch; it times nothing and keeps nothing, so the contract's defaults do the rest."""

    def __init__(self) -> None:
        self.label, self.gpu_name = "measured (toy engine, Toy GPU, 2026-11-30)", "Toy GPU"

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        weights = sum(FORMAT_SPECS[f].weight_bytes_per_element for f in plan.formats.values())
        j = 0.5 + weights / workload.batch_size
        return EnergyEstimate(workload.name, j, 0.9 * j, 0.01, 100.0 * workload.batch_size, self.label, True)


def toy_tier(recipe: Any, loaded: Any, tokens: Any) -> ToyTier:
    return ToyTier()


TOY = Engine("toy", "Toy", "a toy engine pricing the plan's weight bytes", None, "", toy_tier, serves_checkpoint=False)


@pytest.fixture
def toy(monkeypatch) -> Engine:
    monkeypatch.setitem(ENGINE_TABLE, TOY.name, TOY)
    return TOY


class TestAThirdEngine(MeasuredTierContract):
    @pytest.fixture
    def tier(self, toy, tmp_path) -> MeasuredTier:
        recipe = validate_recipe({"name": "toy", "out": str(tmp_path), "engine": toy.name, "energy": "measured"})
        build = measured_tier(recipe.engine)
        assert build is toy_tier
        return build(recipe, None, None)


def test_a_third_engine_is_chosen_as_the_others_are(toy, tmp_path):
    """Its entry is all the recipe, the study key, preflight's import, the energy tiers and the commands' checks
    read; what it does not declare (serving over several GPUs, `advisor verify`) is refused by name."""
    from advisor.energy.prediction import make_energy_tiers
    from advisor.search.study import study_key

    check_entry(toy)
    recipe = validate_recipe({"name": "toy", "out": str(tmp_path), "engine": "toy", "energy": "measured",
                              "target": "h100"})
    assert "toy" in engine_names() and study_key(recipe, {})["engine"] == "toy" and import_engine("toy") is None
    predicted, measured = make_energy_tiers(recipe.energy, SHAPE, GPU.H100,
                                            measured_engine=lambda: toy.tier(recipe, None, None))
    assert isinstance(measured, ToyTier) and not predicted.measured
    with pytest.raises(InputError, match="gpus 2 .* which only engine vllm does"):
        validate_recipe({"name": "toy", "out": str(tmp_path), "engine": "toy", "energy": "measured", "gpus": 2})
    with pytest.raises(InputError, match="engine: got 'toy2'; allowed: builtin, tensorrt_llm, vllm, toy"):
        validate_recipe({"name": "toy", "out": str(tmp_path), "engine": "toy2"})


def test_without_its_entry_the_engine_does_not_exist(tmp_path):
    with pytest.raises(InputError, match="engine: got 'toy'; allowed: builtin, tensorrt_llm, vllm"):
        validate_recipe({"name": "toy", "out": str(tmp_path), "engine": "toy"})
