"""vLLM over several GPUs of a node (tensor parallelism): the summed meter, the engine's option, the GPU count
where serving is chosen, and the prediction for N GPUs; on CPU against the fake ``vllm`` module and fake counters."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from advisor.deploy.vllm_serve import ServeJob, serve
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
